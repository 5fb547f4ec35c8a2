package analyzer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/fleetwatch/fleetwatch"
)

// tripCause reports whether cause opens a closed backend.
func tripCause(cause string) bool {
	switch cause {
	case CauseConsecutive, CauseFailureRate, CauseThrottled, CauseSlow, CauseClientError:
		return true
	}
	return false
}

// ruleOpens reports whether a rule of e fires with nothing holding it.
func ruleOpens(e Explanation, cause string) bool {
	for _, r := range e.Rules {
		if causeOfRule(r.Rule) == cause && r.Fires && r.HeldBy == "" {
			return true
		}
	}
	return false
}

// causeOfRule is the transition cause of a rule's trip: the rule's name
// without _recent, and throttled for every 429 rule (the run and the
// refusal rule too).
func causeOfRule(rule string) string {
	switch rule {
	case RuleThrottledRun, RuleThrottledRefuse:
		return CauseThrottled
	}
	return strings.TrimSuffix(rule, "_recent")
}

// firstTrip is the first row of e's table that opens the backend (fires,
// nothing holds it, it has the reason it opens with): the rule findTrips
// chooses.
func firstTrip(e Explanation) (RuleCheck, bool) {
	for _, r := range e.Rules {
		if r.TripReason != "" {
			if !r.Fires || r.HeldBy != "" {
				return r, false
			}
			return r, true
		}
	}
	return RuleCheck{}, false
}

