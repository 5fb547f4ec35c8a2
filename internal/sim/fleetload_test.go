package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
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
		t.Skip("long simulation: runs in a plain go test without -short or -race (TestLongSimulationsWithoutTheRaceDetector runs it under -race)")
	}
}

// The 429 breaker: with the newest-quarter trip (guarded, for 429s, by the
// newest half of the window) it opens a backend that starts answering 90%
// 429s within 10 s at 4 and at 16 routers; it took 18-24 s before
// (FWOldDetection), and 11-13 s at 16 routers with the whole window as the
// guard, so the test fails without either.
func TestThrottleDetection(t *testing.T) {
	long(t)
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

// The run of 429s: counting the hinted 429s of a quota opens
// saturation-429's b3 sooner than the rate rules alone over seeds 1-10
// (median 2.4 s against 3.1 s at 4 routers, 1.8 against 3.25 at 16) and
// no later in any seed; counting the bare 429s of full queues too opens
// backends at the start of the overload in some seed (2 0 0 0 0 0 0 1 1 2
// at 4 routers and 0 0 0 0 0 2 2 0 0 1 at 16, seeds 1-10), which is why
// bare 429s end the run by default.
func TestThrottledRun(t *testing.T) {
	long(t)
	for _, routers := range []int{4, 16} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			seeds10 := seedsTo(10)
			sat := runsOver(t, withRouters(scenario(t, Saturation), routers), seeds10, Fleetwatch, FWNo429Run)
			var with, without []float64
			for i, seed := range seeds10 {
				w, wo := sat[Fleetwatch][i].WatchOpenMs, sat[FWNo429Run][i].WatchOpenMs
				if !(w <= wo) {
					t.Errorf("seed %d: the 429 breaker opened after %.1f s with the run, %.1f s without", seed, w/1000, wo/1000)
				}
				with, without = append(with, w), append(without, wo)
			}
			slices.Sort(with)
			slices.Sort(without)
			if mw, mwo := quantile(with, 0.5), quantile(without, 0.5); !(mw < mwo) {
				t.Errorf("median time to open %.1f s with the run, %.1f s without: the run does not open sooner", mw/1000, mwo/1000)
			}
			over := runsOver(t, withRouters(scenario(t, Overload), routers), seeds10, Fleetwatch, FW429RunAll)
			bare := 0
			for i, seed := range seeds10 {
				if n := over[Fleetwatch][i].Opens; n != 0 {
					t.Errorf("seed %d: %d breakers opened in the overload", seed, n)
				}
				bare += over[FW429RunAll][i].Opens
			}
			if bare == 0 {
				t.Errorf("counting bare 429s opened nothing in the overload at seeds %v: the reason to leave them out is gone", seeds10)
			}
		})
	}
}

