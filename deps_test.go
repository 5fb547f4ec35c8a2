package fleetwatch_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fleetwatch/fleetwatch"

// allowed is the package table of DESIGN.md: for each package (by its path
// relative to the module root), the in-project packages its non-test files
// may import. "internal/..." and "cmd/fleetwatch" may import anything in the
// project except cmd.
var allowed = map[string][]string{
	".":             {},
	"collector":     {"."},
	"analyzer":      {"."},
	"feed":          {".", "feed/p2c"},
	"feed/p2c":      {"."},
	"feed/route":    {".", "feed", "feed/p2c"},
	"feed/epp":      {".", "feed", "feed/p2c", "feed/route"},
	"feed/feedtest": {".", "feed"},
	"probes":        {".", "probes/drift"},
	"probes/drift":  {"."},
	"dashboards":    {},
	// The one mapping from the YAML file to every component's Settings,
	// the leaf adapters' included (they do not import it back).
	"internal/config": {".", "analyzer", "collector", "feed", "feed/p2c", "feed/route", "probes",
		"internal/alert", "internal/haproxyctl", "internal/ingest", "internal/natsrv"},
	// The operator side: request and reply types, the JetStream stores, the
	// CLI's clients and text views.
	"internal/control": {".", "probes", "probes/drift"},
	// Partition leases, fencing, hand-back and takeover between serve
	// instances; its dependencies are interfaces it declares.
	"internal/ha": {"."},
	// `fleetwatch route` as a value: the one assembly of the router.
	"internal/router": {".", "feed", "feed/p2c", "feed/route", "internal/config"},
	// `fleetwatch epp` as a value: the one assembly of the endpoint picker.
	"internal/pickd": {".", "feed", "feed/epp", "feed/p2c", "feed/route", "internal/config"},
	// Helpers shared by tests; imported only from _test.go files.
	"internal/testkit": {".", "internal/fakeai"},
}

// leafAdapters are the adapters internal/config maps the file to; they
// take their Settings and never import the config back (no cycle).
var leafAdapters = []string{"internal/alert", "internal/haproxyctl", "internal/ingest", "internal/natsrv"}

// leafHelpers are the helpers under internal/ that any package may import
// (DESIGN.md: they import nothing of the project, the standard library
// only); the root keeps only the wire vocabulary.
var leafHelpers = []string{"internal/promlabel", "internal/retryhint", "internal/runonce", "internal/shed"}

// testOnly are packages that only tests may import.
var testOnly = []string{"internal/testkit", "feed/feedtest"}

// stdlibOnly are the packages that must not import anything outside the
// standard library and the project: the shared vocabulary and the pure
// decision logic, which run unchanged in the simulator and in routers.
var stdlibOnly = []string{".", "analyzer", "feed/p2c", "probes/drift", "internal/promlabel", "internal/retryhint", "internal/shed"}

// natsServerOK may import nats-server (feedtest is the documented exception:
// a test helper that embeds a server).
func natsServerOK(pkg string) bool {
	return pkg == "cmd/fleetwatch" || pkg == "internal" || strings.HasPrefix(pkg, "internal/") || pkg == "feed/feedtest"
}

func TestPackageDependencies(t *testing.T) {
	imports, testImports := projectImports(t)
	if len(imports) < 5 {
		t.Fatalf("found only %d packages: is the test running at the module root?", len(imports))
	}
	for pkg, imps := range imports {
		for imp := range imps {
			checkImport(t, pkg, imp)
		}
	}
	for pkg, imps := range testImports {
		for imp := range imps {
			if strings.HasPrefix(imp, module+"/cmd") {
				t.Errorf("%s (tests) imports %s: nothing imports cmd", pkg, imp)
			}
		}
	}
	for pkg := range allowed {
		if _, err := os.Stat(pkg); err != nil {
			t.Errorf("package %s of DESIGN.md's table is missing", pkg)
		}
	}
}