// TestPropertyExplainIsTheDecision: for any sequence of events, drift
// changes and evaluations, Explain at now says what Evaluate at now then
// does to every backend (its state, its weight, the cause of its
// transition) and changes nothing (an analyzer never explained decides the
// same), and its rule table agrees: a trip's rule fires unheld, and a
// closed backend with a rule firing unheld and no cap hold opens.
func TestPropertyExplainIsTheDecision(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Settings: Settings{
				MinRequests:         rapid.IntRange(1, 30).Draw(t, "min_requests"),
				ConsecutiveFailures: rapid.IntRange(1, 6).Draw(t, "consecutive_failures"),
				HalfOpenSuccesses:   rapid.IntRange(1, 6).Draw(t, "half_open_successes"),
				OpenBase:            time.Duration(rapid.IntRange(1, 10).Draw(t, "open_base_s")) * time.Second,
				MaxOpenFraction:     rapid.SampledFrom([]float64{0, 0.2, 0.5, 1}).Draw(t, "max_open_fraction"),
				RecentMinRequests:   rapid.SampledFrom([]int{-1, 0, 3}).Draw(t, "recent_min_requests"),
				PoolThrottleHold:    rapid.SampledFrom([]float64{-1, 0, 0.5}).Draw(t, "pool_throttle_hold"),
				ClientErrorRate:     rapid.SampledFrom([]float64{-1, 0, 0.3}).Draw(t, "client_error_rate"),
				ClientErrorMargin:   rapid.SampledFrom([]float64{0, 0.1}).Draw(t, "client_error_margin"),
				Expiry:              time.Duration(rapid.SampledFrom([]int{0, 30, 45}).Draw(t, "expiry_s")) * time.Second,
			},
			Quarantine: rapid.Bool().Draw(t, "quarantine"),
			Seed:       rapid.Uint64().Draw(t, "seed"),
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		// twin gets the same inputs and is never explained: Explain must
		// change nothing the analyzer decides.
		twin, err := New(cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		nBackends := rapid.IntRange(1, 6).Draw(t, "backends")
		outcomes := []fleetwatch.Outcome{ok, ok, ok, fail, timeout, throttled, canceled, clientErr, stalled}
		slow := rapid.IntRange(0, nBackends).Draw(t, "slow_backend") // nBackends: none is slow
		now := t0
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			switch rapid.IntRange(0, 9).Draw(t, "action") {
			case 0:
				id := fmt.Sprint("b", rapid.IntRange(0, nBackends-1).Draw(t, "drift_backend"))
				status := rapid.SampledFrom([]fleetwatch.DriftStatus{fleetwatch.DriftOK, fleetwatch.DriftDrifted}).Draw(t, "status")
				a.SetDrift("p", id, status)
				twin.SetDrift("p", id, status)
			case 1, 2:
				now = now.Add(time.Duration(rapid.IntRange(0, 40_000).Draw(t, "advance_ms")) * time.Millisecond)
			default:
				batch := make([]fleetwatch.Event, rapid.IntRange(1, 40).Draw(t, "batch"))
				for i := range batch {
					b := rapid.IntRange(0, nBackends-1).Draw(t, "backend")
					ttft := rapid.Float64Range(50, 300).Draw(t, "ttft")
					if b == slow {
						ttft *= 20
					}
					batch[i] = event("p", fmt.Sprint("b", b), rapid.SampledFrom(outcomes).Draw(t, "outcome"),
						now.Add(time.Duration(rapid.IntRange(-3000, 0).Draw(t, "skew_ms"))*time.Millisecond), ttft)
					batch[i].RetryAfterMs = float64(rapid.IntRange(0, 2).Draw(t, "retry_after_s") * 1000)
				}
				a.Observe(batch)
				twin.Observe(batch)
			}
			before := map[string]Explanation{}
			for i := range nBackends {
				id := fmt.Sprint("b", i)
				if e, found := a.Explain("p", id, now); found {
					before[id] = e
				}
			}
			// The whole pool from one run explains each backend alike.
			all, found := a.ExplainPool("p", now)
			if found != (len(before) > 0) || len(all) != len(before) {
				t.Fatalf("step %d: ExplainPool found %v with %d backends, Explain %d", step, found, len(all), len(before))
			}
			for _, e := range all {
				if diff := cmp.Diff(before[e.Backend], e); diff != "" {
					t.Fatalf("step %d: %s: Explain and ExplainPool differ (-Explain +ExplainPool):\n%s", step, e.Backend, diff)
				}
			}
			ev := a.Evaluate(now)
			if diff := cmp.Diff(twin.Evaluate(now), ev); diff != "" {
				t.Fatalf("step %d: explaining changed the evaluation (-unexplained +explained):\n%s", step, diff)
			}
			snap, found := a.Snapshot("p", now)
			if !found {
				for id, e := range before {
					if e.Verdict != "" || e.VerdictCause != CauseExpired {
						t.Fatalf("step %d: the pool expired, explain said %s is %q (%s)", step, id, e.Verdict, e.VerdictCause)
					}
				}
				continue
			}
			causes, reasons := map[string]string{}, map[string]string{}
			for _, tr := range ev.Transitions {
				causes[tr.Backend], reasons[tr.Backend] = tr.Cause, tr.Reason
			}
			for id, e := range before {
				d := snap.Find(id)
				if d == nil {
					if e.Verdict != "" || e.VerdictCause != CauseExpired {
						t.Fatalf("step %d: %s expired, explain said %q (%s)", step, id, e.Verdict, e.VerdictCause)
					}
					continue
				}
				if e.Verdict != d.State || e.VerdictWeight != d.Weight || e.VerdictCause != causes[id] {
					t.Fatalf("step %d: %s: explain said %s weight %v cause %q; evaluate made it %s weight %v cause %q",
						step, id, e.Verdict, e.VerdictWeight, e.VerdictCause, d.State, d.Weight, causes[id])
				}
				if tripCause(e.VerdictCause) { // closed when the rules ran (a half-open one may close first)
					if !ruleOpens(e, e.VerdictCause) {
						t.Fatalf("step %d: %s opened by %s, but its rule does not fire unheld: %+v", step, id, e.VerdictCause, e.Rules)
					}
					// The table states the reason the backend opened with,
					// word for word, on the rule that opened it.
					r, ok := firstTrip(e)
					if !ok || r.TripReason != reasons[id] || causeOfRule(r.Rule) != causes[id] {
						t.Fatalf("step %d: %s opened by %s (%q), but the table's first trip is %+v (ok %v)", step, id, causes[id], reasons[id], r, ok)
					}
				}
				if r, ok := firstTrip(e); ok && r.TripReason != e.VerdictReason {
					t.Fatalf("step %d: %s (%s) has a trip row %+v, but the verdict is %s (%q): %+v", step, id, e.State, r, e.VerdictCause, e.VerdictReason, e)
				}
				if e.State == fleetwatch.StateClosed && e.CapHeld == "" && e.Verdict == fleetwatch.StateClosed {
					for _, r := range e.Rules {
						if r.Fires && r.HeldBy == "" {
							t.Fatalf("step %d: %s stays closed, but rule %s fires unheld: %+v", step, id, r.Rule, r)
						}
					}
				}
				if want := d.Weight < 1 && d.State == fleetwatch.StateClosed && !strings.HasPrefix(d.Reason, "ejection cap held"); want && !strings.Contains(d.Reason, "weight ") {
					t.Fatalf("step %d: %s has weight %v and no weight in its reason %q", step, id, d.Weight, d.Reason)
				}
			}
		}
	})
}

