package fleetwatch

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testNameInDoc is a test named in a doc: TestName, or TestName* for every
// test whose name starts so.
var testNameInDoc = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*\*?`)

// TestDocsNameTestsThatExist: every test the README, BENCHMARKS.md and
// docs/*.md name (as the check of a claim: "TestX asserts ...") is a test
// function of the module, so that a renamed or deleted test cannot leave a
// claim that nothing checks (METRICS.md named two that did not exist).
func TestDocsNameTestsThatExist(t *testing.T) {
	declared := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			declared[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !declared["TestDocsNameTestsThatExist"] {
		t.Fatalf("found %d test functions, not this one: the walk is broken", len(declared))
	}
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append([]string{"README.md", "BENCHMARKS.md"}, docs...) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range testNameInDoc.FindAllString(string(text), -1) {
			if prefix, glob := strings.CutSuffix(name, "*"); glob {
				if !anyWithPrefix(declared, prefix) {
					t.Errorf("%s names %s: no test starts with %s", doc, name, prefix)
				}
				continue
			}
			if !declared[name] {
				t.Errorf("%s names %s: no such test function in the module", doc, name)
			}
		}
	}
}

func anyWithPrefix(names map[string]bool, prefix string) bool {
	for n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