// projectImports walks the module from its root and returns, for each
// package directory, the import paths of its non-test files and of its
// test files.
func projectImports(t *testing.T) (imports, testImports map[string]map[string]bool) {
	t.Helper()
	imports, testImports = map[string]map[string]bool{}, map[string]map[string]bool{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "data") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(p))
		into := imports
		if strings.HasSuffix(p, "_test.go") {
			into = testImports
		}
		if into[dir] == nil {
			into[dir] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			into[dir][strings.Trim(imp.Path.Value, `"`)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return imports, testImports
}

// layoutRoles are the roles of docs/DECISIONS.md's Layout table.
var layoutRoles = []string{"library", "daemon", "adapter", "client", "laboratory"}

// layoutRow is one package of the Layout table: its role and the
// packages it may import (any reports "anything but cmd").
type layoutRow struct {
	role  string
	may   []string
	any   bool
	found bool
}

// readLayout parses the Layout table of docs/DECISIONS.md: the table
// whose header is "| package | role | may import |".
func readLayout(t *testing.T) map[string]*layoutRow {
	t.Helper()
	data, err := os.ReadFile("docs/DECISIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]*layoutRow{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "| package | role | may import |"):
			in = true
			continue
		case in && strings.HasPrefix(line, "|---"):
			continue
		case in && !strings.HasPrefix(line, "|"):
			return rows
		case !in:
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 3 {
			t.Fatalf("Layout row %q has %d cells, want 3", line, len(cells))
		}
		pkg := strings.Trim(strings.Fields(cells[0])[0], "`")
		row := &layoutRow{role: cells[1]}
		switch cells[2] {
		case "nothing":
		case "anything but cmd":
			row.any = true
		default:
			for _, m := range strings.Split(cells[2], ", ") {
				if m == "root" {
					m = "."
				}
				row.may = append(row.may, strings.Trim(m, "`"))
			}
		}
		rows[pkg] = row
	}
	if len(rows) == 0 {
		t.Fatal("docs/DECISIONS.md has no Layout table (| package | role | may import |)")
	}
	return rows
}

// TestLayoutTable: docs/DECISIONS.md's Layout table lists every package
// once with a role, every in-project import of a package's non-test files
// is in its row, and the rows of the packages DESIGN.md's table names
// (allowed) say what it says.
func TestLayoutTable(t *testing.T) {
	rows := readLayout(t)
	imports, _ := projectImports(t)
	for pkg, imps := range imports {
		row := rows[pkg]
		if row == nil {
			t.Errorf("package %s is not in docs/DECISIONS.md's Layout table", pkg)
			continue
		}
		row.found = true
		for imp := range imps {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			rel := "."
			if imp != module {
				rel = strings.TrimPrefix(imp, module+"/")
			}
			if !row.any && !slices.Contains(row.may, rel) && !slices.Contains(leafHelpers, rel) {
				t.Errorf("%s imports %s: its Layout row allows only %v", pkg, rel, row.may)
			}
		}
	}
	for pkg, row := range rows {
		if !row.found {
			t.Errorf("the Layout table lists %s, which has no non-test Go files", pkg)
		}
		if !slices.Contains(layoutRoles, row.role) {
			t.Errorf("%s has role %q, not one of %v", pkg, row.role, layoutRoles)
		}
		if want, ok := allowed[pkg]; ok {
			got := slices.Clone(row.may)
			slices.Sort(got)
			want = slices.Clone(want)
			slices.Sort(want)
			if row.any || !slices.Equal(got, want) {
				t.Errorf("the Layout row of %s allows %v (any %v); DESIGN.md's table (allowed) says %v", pkg, row.may, row.any, want)
			}
		}
	}
}

// reporter is the part of testing.T the checker uses, so that a test can
// check the checker.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

type fakeT struct{ failed bool }

func (f *fakeT) Helper()               {}
func (f *fakeT) Errorf(string, ...any) { f.failed = true }

func checkImport(t reporter, pkg, imp string) {
	t.Helper()
	inProject := imp == module || strings.HasPrefix(imp, module+"/")
	stdlib := !strings.Contains(strings.Split(imp, "/")[0], ".")
	switch {
	case inProject:
		rel := "."
		if imp != module {
			rel = strings.TrimPrefix(imp, module+"/")
		}
		if strings.HasPrefix(rel, "cmd") {
			t.Errorf("%s imports %s: nothing imports cmd", pkg, imp)
			return
		}
		if slices.Contains(testOnly, rel) {
			t.Errorf("%s imports %s outside its tests: it is a test helper", pkg, imp)
			return
		}
		if slices.Contains(leafHelpers, pkg) {
			t.Errorf("%s imports %s: a leaf helper imports nothing of the project", pkg, imp)
			return
		}
		if slices.Contains(leafHelpers, rel) {
			return
		}
		if rel == "internal/config" && slices.Contains(leafAdapters, pkg) {
			t.Errorf("%s imports %s: a leaf adapter takes its Settings from the mapping and never imports the config", pkg, imp)
			return
		}
		want, listed := allowed[pkg]
		if !listed {
			if pkg == "cmd/fleetwatch" || strings.HasPrefix(pkg, "internal") {
				return
			}
			t.Errorf("package %s is not in DESIGN.md's table; add it there and to this test", pkg)
			return
		}
		if !slices.Contains(want, rel) {
			t.Errorf("%s imports %s: DESIGN.md allows only %v", pkg, rel, want)
		}
	case stdlib:
	default:
		if slices.Contains(stdlibOnly, pkg) {
			t.Errorf("%s imports %s: it must depend on the standard library only", pkg, imp)
		}
		if strings.HasPrefix(imp, "github.com/nats-io/nats-server") && !natsServerOK(pkg) {
			t.Errorf("%s imports %s: only cmd and internal embed a NATS server", pkg, imp)
		}
		if pkg == "dashboards" {
			t.Errorf("dashboards imports %s: it embeds assets and imports nothing", imp)
		}
	}
}

func TestDepsRuleCatchesViolations(t *testing.T) {
	// The checker must flag a forbidden import.
	cases := []struct{ pkg, imp string }{
		{"analyzer", module + "/collector"},
		{"analyzer", "github.com/nats-io/nats.go"},
		{".", "github.com/google/go-cmp/cmp"},
		{"collector", module + "/feed"},
		{"feed", module + "/probes"},
		{"probes", "github.com/nats-io/nats-server/v2/server"},
		{"probes/drift", module + "/probes"},
		{"probes/drift", "github.com/VictoriaMetrics/metrics"},
		{"internal/sim", module + "/cmd/fleetwatch"},
		{"internal/serve", module + "/internal/testkit"},
		{"internal/config", module + "/internal/serve"},
		{"internal/ingest", module + "/internal/config"},
		{"internal/promlabel", module},
		{"internal/retryhint", "github.com/nats-io/nats.go"},
	}
	for _, c := range cases {
		ft := &fakeT{}
		checkImport(ft, c.pkg, c.imp)
		if !ft.failed {
			t.Errorf("%s importing %s was not flagged", c.pkg, path.Clean(c.imp))
		}
	}
}
