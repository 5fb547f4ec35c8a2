package sim

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// seeds are the seeds every claim must hold for.
var seeds = []uint64{1, 2, 3, 4, 5}

// testDuration shortens the long scenarios in tests (the same code as the
// command, less simulated time).
const testDuration = 4 * time.Minute

func scenario(t *testing.T, name string) Scenario {
	t.Helper()
	sc, ok := ScenarioByName(name)
	if !ok {
		t.Fatalf("no scenario %q", name)
	}
	return sc.Shorten(testDuration)
}

// runs runs sc for every policy and seed, in parallel, and returns
// results[policy][seed index].
func runs(t *testing.T, sc Scenario, policies ...string) map[string][]*Result {
	t.Helper()
	return runsOver(t, sc, seeds, policies...)
}

// seedsTo is seeds 1 to n.
func seedsTo(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// runsOver is runs over the given seeds.
func runsOver(t *testing.T, sc Scenario, seeds []uint64, policies ...string) map[string][]*Result {
	t.Helper()
	out := make(map[string][]*Result, len(policies))
	for _, p := range policies {
		out[p] = make([]*Result, len(seeds))
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range policies {
		for i, seed := range seeds {
			wg.Go(func() {
				r, err := Run(sc, p, seed)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				out[p][i] = r
			})
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Fatal(err)
	}
	return out
}

func TestDeterministic(t *testing.T) {
	sc := scenario(t, FastFailure)
	for _, p := range []string{Fleetwatch, LiteLLM, P2CLocal} {
		a, err := Run(sc, p, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(sc, p, 7)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a, b, cmpopts.EquateNaNs()); diff != "" {
			t.Errorf("%s: two runs with seed 7 differ (-first +second):\n%s", p, diff)
		}
		c, err := Run(sc, p, 8)
		if err != nil {
			t.Fatal(err)
		}
		if a.TTFTP50 == c.TTFTP50 && a.Attempts == c.Attempts {
			t.Errorf("%s: seeds 7 and 8 gave the same run; the seed is not used", p)
		}
	}
}

// Mixed-cost steady state: fleetwatch's p99 TTFT is at most half of
// round-robin's, with equal and with unequal backend speeds.
func TestMixedCost(t *testing.T) {
	long(t)
	for _, name := range []string{MixedEqual, MixedUnequal} {
		t.Run(name, func(t *testing.T) {
			// The full 10 minutes: round-robin's p99 over 4 minutes
			// depends too much on how many huge requests a seed draws.
			sc, _ := ScenarioByName(name)
			res := runs(t, sc, RoundRobin, Fleetwatch, LeastConn)
			for i, seed := range seeds {
				fw, rr, lc := res[Fleetwatch][i], res[RoundRobin][i], res[LeastConn][i]
				t.Logf("seed %d: p99 fleetwatch %.0f, round-robin %.0f (%.2fx), least-conn %.0f", seed, fw.TTFTP99, rr.TTFTP99, fw.TTFTP99/rr.TTFTP99, lc.TTFTP99)
				if fw.TTFTP99 > 0.5*rr.TTFTP99 {
					t.Errorf("seed %d: fleetwatch p99 %.0f ms > 0.5 x round-robin's %.0f ms", seed, fw.TTFTP99, rr.TTFTP99)
				}
				if fw.ErrorRate > rr.ErrorRate+0.001 {
					t.Errorf("seed %d: fleetwatch error rate %.4f > round-robin's %.4f", seed, fw.ErrorRate, rr.ErrorRate)
				}
			}
		})
	}
}

// The fast-failure trap: latency-greedy sends most traffic into the host
// that fails instantly; fleetwatch's breaker keeps it under 2%.
func TestFastFailureTrap(t *testing.T) {
	res := runs(t, scenario(t, FastFailure), LatencyGreedy, Fleetwatch)
	for i, seed := range seeds {
		greedy, fw := res[LatencyGreedy][i], res[Fleetwatch][i]
		t.Logf("seed %d: share to the broken host: latency-greedy %.3f, fleetwatch %.4f", seed, greedy.WatchShare, fw.WatchShare)
		if greedy.WatchShare <= 0.5 {
			t.Errorf("seed %d: latency-greedy sent %.3f to the broken host, want > 0.5", seed, greedy.WatchShare)
		}
		if fw.WatchShare >= 0.02 {
			t.Errorf("seed %d: fleetwatch sent %.4f to the broken host, want < 0.02", seed, fw.WatchShare)
		}
	}
}

// The herd: with 16 routers and one backend turning fast, fleetwatch's
// per-backend shares oscillate at most a third as much as latency-greedy's.
func TestHerd(t *testing.T) {
	long(t)
	res := runs(t, scenario(t, Herd), LatencyGreedy, Fleetwatch)
	for i, seed := range seeds {
		greedy, fw := res[LatencyGreedy][i], res[Fleetwatch][i]
		t.Logf("seed %d: oscillation latency-greedy %.3f, fleetwatch %.3f", seed, greedy.Oscillation, fw.Oscillation)
		if fw.Oscillation > greedy.Oscillation/3 {
			t.Errorf("seed %d: fleetwatch oscillation %.3f > 1/3 of latency-greedy's %.3f", seed, fw.Oscillation, greedy.Oscillation)
		}
	}
}

// A single failure on a quiet backend: fleetwatch's min-requests gate never
// ejects it; LiteLLM's cooldown does (on the 429).
func TestLowTrafficSingleFailure(t *testing.T) {
	res := runs(t, scenario(t, LowTraffic), LiteLLM, Fleetwatch)
	for i, seed := range seeds {
		lite, fw := res[LiteLLM][i], res[Fleetwatch][i]
		t.Logf("seed %d: ejections litellm %d, fleetwatch %d; fleetwatch share after the failure %.3f", seed, lite.Ejections, fw.Ejections, fw.WatchShare)
		if fw.Ejections != 0 {
			t.Errorf("seed %d: fleetwatch ejected the quiet backend %d times", seed, fw.Ejections)
		}
		if fw.WatchShare < 0.15 {
			t.Errorf("seed %d: the quiet backend got %.3f of fleetwatch's traffic after its failure, want about 1/3", seed, fw.WatchShare)
		}
		if lite.Ejections == 0 {
			t.Errorf("seed %d: the litellm policy never cooled the quiet backend down", seed)
		}
	}
}

// Retries in an incident: the per-router budget (fw-v1; fleetwatch's own
// follows the snapshot, see TestFleetRetryBudget) keeps its retries within
// its limit, while unbudgeted retries multiply the load.
func TestRetryBudget(t *testing.T) {
	long(t)
	res := runs(t, scenario(t, RetryStorm), FWV1, FWUnbudgeted, Random)
	for i, seed := range seeds {
		fw, unb, rnd := res[FWV1][i], res[FWUnbudgeted][i], res[Random][i]
		t.Logf("seed %d: retries fleetwatch %d (limit %.0f), unbudgeted %d; incident load x%.2f vs x%.2f (random x%.2f)",
			seed, fw.Retries, fw.BudgetLimit, unb.Retries, fw.WindowAttemptsPerRequest, unb.WindowAttemptsPerRequest, rnd.WindowAttemptsPerRequest)
		if float64(fw.Retries) > fw.BudgetLimit {
			t.Errorf("seed %d: fleetwatch made %d retries, budget limit %.0f", seed, fw.Retries, fw.BudgetLimit)
		}
		if unb.WindowAttemptsPerRequest < 1.5 || rnd.WindowAttemptsPerRequest < 1.5 {
			t.Errorf("seed %d: unbudgeted incident load x%.2f / x%.2f, want >= 1.5", seed, unb.WindowAttemptsPerRequest, rnd.WindowAttemptsPerRequest)
		}
		if fw.WindowAttemptsPerRequest > 1.3 {
			t.Errorf("seed %d: fleetwatch incident load x%.2f, want <= 1.3", seed, fw.WindowAttemptsPerRequest)
		}
	}
}

// Shared prompt, sticky backend 5x slower: fleetwatch keeps at least 90% of
// always-sticky's cache hit rate with at most half its p99.
func TestSharedPromptAffinity(t *testing.T) {
	res := runs(t, scenario(t, SharedPrompt), AlwaysSticky, Fleetwatch, Random)
	for i, seed := range seeds {
		st, fw, rnd := res[AlwaysSticky][i], res[Fleetwatch][i], res[Random][i]
		t.Logf("seed %d: hit rate fleetwatch %.3f, always-sticky %.3f, random %.3f; p99 %.0f vs %.0f", seed, fw.CacheHitRate, st.CacheHitRate, rnd.CacheHitRate, fw.TTFTP99, st.TTFTP99)
		if fw.CacheHitRate < 0.9*st.CacheHitRate {
			t.Errorf("seed %d: fleetwatch hit rate %.3f < 0.9 x always-sticky's %.3f", seed, fw.CacheHitRate, st.CacheHitRate)
		}
		if fw.TTFTP99 > 0.5*st.TTFTP99 {
			t.Errorf("seed %d: fleetwatch p99 %.0f > 0.5 x always-sticky's %.0f", seed, fw.TTFTP99, st.TTFTP99)
		}
		if rnd.CacheHitRate >= fw.CacheHitRate {
			t.Errorf("seed %d: random's hit rate %.3f >= fleetwatch's %.3f: the scenario does not reward affinity", seed, rnd.CacheHitRate, fw.CacheHitRate)
		}
	}
}

// Every scenario runs every one of its policies.
func TestEveryScenarioRuns(t *testing.T) {
	for _, sc := range Scenarios() {
		// A minute, or about 3,000 requests for the busy scenarios.
		d := min(time.Minute, time.Duration(3000/sc.Workload.RatePerSec*float64(time.Second)))
		sc = sc.Shorten(d)
		for _, p := range PoliciesOf(sc) {
			r, err := Run(sc, p, 1)
			if err != nil {
				t.Fatalf("%s/%s: %v", sc.Name, p, err)
			}
			if r.Requests == 0 || r.Attempts < r.Requests-r.Shed {
				t.Errorf("%s/%s: %d requests, %d attempts", sc.Name, p, r.Requests, r.Attempts)
			}
			if math.IsNaN(r.TTFTP50) && r.Failed < r.Requests {
				t.Errorf("%s/%s: no TTFT though %d requests succeeded", sc.Name, p, r.Requests-r.Failed)
			}
		}
	}
}

func TestShorten(t *testing.T) {
	sc := Scenario{Duration: 4 * time.Minute, WatchFrom: time.Minute,
		Incidents: []Incident{{From: time.Minute, To: 2 * time.Minute, Ramp: 40 * time.Second}}}
	got := sc.Shorten(2 * time.Minute)
	want := Scenario{Duration: 2 * time.Minute, WatchFrom: 30 * time.Second,
		Incidents: []Incident{{From: 30 * time.Second, To: time.Minute, Ramp: 20 * time.Second}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Shorten (-want +got):\n%s", diff)
	}
	if sc.Incidents[0].From != time.Minute {
		t.Error("Shorten changed the original's incidents")
	}
}

// Scaled copies every backend, keeps an incident on one backend on that
// one, copies a fleet-wide incident to the copies, and multiplies the rate.
func TestScaled(t *testing.T) {
	one := Scenario{Backends: []BackendSpec{{ID: "b0"}, {ID: "b1", Speed: 2}}, Workload: Workload{RatePerSec: 10},
		Incidents: []Incident{{Backend: "b1", Kind: FailFast}}, Watch: "b1"}
	got := one.Scaled(3)
	ids := func(sc Scenario) (out []string) {
		for _, b := range sc.Backends {
			out = append(out, b.ID)
		}
		return out
	}
	if diff := cmp.Diff([]string{"b0", "b1", "b0-1", "b1-1", "b0-2", "b1-2"}, ids(got)); diff != "" {
		t.Errorf("backends (-want +got):\n%s", diff)
	}
	if got.Backends[5].Speed != 2 || got.Workload.RatePerSec != 30 || len(got.Incidents) != 1 || got.Watch != "b1" {
		t.Errorf("scaled: speed %v, rate %v, incidents %v, watch %q", got.Backends[5].Speed, got.Workload.RatePerSec, got.Incidents, got.Watch)
	}
	wide := one
	wide.Incidents = []Incident{{Backend: "b0", Kind: FailFast, Rate: 0.4}, {Backend: "b1", Kind: FailFast, Rate: 0.4}}
	var on []string
	for _, in := range wide.Scaled(2).Incidents {
		on = append(on, in.Backend)
	}
	if diff := cmp.Diff([]string{"b0", "b1", "b0-1", "b1-1"}, on); diff != "" {
		t.Errorf("fleet-wide incident's backends (-want +got):\n%s", diff)
	}
	if len(one.Backends) != 2 || one.Workload.RatePerSec != 10 || len(wide.Incidents) != 2 {
		t.Error("Scaled changed the original")
	}
	if got := one.Scaled(1); len(got.Backends) != 2 {
		t.Errorf("Scaled(1): %d backends, want the original 2", len(got.Backends))
	}
}

// WithIncidentRate sets the share of the requests an answering incident
// takes, and keeps Count incidents, other kinds and the original.
func TestWithIncidentRate(t *testing.T) {
	sc := Scenario{Incidents: []Incident{{Backend: "b3", Kind: BareThrottle}, {Backend: "b2", Kind: FailFast, Count: 1},
		{Backend: "b1", Kind: Slow, Factor: 2}}}
	got := sc.WithIncidentRate(0.5)
	if got.Incidents[0].Rate != 0.5 || got.Incidents[1].Rate != 0 || got.Incidents[2].Rate != 0 || sc.Incidents[0].Rate != 0 {
		t.Errorf("incidents %+v (original %+v)", got.Incidents, sc.Incidents)
	}
	if got := sc.WithIncidentRate(0); !cmp.Equal(got, sc) {
		t.Error("WithIncidentRate(0) changed the scenario")
	}
}

// PrefillBatchPenalty slows a prompt's prefill by the other busy slots:
// the same run with the penalty has a higher p50 TTFT, and a scenario
// without it is unchanged.
func TestPrefillBatchPenalty(t *testing.T) {
	sc := scenario(t, MixedEqual).Shorten(time.Minute)
	if got := sc.WithPrefillBatchPenalty(0); !cmp.Equal(got, sc, cmpopts.EquateNaNs()) {
		t.Error("WithPrefillBatchPenalty(0) changed the scenario")
	}
	slowed := sc.WithPrefillBatchPenalty(2)
	if sc.Backends[0].PrefillBatchPenalty != 0 || slowed.Backends[3].PrefillBatchPenalty != 2 {
		t.Fatalf("penalty on the original %v, on the copy %v", sc.Backends[0].PrefillBatchPenalty, slowed.Backends[3].PrefillBatchPenalty)
	}
	base, err := Run(sc, LeastConn, 1)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := Run(slowed, LeastConn, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !(slow.TTFTP50 > base.TTFTP50*1.05) {
		t.Errorf("p50 TTFT %.1f ms with the penalty, %.1f without: want it higher", slow.TTFTP50, base.TTFTP50)
	}
}

func TestUnknownPolicy(t *testing.T) {
	if _, err := Run(scenario(t, FastFailure), "no-such-policy", 1); err == nil {
		t.Error("Run with an unknown policy: no error")
	}
}

var _ = fmt.Sprint