func TestExplainScenarios(t *testing.T) {
	now := at(10 * time.Second)
	type want struct {
		Verdict   fleetwatch.State
		Cause     string
		Evaluated bool
		Held      map[string]string // rule -> held_by, for the rules that fire
		CapHeld   bool
		Fixed     string
	}
	tests := []struct {
		name   string
		cfg    Config
		events []fleetwatch.Event
		want   want
	}{
		{
			name:   "a quiet backend is not evaluated: the gate holds its failure rate",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 3, t0, 3*time.Second, 200, fail, ok, fail)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: false,
				Held: map[string]string{CauseFailureRate: HeldByGate}},
		},
		{
			name:   "a failing backend opens on its failure rate",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 24, t0, 10*time.Second, 200, fail, ok)),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseFailureRate, Evaluated: true,
				Held: map[string]string{CauseFailureRate: ""}, Fixed: "open"},
		},
		{
			name: "a recovered backend is held by the recency check",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 30, at(-15*time.Second), 15*time.Second, 200, fail, fail, ok),
				series("p", "x", ok, 10, at(3*time.Second), 6*time.Second, 200)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: true, Held: map[string]string{CauseFailureRate: HeldByRecency}},
		},
		{
			name: "a few slow requests are held by the median confirmation",
			events: concat(healthy(200, "a", "b", "c"), series("p", "x", ok, 22, t0, 8*time.Second, 200),
				series("p", "x", ok, 3, t0.Add(9*time.Second), 900*time.Millisecond, 20_000)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: true, Held: map[string]string{CauseSlow: HeldByMedian}},
		},
		{
			name:   "a slow backend opens",
			events: concat(healthy(200, "a", "b", "c"), healthy(1200, "x")),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseSlow, Evaluated: true,
				Held: map[string]string{CauseSlow: ""}, Fixed: "open"},
		},
		{
			name: "a pool answering 429 everywhere is held as saturated",
			events: concat(alternate("p", "a", 40, t0, 10*time.Second, 200, throttled, ok),
				alternate("p", "b", 40, t0, 10*time.Second, 200, throttled, ok),
				alternate("p", "x", 40, t0, 10*time.Second, 200, throttled, throttled, ok)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: true,
				Held: map[string]string{CauseThrottled: HeldByPoolThrottle}},
		},
		{
			name: "the ejection cap holds the second of two",
			cfg:  Config{Settings: Settings{MaxOpenFraction: 0.2}},
			events: concat(healthy(200, "a", "b"), series("p", "w", fail, 30, t0, 10*time.Second, 0),
				alternate("p", "x", 24, t0, 10*time.Second, 200, fail, ok)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: true, CapHeld: true, Fixed: "cap_held",
				Held: map[string]string{CauseFailureRate: HeldByCap}},
		},
		{
			name: "two stalls open it, and the consecutive row counts stalls",
			events: concat(healthy(200, "a", "b"), series("p", "x", ok, 30, at(-15*time.Second), 10*time.Second, 200),
				series("p", "x", stalled, 2, at(5*time.Second), time.Second, 0)),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseConsecutive, Evaluated: true,
				Held: map[string]string{CauseConsecutive: ""}, Fixed: "open"},
		},
		{
			name: "the newest half of the window stands in for it on the 429 rule",
			events: concat(healthy(200, "a", "b"), series("p", "x", ok, 100, at(-20*time.Second), 14*time.Second, 200),
				series("p", "x", ok, 4, at(-4*time.Second), 6*time.Second, 200),
				alternate("p", "x", 12, at(3500*time.Millisecond), 6*time.Second, 200, throttled, throttled, ok)),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseThrottled, Evaluated: true,
				Held: map[string]string{RuleThrottledRecent: ""}, Fixed: "open"},
		},
		{
			name:   "quarantine fixes the weight at 0",
			cfg:    Config{Quarantine: true},
			events: healthy(200, "a", "b", "x"),
			want:   want{Verdict: fleetwatch.StateClosed, Evaluated: true, Held: map[string]string{}, Fixed: "quarantine"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Settings = noJitter(bareRate(cfg.Settings))
			a := newAnalyzer(t, cfg)
			a.Observe(tt.events)
			if tt.want.Fixed == "quarantine" {
				a.SetDrift("p", "x", fleetwatch.DriftDrifted)
			}
			e, found := a.Explain("p", "x", now)
			if !found {
				t.Fatal("x not found")
			}
			got := want{Verdict: e.Verdict, Cause: e.VerdictCause, Evaluated: e.Evaluated, Held: map[string]string{},
				CapHeld: e.CapHeld != "", Fixed: e.WeightParts.Fixed}
			for _, r := range e.Rules {
				if r.Fires {
					got.Held[r.Rule] = r.HeldBy
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nrules: %+v", diff, e.Rules)
			}
			if r, ok := firstTrip(e); tripCause(e.VerdictCause) && (!ok || r.TripReason != e.VerdictReason) {
				t.Errorf("opened with %q; the table's first trip is %+v", e.VerdictReason, r)
			}
			if e.VerdictCause == CauseConsecutive && strings.Contains(e.VerdictReason, "stalls") {
				if r := e.Rules[0]; r.Threshold != float64(DefaultConsecutiveStalls) || !strings.Contains(r.Detail, "stalls") {
					t.Errorf("stalls opened it; the consecutive row says %+v", r)
				}
			}
			if strings.Contains(tt.name, "newest half") && !strings.Contains(e.Rules[4].Detail, "stands in") {
				t.Errorf("the throttled_recent row does not name the newest half: %+v", e.Rules[4])
			}
			ev := a.Evaluate(now)
			d := backendOf(t, a, "p", "x", now)
			if d.State != e.Verdict || d.Weight != e.VerdictWeight {
				t.Errorf("evaluate: %s weight %v; explain said %s weight %v", d.State, d.Weight, e.Verdict, e.VerdictWeight)
			}
			if trs := transitionsOf(ev, "x"); len(trs) > 0 && trs[0].Reason != e.VerdictReason {
				t.Errorf("transition reason %q, explain said %q", trs[0].Reason, e.VerdictReason)
			}
		})
	}
}

