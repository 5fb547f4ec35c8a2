package sim

import (
	"fmt"
	"testing"
	"time"
)

// withRouters returns sc with n routers.
func withRouters(sc Scenario, n int) Scenario {
	sc.Routers = n
	return sc
}

// long skips a test that simulates hundreds of thousands of requests under
// -short and under the race detector.
func long(t *testing.T) {
	t.Helper()
	if testing.Short() || raceEnabled {
		t.Skip("long simulation: runs in a plain go test without -short or -race")
	}
}

// The 429 breaker: with the newest-quarter trip (guarded, for 429s, by the
// newest half of the window) it opens a backend that starts answering 90%
// 429s within 10 s at 4 and at 16 routers; it took 18-24 s before
// (FWOldDetection), and 11-13 s at 16 routers with the whole window as the
// guard, so the test fails without either.
func TestThrottleDetection(t *testing.T) {
	for _, c := range []struct {
		routers int
		limit   float64
	}{{4, 10}, {16, 10}} {
		t.Run(fmt.Sprintf("%d routers", c.routers), func(t *testing.T) {
			res := runs(t, withRouters(scenario(t, Saturation), c.routers), Fleetwatch)[Fleetwatch]
			for i, seed := range seeds {
				got := res[i].WatchOpenMs / 1000
				t.Logf("seed %d: 429 breaker opened after %.1f s", seed, got)
				if !(got <= c.limit) { // NaN: never opened
					t.Errorf("seed %d: the 429 breaker opened after %.1f s, want <= %.0f s", seed, got, c.limit)
				}
			}
		})
	}
}

// No false trips: in the steady-state scenarios the analyzer with the new
// rules opens no breaker, at 4 and 16 routers.
func TestNoFalseTrips(t *testing.T) {
	for _, name := range []string{MixedEqual, MixedUnequal} {
		for _, routers := range []int{4, 16} {
			t.Run(fmt.Sprintf("%s/%d routers", name, routers), func(t *testing.T) {
				sc, _ := ScenarioByName(name)
				res := runs(t, withRouters(sc.Shorten(2*time.Minute), routers), Fleetwatch)[Fleetwatch]
				for i, seed := range seeds {
					if res[i].Opens != 0 {
						t.Errorf("seed %d: %d breakers opened in a steady state", seed, res[i].Opens)
					}
				}
			})
		}
	}
}

// The pool-wide 429 hold: in the overload every backend answers 429 from
// full queues; opening them (before: 4-6 openings a run) halves the pool
// and fails more requests. With the hold nothing opens and fewer requests
// fail, at 4 and 16 routers.
func TestPoolThrottleHoldOverload(t *testing.T) {
	long(t)
	for _, routers := range []int{4, 16} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			res := runs(t, withRouters(scenario(t, Overload), routers), Fleetwatch, FWOldDetection)
			now, before := res[Fleetwatch], res[FWOldDetection]
			for i, seed := range seeds {
				t.Logf("seed %d: errors %.4f with the hold (%d opens), %.4f without (%d opens)",
					seed, now[i].ErrorRate, now[i].Opens, before[i].ErrorRate, before[i].Opens)
				if now[i].Opens != 0 {
					t.Errorf("seed %d: %d breakers opened in a pool-wide overload", seed, now[i].Opens)
				}
				if now[i].ErrorRate > 0.8*before[i].ErrorRate {
					t.Errorf("seed %d: client errors %.4f with the hold, want <= 0.8 x %.4f without", seed, now[i].ErrorRate, before[i].ErrorRate)
				}
			}
		})
	}
}

// Retry budgets: retries free while a quarter of the pool's slots is idle,
// else one fleet-wide budget, keep retry-storm's client errors at 1.5% or
// less (today's per-router budget: 4-11%) and the overload's incident load
// at 1.35 attempts per request or less, at 4 and 16 routers.
func TestFleetRetryBudget(t *testing.T) {
	long(t)
	for _, routers := range []int{4, 16} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			storm := runs(t, withRouters(scenario(t, RetryStorm), routers), FLoad3Fleet25, FLoad3)
			over := runs(t, withRouters(scenario(t, Overload), routers), FLoad3Fleet25)[FLoad3Fleet25]
			for i, seed := range seeds {
				fl, pr := storm[FLoad3Fleet25][i], storm[FLoad3][i]
				t.Logf("seed %d: retry-storm errors %.4f (per-router budget %.4f); overload x%.2f",
					seed, fl.ErrorRate, pr.ErrorRate, over[i].WindowAttemptsPerRequest)
				if fl.ErrorRate > 0.015 {
					t.Errorf("seed %d: retry-storm client errors %.4f, want <= 0.015", seed, fl.ErrorRate)
				}
				if x := over[i].WindowAttemptsPerRequest; x > 1.35 || x < 1 {
					t.Errorf("seed %d: overload incident load x%.2f, want in [1, 1.35]", seed, x)
				}
			}
		})
	}
}

// The R factor: ranking by the published load plus R times the router's
// own change since the snapshot keeps the herd's oscillation at 16 routers
// at most half of what the same policy without the factor shows.
func TestFleetLoadHerd(t *testing.T) {
	long(t)
	res := runs(t, scenario(t, Herd), FLoad3, FLoad3NoR)
	for i, seed := range seeds {
		with, without := res[FLoad3][i], res[FLoad3NoR][i]
		t.Logf("seed %d: oscillation %.3f with R, %.3f without", seed, with.Oscillation, without.Oscillation)
		if with.Oscillation > 0.5*without.Oscillation {
			t.Errorf("seed %d: oscillation %.3f with R > 0.5 x %.3f without", seed, with.Oscillation, without.Oscillation)
		}
	}
}

// The fleet-load feed: backends' reported loads reach the routers, and the
// number of routers is counted from the events' sources.
func TestFleetFeedPublishes(t *testing.T) {
	f := newFleetFeed([]float64{8, 8}, 3, 30*time.Second)
	f.report(100, 0, 6, 0, false)
	f.report(200, 1, 2, 2, false)
	f.report(300, 1, 4, 2, true)
	f.publish(1000, []float64{5, 4})
	p := f.pub
	if !p.valid || p.load[0] != 6 || p.load[1] != 4 || p.ageMs[0] != 900 || p.ageMs[1] != 700 {
		t.Errorf("published loads %v ages %v", p.load, p.ageMs)
	}
	if p.routers != 2 {
		t.Errorf("routers %d, want 2 (sources 0 and 2)", p.routers)
	}
	if want := 1 - 10.0/16; p.spare != want {
		t.Errorf("spare %v, want %v", p.spare, want)
	}
	f.publish(31_000, []float64{0, 0})
	if f.pub.routers != 1 {
		t.Errorf("routers %d after the window, want 1 (none seen, floor 1)", f.pub.routers)
	}
}
