package p2c

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// TestDrainedTakesNoPicks checks that a drained backend (closed, weight 0,
// carrying an operator override) takes no new pick, in balance and in
// failover mode, with and without a prefix it would hold by affinity.
func TestDrainedTakesNoPicks(t *testing.T) {
	drain := &fleetwatch.Override{Kind: fleetwatch.OverrideDrain, Reason: "maintenance", Who: "ops",
		Until: fleetwatch.At(t0.Add(time.Hour))}
	for _, mode := range []fleetwatch.Mode{fleetwatch.ModeBalance, fleetwatch.ModeFailover} {
		for _, req := range []Request{{}, {Prefix: 42, HasPrefix: true}} {
			bs := []fleetwatch.Backend{backend("a", 100), backend("b", 300), backend("c", 300)}
			bs[0].Weight, bs[0].Override = 0, drain // a is the fastest: it would win every comparison
			snap := pool(1, bs...)
			snap.Mode = mode
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			p.Update(snap)
			got := counts(p, seeded(7), req, 5000)
			if got["a"] != 0 {
				t.Errorf("%s %+v: drained a picked %d times of 5000 (%v)", mode, req, got["a"], got)
			}
			if got["b"]+got["c"] != 5000 {
				t.Errorf("%s %+v: picks %v, want all 5000 on b and c", mode, req, got)
			}
		}
	}
}
