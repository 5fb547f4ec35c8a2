package serve

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/control"
)

// TestExplainViewMatchesTheAnswer: `fleetwatch explain` reads serve's
// /api/explain answer into its own view (control.Explained: internal/control
// may not import the analyzer, whose Explanation the answer embeds). Every
// field of the view must have a field of the same JSON name and kind in the
// answer, or the CLI would print a zero where serve renamed or dropped a
// field. cmd's TestExplainCommand runs the whole path against a real serve.
func TestExplainViewMatchesTheAnswer(t *testing.T) {
	for _, p := range jsonShapeProblems(reflect.TypeFor[control.Explained](), reflect.TypeFor[Explained](), "explained") {
		t.Error(p)
	}
	// The check itself finds a renamed field and a changed kind.
	type badRule struct {
		Value string `json:"value"`
	}
	type badBackend struct {
		Renamed string    `json:"no_such_field"`
		Rules   []badRule `json:"rules"`
	}
	type badView struct {
		Backends []badBackend `json:"backends"`
	}
	got := strings.Join(jsonShapeProblems(reflect.TypeFor[badView](), reflect.TypeFor[Explained](), "explained"), "\n")
	for _, want := range []string{"explained.backends[].no_such_field", "explained.backends[].rules[].value"} {
		if !strings.Contains(got, want) {
			t.Errorf("the shape check missed %s; it said:\n%s", want, got)
		}
	}
}

// jsonShapeProblems lists the fields of view (by JSON name, recursively)
// that answer lacks or holds as another kind.
func jsonShapeProblems(view, answer reflect.Type, path string) []string {
	for view.Kind() == reflect.Pointer {
		view = view.Elem()
	}
	for answer.Kind() == reflect.Pointer {
		answer = answer.Elem()
	}
	if view == answer {
		return nil
	}
	if view.Kind() != answer.Kind() {
		return []string{path + ": the view reads a " + view.String() + ", serve answers a " + answer.String()}
	}
	var out []string
	switch view.Kind() {
	case reflect.Struct:
		have := jsonFields(answer)
		for name, vt := range jsonFields(view) {
			at, ok := have[name]
			if !ok {
				out = append(out, path+"."+name+": the view reads it, serve's answer has no such field")
				continue
			}
			out = append(out, jsonShapeProblems(vt, at, path+"."+name)...)
		}
	case reflect.Slice, reflect.Map:
		out = append(out, jsonShapeProblems(view.Elem(), answer.Elem(), path+"[]")...)
	}
	return out
}

// jsonFields maps a struct's JSON field names to their types, with the
// fields of embedded structs promoted as encoding/json does.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