// TestExplainCountsAndWeight checks the counts by outcome, the newest
// quarter and the parts of a throttled backend's damped weight.
func TestExplainCountsAndWeight(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(200, "a", "b"), series("p", "x", ok, 25, t0, 10*time.Second, 200)))
	a.Evaluate(at(10 * time.Second))
	// x starts answering a 429 to one request of four: its weight falls
	// toward 1 - 0.25/0.5 = 0.5 (shrunk toward the pool), by at most 0.25
	// per heartbeat.
	a.Observe(alternate("p", "x", 40, at(10*time.Second), time.Second, 200, throttled, ok, ok, ok, canceled))
	now := at(11 * time.Second)
	e, found := a.Explain("p", "x", now)
	if !found {
		t.Fatal("x not found")
	}
	wantCounts := map[string]uint64{"ok": 25 + 24, "throttled": 8, "canceled": 8}
	if diff := cmp.Diff(wantCounts, e.Counts); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if e.Requests != 65 || e.Counted != 57 || !e.Evaluated || e.Recent.SpanMs != 7000 {
		t.Errorf("requests %d counted %d evaluated %v recent %+v", e.Requests, e.Counted, e.Evaluated, e.Recent)
	}
	w := e.WeightParts
	if w.Fixed != "" || w.Rate429 != 8.0/57 || !w.Damped || w.Step != 0.25 || w.K != 5 || w.N != 57 {
		t.Errorf("weight parts %+v", w)
	}
	if e.VerdictWeight != 0.75 {
		t.Errorf("verdict weight %v, want 0.75 (one step of 0.25 from 1)", e.VerdictWeight)
	}
	for _, part := range []string{"weight 0.75: 429 pressure (rate_429 0.14", "shrinkage toward the pool's", "damping toward"} {
		if !strings.Contains(w.Reason, part) {
			t.Errorf("weight reason %q lacks %q", w.Reason, part)
		}
	}
	if _, found := a.Explain("p", "nobody", now); found {
		t.Error("an unknown backend is explained")
	}
	if _, found := a.Explain("nowhere", "x", now); found {
		t.Error("an unknown pool is explained")
	}
}