// No false trips: in the steady-state scenarios the analyzer with the new
// rules opens at most one breaker over the five seeds, at 4 and 16
// routers. Not none: over 100 seeds a few runs in 100 open one backend
// (1-3 per cell, with the change counted from the snapshot or from the
// report), each time by the stall rule, when a burst queues two requests on
// one backend past the routers' 10 s first-token deadline. A rule that
// trips in steady state opens one or more in every run.
func TestNoFalseTrips(t *testing.T) {
	long(t)
	for _, name := range []string{MixedEqual, MixedUnequal} {
		for _, routers := range []int{4, 16} {
			t.Run(fmt.Sprintf("%s/%d routers", name, routers), func(t *testing.T) {
				sc, _ := ScenarioByName(name)
				res := runs(t, withRouters(sc, routers), Fleetwatch)[Fleetwatch] // the whole 10 minutes: a false trip came at 6 min
				opens := 0
				for _, r := range res {
					opens += r.Opens
				}
				if opens > 1 {
					for i, seed := range seeds {
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

// The retry budget the snapshots carry (analyzer.ComputeRetryBudget,
// followed by feed/p2c): free while half the pool's capacity is idle, else
// one fleet-wide budget. It keeps retry-storm's client errors at 1.5% or
// less (the per-router budget of fw-v1: 4-11%) and the overload's
// incident load at 1.35 attempts per request or less, at 4 and 16 routers.
func TestFleetRetryBudget(t *testing.T) {
	long(t)
	for _, routers := range []int{4, 16} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			storm := runs(t, withRouters(scenario(t, RetryStorm), routers), Fleetwatch, FWV1)
			over := runs(t, withRouters(scenario(t, Overload), routers), Fleetwatch)[Fleetwatch]
			for i, seed := range seeds {
				fw, v1 := storm[Fleetwatch][i], storm[FWV1][i]
				t.Logf("seed %d: retry-storm errors %.4f (per-router budget %.4f); overload x%.2f",
					seed, fw.ErrorRate, v1.ErrorRate, over[i].WindowAttemptsPerRequest)
				if fw.ErrorRate > 0.015 {
					t.Errorf("seed %d: retry-storm client errors %.4f, want <= 0.015", seed, fw.ErrorRate)
				}
				if x := over[i].WindowAttemptsPerRequest; x > 1.35 || x < 1 {
					t.Errorf("seed %d: overload incident load x%.2f, want in [1, 1.35]", seed, x)
				}
			}
		})
	}
}

// The load score against least-connections: at 16 routers fleetwatch's
// p99 TTFT is below least-conn's in both mixed-cost steady states, over
// their full 10 minutes (as TestMixedCost: a p99 over 4 minutes depends on
// how many huge requests a seed draws): the median of the seeds' ratios
// under 0.95, and at least 14 of seeds 1-20 won. Over 100 seeds
// fleetwatch wins 87-93 in mixed-equal and 89-90 in mixed-unequal
// (docs/EVALUATION.md "The steady-state cells"): five seeds were too few,
// as the first two snapshots of a run (which count fewer than 16 routers,
// so scan) changed the random draws and seeds 1-5 then won 3 of 5 in
// mixed-equal.
func TestFleetLoadBeatsLeastConn(t *testing.T) {
	long(t)
	seeds := seedsTo(20)
	for _, name := range []string{MixedEqual, MixedUnequal} {
		t.Run(name, func(t *testing.T) {
			sc, _ := ScenarioByName(name)
			res := runsOver(t, withRouters(sc, 16), seeds, Fleetwatch, LeastConn)
			var ratios []float64
			for i, seed := range seeds {
				fw, lc := res[Fleetwatch][i], res[LeastConn][i]
				ratios = append(ratios, fw.TTFTP99/lc.TTFTP99)
				t.Logf("seed %d: p99 fleetwatch %.0f ms, least-conn %.0f ms (%.2f)", seed, fw.TTFTP99, lc.TTFTP99, fw.TTFTP99/lc.TTFTP99)
			}
			won := 0
			for _, x := range ratios {
				if x < 1 {
					won++
				}
			}
			slices.Sort(ratios)
			if m := quantile(ratios, 0.5); m >= 0.95 || won < 14 {
				t.Errorf("at 16 routers: median p99 ratio to least-conn %.2f (want < 0.95), %d of %d seeds won (want 14)", m, won, len(seeds))
			}
		})
	}
}

// The herd at 16 and 64 routers: fleetwatch's oscillation stays at 0.10 or
// below (at 64 routers it compares two choices, not three).
func TestFleetLoadHerdTarget(t *testing.T) {
	long(t)
	for _, routers := range []int{16, 64} {
		t.Run(fmt.Sprintf("%d routers", routers), func(t *testing.T) {
			res := runs(t, withRouters(scenario(t, Herd), routers), Fleetwatch)[Fleetwatch]
			for i, seed := range seeds {
				t.Logf("seed %d: oscillation %.3f", seed, res[i].Oscillation)
				if res[i].Oscillation > 0.10 {
					t.Errorf("seed %d: oscillation %.3f at %d routers, want <= 0.10", seed, res[i].Oscillation, routers)
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

// The fleet-load feed: backends' reported loads reach the snapshots with
// their age, and the number of routers is counted from the events'
// sources.
func TestFleetFeedPublishes(t *testing.T) {
	f := newFleetFeed([]float64{8, 8}, 3, 30*time.Second)
	f.report(100, 0, 6, 0, 0)
	f.report(200, 1, 2, 0, 2)
	f.report(300, 1, 3, 1, 2)
	f.publish(1000, []float64{5, 4}, true)
	p := f.pub
	if !p.valid || p.load[0] != 6 || p.load[1] != 4 || p.ageMs[0] != 900 || p.ageMs[1] != 700 {
		t.Errorf("published loads %v ages %v", p.load, p.ageMs)
	}
	if p.routers != 2 {
		t.Errorf("routers %d, want 2 (sources 0 and 2)", p.routers)
	}
	if want := 3 * math.Exp(-0.07) / 10; math.Abs(p.ratePerSec-want) > 0.01 {
		t.Errorf("rate %.3f/s, want about %.3f (3 attempts decaying over 10 s)", p.ratePerSec, want)
	}
	want := &fleetwatch.Load{Running: 3, Waiting: 1, AgeMs: 700, Source: "event"}
	if diff := cmp.Diff(want, f.loadOf(1, false)); diff != "" {
		t.Errorf("load of b1 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&fleetwatch.Load{Running: 4, Source: "metrics"}, f.loadOf(1, true)); diff != "" {
		t.Errorf("exact load of b1 (-want +got):\n%s", diff)
	}
	f.publish(31_000, []float64{0, 0}, true)
	if f.cur.routers != 0 {
		t.Errorf("routers %d after the window, want 0 (none seen, as the analyzer publishes)", f.cur.routers)
	}
}

// The scan of few routers over a larger pool: over 16 backends (Scaled(4))
// and 4 routers, fleetwatch's p99 TTFT stays within 8% of least-conn's in
// both mixed-cost steady states (the median of seeds 1-5's ratios), where
// sampling 3 candidates (fw-choices3, at 4 routers the rule before the scan) was 1.46x
// and 1.17x over 20 seeds (docs/EVALUATION.md "Pools larger than the
// choices"): a scan that did not scan, or sampled, fails here.
func TestScanInLargerPools(t *testing.T) {
	long(t)
	for _, name := range []string{MixedEqual, MixedUnequal} {
		t.Run(name, func(t *testing.T) {
			sc, _ := ScenarioByName(name)
			res := runs(t, withRouters(sc.Scaled(4), 4), Fleetwatch, FWChoices3, LeastConn)
			var scan, sampled []float64
			for i, seed := range seeds {
				lc := res[LeastConn][i].TTFTP99
				scan = append(scan, res[Fleetwatch][i].TTFTP99/lc)
				sampled = append(sampled, res[FWChoices3][i].TTFTP99/lc)
				t.Logf("seed %d: p99 / least-conn: the scan %.3f, sampled %.3f", seed, scan[i], sampled[i])
			}
			slices.Sort(scan)
			slices.Sort(sampled)
			if m, ms := quantile(scan, 0.5), quantile(sampled, 0.5); m > 1.08 || ms < 1.1 {
				t.Errorf("16 backends, 4 routers: median p99 / least-conn %.3f with the scan (want <= 1.08), %.3f sampled (want >= 1.1: the scenario no longer shows the gap)", m, ms)
			}
		})
	}
}

// scrapedRun runs 10 s of mixed-equal with policy and a scrape every
// interval, seed 1, and returns the scenario, the finished run and a
// snapshot of its backends without loads (for withFleetLoad).
func scrapedRun(t *testing.T, policy string, interval time.Duration) (Scenario, *sim, *fleetwatch.Snapshot) {
	t.Helper()
	scenarios, err := SelectScenarios(Scenarios(), "mixed-equal")
	if err != nil {
		t.Fatal(err)
	}
	sc := scenarios[0].Shorten(10 * time.Second)
	sc.ScrapeInterval = interval
	s, err := newSim(sc, policy, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.run()
	snap := &fleetwatch.Snapshot{}
	for _, id := range s.ids {
		snap.Backends = append(snap.Backends, fleetwatch.Backend{Backend: id})
	}
	return sc, s, snap
}

// With Scenario.ScrapeInterval the exact-load policy publishes each
// backend's load as its latest scrape read it, with that read's age, every
// backend read on a phase of its own; without, the true load at the
// snapshot.
func TestScrapedLoads(t *testing.T) {
	sc, s, snap := scrapedRun(t, FLoad3Exact, 200*time.Millisecond)
	n := len(s.backends)
	got := s.withFleetLoad(snap)
	for b := range n {
		at := s.scrapedAt[b]
		phase := math.Mod(at, 200)
		if want := 200 * (float64(b) + 0.5) / float64(n); math.Abs(phase-want) > 1e-6 {
			t.Errorf("b%d read at %.1f ms: phase %.1f, want %.1f (its own)", b, at, phase, want)
		}
		want := &fleetwatch.Load{Running: s.scraped[b], AgeMs: int64(s.now - at), Source: "metrics"}
		if diff := cmp.Diff(want, got.Backends[b].Load); diff != "" || want.AgeMs >= 200 {
			t.Errorf("b%d's published load (-want +got):\n%s (age %d ms, want under the interval)", b, diff, want.AgeMs)
		}
	}
	// Without the interval: the true load at the snapshot, no scrape.
	sc.ScrapeInterval = 0
	s, err := newSim(sc, FLoad3Exact, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.run()
	if s.scraped != nil {
		t.Errorf("scrapes without ScrapeInterval: %v", s.scraped)
	}
}

// fw-both-loads publishes the newer of a backend's latest scrape and the
// load its events reported, as serve's analyzer does with both sources;
// fw-exact the scrape alone, as fl-load3-exact.
func TestBothLoadsTakeTheNewer(t *testing.T) {
	sc, s, snap := scrapedRun(t, FWBothLoads, 500*time.Millisecond)
	got := s.withFleetLoad(snap)
	sources := map[string]int{}
	for b := range s.backends {
		ev := s.feed.loadOf(b, false)
		scraped := &fleetwatch.Load{Running: s.scraped[b], AgeMs: int64(s.now - s.scrapedAt[b]), Source: "metrics"}
		want := scraped
		if ev != nil && ev.AgeMs < scraped.AgeMs {
			want = ev
		}
		if diff := cmp.Diff(want, got.Backends[b].Load); diff != "" {
			t.Errorf("b%d's published load (-want +got):\n%s", b, diff)
		}
		sources[got.Backends[b].Load.Source]++
	}
	// The run is seeded: at its end two backends had answered since their
	// last read and two had not, so each source wins somewhere.
	if sources["event"] == 0 || sources["metrics"] == 0 {
		t.Errorf("published sources %v: want both to win somewhere", sources)
	}
	if s2, err := newSim(sc, FWExact, 1); err != nil {
		t.Fatal(err)
	} else {
		s2.run()
		for b, bk := range s2.withFleetLoad(snap).Backends {
			if bk.Load == nil || bk.Load.Source != "metrics" {
				t.Errorf("fw-exact: b%d's load %+v, want the scrape's", b, bk.Load)
			}
		}
	}
}
