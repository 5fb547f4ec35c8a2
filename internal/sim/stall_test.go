package sim

import (
	"fmt"
	"testing"
)

// The first-token deadline: with route's deadline (max(10 s, 4 x the pool's
// p95 TTFT)) the breaker opens on a stalling backend within 15 s of the
// stall, at 4 and 16 routers; without it (StallFloor < 0) the routers learn
// of the stall only from the clients' 30 s timeouts, so the test fails
// without the deadline.
func TestStallDetection(t *testing.T) {
	for _, routers := range []int{4, 16} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			sc := withRouters(scenario(t, StallScenario), routers)
			off := sc
			off.StallFloor = -1
			with := runs(t, sc, Fleetwatch)[Fleetwatch]
			without := runs(t, off, Fleetwatch)[Fleetwatch]
			for i, seed := range seeds {
				got, before := with[i].WatchOpenMs/1000, without[i].WatchOpenMs/1000
				t.Logf("seed %d: the breaker opened after %.1f s with the deadline, %.1f s without", seed, got, before)
				if !(got <= 15) { // NaN: never opened
					t.Errorf("seed %d: the breaker opened %.1f s after the stall, want <= 15 s", seed, got)
				}
				if !(before > 15) {
					t.Errorf("seed %d: without the deadline the breaker opened after %.1f s: the scenario no longer needs it", seed, before)
				}
			}
		})
	}
}
