package demo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteToolSuiteCreatesTheDataDirectory: demo --data of a directory
// that does not exist yet failed before anything started ("open
// .../tools-v1-demo.json: no such file or directory").
func TestWriteToolSuiteCreatesTheDataDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "data")
	suite, err := writeToolSuite(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tools-v1-demo.json")
	if !strings.HasSuffix(suite, "+"+path) {
		t.Errorf("suite = %q, want it to name %s", suite, path)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the suite file: %v", err)
	}
}
