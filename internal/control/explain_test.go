package control

import (
	"strings"
	"testing"

	"github.com/fleetwatch/fleetwatch"
)

// TestExplainTextShadow: `fleetwatch explain` says when a decision is
// advisory, and says nothing of shadow mode otherwise.
func TestExplainTextShadow(t *testing.T) {
	for _, mode := range []fleetwatch.Shadow{fleetwatch.ShadowOff, fleetwatch.ShadowBreakers} {
		var e ExplainedBackend
		e.Pool, e.Backend, e.State, e.Verdict, e.Shadow = "p", "b0", fleetwatch.StateOpen, fleetwatch.StateOpen, mode
		var b strings.Builder
		if err := WriteExplained(&b, Explained{Pool: "p", Backends: []ExplainedBackend{e}}); err != nil {
			t.Fatal(err)
		}
		has := strings.Contains(b.String(), "  shadow:  the pool is in shadow mode breakers: this decision is advisory")
		if has != mode.On() || strings.Contains(b.String(), "shadow:") != mode.On() {
			t.Errorf("mode %q: explanation:\n%s", mode, b.String())
		}
	}
}
