package control

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

func TestWriteOverrides(t *testing.T) {
	until := fleetwatch.At(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	w := 0.25
	drain := BackendOverride{Pool: "chat", Backend: "b1", Override: fleetwatch.Override{Kind: fleetwatch.OverrideDrain, Reason: "rack move", Who: "dana", Until: until}}
	weight := BackendOverride{Pool: "chat", Backend: "b2", Override: fleetwatch.Override{Kind: fleetwatch.OverrideWeight, Reason: "canary", Who: "eve", Until: until, Weight: &w}}
	for _, c := range []struct {
		name string
		in   []BackendOverride
		want string
	}{
		{"none", nil, "no override in force\n"},
		{"two", []BackendOverride{drain, weight}, "chat / b1: drain until 2026-03-01T12:00:00Z by dana: rack move\n" +
			"chat / b2: weight 0.25 until 2026-03-01T12:00:00Z by eve: canary\n"},
	} {
		var b strings.Builder
		if err := WriteOverrides(&b, c.in); err != nil || b.String() != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, b.String(), err, c.want)
		}
	}
	for _, c := range []struct {
		action string
		want   string
	}{
		{ActionDrain, "drain chat / b1 until 2026-03-01T12:00:00Z\n"},
		{ActionClear, "cleared drain on chat / b1\n"},
	} {
		var b strings.Builder
		if err := WriteOverrideDone(&b, c.action, &drain); err != nil || b.String() != c.want {
			t.Errorf("%s: %q, %v; want %q", c.action, b.String(), err, c.want)
		}
	}
}
