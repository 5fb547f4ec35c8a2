package fleetwatch_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The house keeps its shape (docs/DECISIONS.md "Layout"): no non-test
// function over maxFuncLines lines (from its declaration's first line to
// its last, doc comment excluded) and no non-test file over maxFileLines.
// A rule the code checks, beside deps_test.go's layout.
const (
	maxFuncLines = 100
	maxFileLines = 1000
)

// TestShape walks the module and fails on every function or file over the
// bounds.
func TestShape(t *testing.T) {
	for _, v := range shapeViolations(t, ".") {
		t.Error(v)
	}
}

// TestShapeCatchesLongFunctionsAndFiles runs the check over a generated
// tree with one function and one file over the bounds, and one of each
// just within them.
func TestShapeCatchesLongFunctionsAndFiles(t *testing.T) {
	dir := t.TempDir()
	body := func(name string, lines int) string { // a function of exactly lines lines
		return "func " + name + "() {\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	write := func(name, src string) {
		if err := writeFile(filepath.Join(dir, name), src); err != nil {
			t.Fatal(err)
		}
	}
	write("a.go", "package a\n\n"+body("within", maxFuncLines)+body("over", maxFuncLines+1))
	filler := strings.Repeat("// filler\n", maxFileLines-2)
	write("b.go", "package a\n"+filler)                    // maxFileLines - 1 lines
	write("c.go", "package a\n"+filler+"// one\n// two\n") // maxFileLines + 1 lines
	write("d_test.go", "package a\n\n"+body("testsMayBeLong", 500))
	got := shapeViolations(t, dir)
	if len(got) != 2 || !strings.Contains(got[0]+got[1], "func over") || !strings.Contains(got[0]+got[1], "c.go") {
		t.Errorf("violations %q, want the function over and the file c.go", got)
	}
}

func shapeViolations(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "data") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
			out = append(out, fmt.Sprintf("%s: %d lines, at most %d", p, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n > maxFuncLines {
				out = append(out, fmt.Sprintf("%s: func %s has %d lines, at most %d", p, fn.Name.Name, n, maxFuncLines))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func writeFile(path, src string) error { return os.WriteFile(path, []byte(src), 0o644) }
