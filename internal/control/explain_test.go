package control

import (
	"strings"
	"testing"
	"time"

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

// TestExplainTextQuota: a backend out of quota is explained as such, with
// its reset, not as a trip.
func TestExplainTextQuota(t *testing.T) {
	until := fleetwatch.At(time.Date(2026, 12, 9, 12, 0, 0, 0, time.UTC))
	var e ExplainedBackend
	e.Pool, e.Backend, e.State, e.Verdict = "p", "b0", fleetwatch.StateOpen, fleetwatch.StateOpen
	e.OpenUntil, e.QuotaUntil = until, until
	var b strings.Builder
	if err := WriteExplained(&b, Explained{Pool: "p", Backends: []ExplainedBackend{e}}); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "out of quota until 2026-12-09T12:00:00.000Z") || strings.Contains(out, "(trip") {
		t.Errorf("explanation:\n%s", out)
	}
}
