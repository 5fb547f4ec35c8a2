package haproxyctl_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
)

// TestTargetsShadow: in shadow mode HAProxy is driven by the decisions the
// mode follows: breakers keeps the open server in maintenance but sets
// every closed one to full weight; observe sets every server ready at full
// weight.
func TestTargetsShadow(t *testing.T) {
	tests := []struct {
		mode fleetwatch.Shadow
		want []haproxyctl.Target
	}{
		{fleetwatch.ShadowOff, []haproxyctl.Target{
			{Backend: "llama", Server: "a", State: "maint", Weight: -1},
			{Backend: "llama", Server: "b", State: "ready", Weight: 13},
			{Backend: "llama", Server: "c", State: "ready", Weight: 64},
		}},
		{fleetwatch.ShadowBreakers, []haproxyctl.Target{
			{Backend: "llama", Server: "a", State: "maint", Weight: -1},
			{Backend: "llama", Server: "b", State: "ready", Weight: 13},
			{Backend: "llama", Server: "c", State: "ready", Weight: 256},
		}},
		{fleetwatch.ShadowObserve, []haproxyctl.Target{
			{Backend: "llama", Server: "a", State: "ready", Weight: 256},
			{Backend: "llama", Server: "b", State: "ready", Weight: 256},
			{Backend: "llama", Server: "c", State: "ready", Weight: 256},
		}},
	}
	for _, tt := range tests {
		snap := snapshot(1,
			backend("a", fleetwatch.StateOpen, 0),
			backend("b", fleetwatch.StateHalfOpen, 0.05),
			backend("c", fleetwatch.StateClosed, 0.25),
		)
		snap.Shadow = tt.mode
		if diff := cmp.Diff(tt.want, haproxyctl.Targets(snap, haproxyctl.Settings{})); diff != "" {
			t.Errorf("shadow %q (-want +got):\n%s", tt.mode, diff)
		}
	}
}
