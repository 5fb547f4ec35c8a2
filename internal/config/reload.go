package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Reloading (docs/CONFIG.md "Reloading"): serve reads its file again on
// SIGHUP or POST /-/reload, compares it with the running configuration
// key by key (Compare), and refuses the whole file when a key that only a
// restart can apply changed (RestartKeys): the running configuration is
// kept, as nginx keeps its old configuration when the new one is bad.

// Change is one key by which a new configuration differs from the running
// one.
type Change struct {
	// Key is the dotted path of the key in the new file
	// ("pools[1].analyzer.failure_rate"), or in the running one for a
	// removed pool or backend. Pools and backends are matched by id, not
	// by position.
	Key string `json:"key"`
	// Op is "changed", "added" or "removed".
	Op string `json:"op"`
	// Line is the key's line in the new file; 0 when unknown or removed.
	Line int `json:"line,omitempty"`
	// ID names the pool or backend ("pool" or "pool/backend") of an added
	// or removed one.
	ID string `json:"id,omitempty"`
}

// The operations of a Change.
const (
	OpChanged = "changed"
	OpAdded   = "added"
	OpRemoved = "removed"
)

func (c Change) String() string {
	s := c.Key
	if c.ID != "" {
		s += " (" + c.ID + ")"
	}
	s += " " + c.Op
	if c.Line > 0 {
		s += fmt.Sprintf(" (line %d)", c.Line)
	}
	return s
}

// RestartKeys are the top-level keys whose change only a restart applies:
// where NATS is and what serve creates in it (the prefix, the embedded
// server, the HA partitions and replicas, the durable intake), the HTTP
// listener and its authentication, the data directory, the ingest
// adapters and the alert receivers.
var RestartKeys = []string{"prefix", "data", "nats", "http", "ha", "ingest", "alerts"}

// needsRestart reports whether key is under one of RestartKeys.
func needsRestart(key string) bool {
	for _, k := range RestartKeys {
		if key == k || strings.HasPrefix(key, k+".") || strings.HasPrefix(key, k+"[") {
			return true
		}
	}
	return false
}

// ErrNeedsRestart is wrapped by the error of a reload that changes a key
// only a restart applies.
var ErrNeedsRestart = errors.New("config: needs a restart")

// RestartError is a reload refused because keys that only a restart
// applies changed; it wraps ErrNeedsRestart. The running configuration is
// kept as a whole.
type RestartError struct {
	File    string
	Changes []Change
}

func (e *RestartError) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	b.WriteString(": ")
	for i, c := range e.Changes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c.Key)
		if c.Line > 0 {
			fmt.Fprintf(&b, " (line %d)", c.Line)
		}
	}
	b.WriteString(": cannot change without a restart; the running configuration is kept (restore these keys, or restart)")
	return b.String()
}

// Unwrap returns ErrNeedsRestart.
func (e *RestartError) Unwrap() error { return ErrNeedsRestart }

// ParseReload parses data (the contents of file) as Parse does, applies
// adjust (the command line's overrides; may be nil) and validates the
// result, then compares it with the running configuration prev. It
// returns the new configuration and its changes, each with its line in
// data; or a *Error (naming the key and line) when the file is invalid,
// or a *RestartError when it changes a key under RestartKeys.
func ParseReload(prev *Config, data []byte, file string, adjust func(*Config) error) (*Config, []Change, error) {
	next, err := Parse(data, file)
	if err != nil {
		return nil, nil, err
	}
	if adjust != nil {
		if err := adjust(next); err != nil {
			return nil, nil, err
		}
	}
	changes := Compare(prev, next)
	var root yaml.Node
	if yaml.Unmarshal(data, &root) == nil {
		lines := keyLines(&root)
		for i := range changes {
			if changes[i].Op != OpRemoved {
				changes[i].Line = lineOf(lines, changes[i].Key)
			}
		}
	}
	var restart []Change
	for _, c := range changes {
		if needsRestart(c.Key) {
			restart = append(restart, c)
		}
	}
	if len(restart) > 0 {
		return nil, nil, &RestartError{File: file, Changes: restart}
	}
	return next, changes, nil
}

// lineOf is the line of key, or of its nearest parent in the file.
func lineOf(lines map[string]int, key string) int {
	for k := key; k != ""; k = parentKey(k) {
		if l, ok := lines[k]; ok {
			return l
		}
	}
	return 0
}

// Compare returns the keys by which next differs from prev, in the order
// of the file's fields. Pools and backends are matched by id: one added or
// removed is one Change, and the keys of one that stays are compared one
// by one.
func Compare(prev, next *Config) []Change {
	var out []Change
	compareValues("", reflect.ValueOf(prev).Elem(), reflect.ValueOf(next).Elem(), "", &out)
	return out
}

var durationType = reflect.TypeFor[Duration]()

// compareValues appends to out the changes between a and b (of the same
// type) at path; owner is the "pool" or "pool/backend" the path is in.
func compareValues(path string, a, b reflect.Value, owner string, out *[]Change) {
	changed := func() { *out = append(*out, Change{Key: path, Op: OpChanged}) }
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				changed()
			}
			return
		}
		compareValues(path, a.Elem(), b.Elem(), owner, out)
	case reflect.Struct:
		if a.Type() == durationType {
			if !a.Equal(b) {
				changed()
			}
			return
		}
		for i := range a.NumField() {
			name := yamlName(a.Type().Field(i))
			if name == "" {
				continue
			}
			key := name
			if path != "" {
				key = path + "." + name
			}
			compareValues(key, a.Field(i), b.Field(i), owner, out)
		}
	case reflect.Slice:
		if et := a.Type().Elem(); et.Kind() == reflect.Struct && hasID(et) {
			compareByID(path, a, b, owner, out)
			return
		}
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			changed()
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			changed()
		}
	}
}

// hasID reports whether a struct type has a string ID field.
func hasID(t reflect.Type) bool {
	f, ok := t.FieldByName("ID")
	return ok && f.Type.Kind() == reflect.String
}

// compareByID compares two lists of pools or backends matched by their ID.
func compareByID(path string, a, b reflect.Value, owner string, out *[]Change) {
	id := func(v reflect.Value) string { return v.FieldByName("ID").String() }
	qualified := func(s string) string {
		if owner == "" {
			return s
		}
		return owner + "/" + s
	}
	old := make(map[string]int, a.Len())
	for i := range a.Len() {
		old[id(a.Index(i))] = i
	}
	seen := make(map[string]bool, b.Len())
	for i := range b.Len() {
		nv := b.Index(i)
		key := fmt.Sprintf("%s[%d]", path, i)
		seen[id(nv)] = true
		j, ok := old[id(nv)]
		if !ok {
			*out = append(*out, Change{Key: key, Op: OpAdded, ID: qualified(id(nv))})
			continue
		}
		compareValues(key, a.Index(j), nv, qualified(id(nv)), out)
	}
	for i := range a.Len() {
		if !seen[id(a.Index(i))] {
			*out = append(*out, Change{Key: fmt.Sprintf("%s[%d]", path, i), Op: OpRemoved, ID: qualified(id(a.Index(i)))})
		}
	}
}

// yamlName is a field's YAML key ("" when it has none).
func yamlName(f reflect.StructField) string {
	tag := f.Tag.Get("yaml")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}
