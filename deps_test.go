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
	"feed/feedtest": {".", "feed"},
	"probes":        {"."},
	"dashboards":    {},
	// The one mapping from the YAML file to every component's Settings,
	// the leaf adapters' included (they do not import it back).
	"internal/config": {".", "analyzer", "collector", "feed", "feed/p2c", "feed/route", "probes",
		"internal/alert", "internal/haproxyctl", "internal/ingest", "internal/natsrv"},
	// The operator side: request and reply types, the JetStream stores, the
	// CLI's clients and text views.
	"internal/control": {".", "probes"},
	// `fleetwatch route` as a value: the one assembly of the router.
	"internal/router": {".", "feed", "feed/p2c", "feed/route", "internal/config"},
	// Helpers shared by tests; imported only from _test.go files.
	"internal/testkit": {".", "internal/fakeai"},
}

// leafAdapters are the adapters internal/config maps the file to; they
// take their Settings and never import the config back (no cycle).
var leafAdapters = []string{"internal/alert", "internal/haproxyctl", "internal/ingest", "internal/natsrv"}

// testOnly are packages that only tests may import.
var testOnly = []string{"internal/testkit", "feed/feedtest"}

// stdlibOnly are the packages that must not import anything outside the
// standard library and the project: the shared vocabulary and the pure
// decision logic, which run unchanged in the simulator and in routers.
var stdlibOnly = []string{".", "analyzer", "feed/p2c"}

// natsServerOK may import nats-server (feedtest is the documented exception:
// a test helper that embeds a server).
func natsServerOK(pkg string) bool {
	return pkg == "cmd/fleetwatch" || pkg == "internal" || strings.HasPrefix(pkg, "internal/") || pkg == "feed/feedtest"
}

func TestPackageDependencies(t *testing.T) {
	imports := map[string]map[string]bool{} // package dir -> import paths (non-test files)
	testImports := map[string]map[string]bool{}
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
		{"internal/sim", module + "/cmd/fleetwatch"},
		{"internal/serve", module + "/internal/testkit"},
		{"internal/config", module + "/internal/serve"},
		{"internal/ingest", module + "/internal/config"},
	}
	for _, c := range cases {
		ft := &fakeT{}
		checkImport(ft, c.pkg, c.imp)
		if !ft.failed {
			t.Errorf("%s importing %s was not flagged", c.pkg, path.Clean(c.imp))
		}
	}
}
