package fleetwatch_test

import (
	"os"
	"strings"
	"testing"
)

// TestProtocolDocIsSuperset keeps docs/PROTOCOL.md a superset of the shared
// contract: the shared page must appear in it verbatim.
func TestProtocolDocIsSuperset(t *testing.T) {
	shared, err := os.ReadFile("../shared/PROTOCOL.md")
	if err != nil {
		t.Skipf("the shared contract is not beside the project: %v", err)
	}
	ours, err := os.ReadFile("docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ours), string(shared)) {
		t.Error("docs/PROTOCOL.md does not contain ../shared/PROTOCOL.md verbatim; keep the contract and add below it")
	}
}
