package analyzer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// alternate returns n events of backend b over [from, from+span), cycling
// through outcomes.
func alternate(p, b string, n int, from time.Time, span time.Duration, ttftMs float64, outcomes ...fleetwatch.Outcome) []fleetwatch.Event {
	out := make([]fleetwatch.Event, n)
	for i := range out {
		out[i] = event(p, b, outcomes[i%len(outcomes)], from.Add(span*time.Duration(i)/time.Duration(n)), ttftMs)
	}
	return out
}

// healthy returns 25 ok events at ttftMs for each backend, over 10s.
func healthy(ttftMs float64, backends ...string) []fleetwatch.Event {
	var out []fleetwatch.Event
	for _, b := range backends {
		out = append(out, series("p", b, ok, 25, t0, 10*time.Second, ttftMs)...)
	}
	return out
}

func concat(parts ...[]fleetwatch.Event) []fleetwatch.Event { return slices.Concat(parts...) }

func withRetry(evs []fleetwatch.Event, ms float64) []fleetwatch.Event {
	for i := range evs {
		if evs[i].Outcome == throttled {
			evs[i].RetryAfterMs = ms
		}
	}
	return evs
}

// TestTripRules covers every rule that opens a closed backend, the gate and
// the run semantics.
func TestTripRules(t *testing.T) {
	type want struct {
		State     fleetwatch.State
		Cause     string // of the transition; "" for none
		Reason    string
		OpenFor   time.Duration // open_until - now, when open
		HeldGate  map[string]uint64
		WeightMax float64 // when > 0, the weight must be at most this
	}
	evalAt := at(10 * time.Second)
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		want     want
	}{
		{
			name:   "one failure of three requests never opens",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 3, t0, 3*time.Second, 200, ok, fail, ok)),
			want:   want{State: fleetwatch.StateClosed, Reason: "not evaluated: 3 of 20 requests", HeldGate: map[string]uint64{}},
		},
		{
			name:   "two of three failing is held by the gate",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 3, t0, 3*time.Second, 200, fail, ok, fail)),
			want:   want{State: fleetwatch.StateClosed, Reason: "not evaluated: 3 of 20 requests", HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name:   "five failures in a row open at any volume",
			events: concat(healthy(200, "a", "b"), series("p", "x", fail, 5, t0, 5*time.Second, 0)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseConsecutive, Reason: "5 consecutive failures",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name:   "timeouts are failures",
			events: concat(healthy(200, "a", "b"), series("p", "x", timeout, 5, t0, 5*time.Second, 0)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseConsecutive, Reason: "5 consecutive failures",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name:     "stalls are failures, like timeouts",
			settings: Settings{ConsecutiveStalls: 9},
			events:   concat(healthy(200, "a", "b"), series("p", "x", stalled, 5, t0, 5*time.Second, 0)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseConsecutive, Reason: "5 consecutive failures",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name: "two stalls in a run of failures open",
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 3, t0, 3*time.Second, 0, stalled, fail, stalled)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseConsecutive,
				Reason:  "2 stalls in a run of 3 failures (no first token within the router's deadline)",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name: "an ok between two stalls ends the run",
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 3, t0, 3*time.Second, 200, stalled, ok, stalled)),
			want: want{State: fleetwatch.StateClosed, Reason: "not evaluated: 3 of 20 requests", HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name:     "consecutive_stalls 3",
			settings: Settings{ConsecutiveStalls: 3},
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 2, t0, 2*time.Second, 0, stalled, stalled)),
			want: want{State: fleetwatch.StateClosed, Reason: "not evaluated: 2 of 20 requests", HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name:   "stalls count in the failure rate",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 24, t0, 10*time.Second, 200, stalled, ok)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseFailureRate,
				Reason: "error rate 0.50 >= 0.50 over 24 requests in 30s", OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name: "an ok resets the run",
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 9, t0, 9*time.Second, 200, fail, fail, fail, fail, ok)),
			want: want{State: fleetwatch.StateClosed, Reason: "not evaluated: 9 of 20 requests", HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name: "throttled and client-side outcomes neither reset nor extend the run",
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 8, t0, 8*time.Second, 0, fail, fail, fail, throttled, canceled, clientErr, fail, fail)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseConsecutive, Reason: "5 consecutive failures",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{CauseFailureRate: 1}},
		},
		{
			name: "four failures and five 429s are not five failures",
			events: concat(healthy(200, "a", "b"),
				alternate("p", "x", 9, t0, 9*time.Second, 0, fail, throttled, fail, throttled, fail, throttled, fail, throttled, throttled)),
			want: want{State: fleetwatch.StateClosed, Reason: "not evaluated: 9 of 20 requests; weight 0.36: 429 pressure (rate_429 0.56 of throttle_rate 0.50 gives 0.00), shrinkage toward the pool's 1.00 over 9 requests (k 5) gives 0.36",
				HeldGate: map[string]uint64{CauseFailureRate: 1, CauseThrottled: 1}},
		},
		{
			name:   "failure rate at min_requests opens",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 24, t0, 10*time.Second, 200, fail, ok)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseFailureRate,
				Reason: "error rate 0.50 >= 0.50 over 24 requests in 30s", OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name:   "failure rate below the threshold stays closed",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 40, t0, 10*time.Second, 200, fail, ok, ok)),
			want:   want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:   "canceled never counts",
			events: concat(healthy(200, "a", "b"), series("p", "x", canceled, 60, t0, 10*time.Second, 0)),
			want:   want{State: fleetwatch.StateClosed, Reason: "not evaluated: 0 of 20 requests", HeldGate: map[string]uint64{}},
		},
		{
			// Client errors count against a backend only relative to its
			// peers (clienterr_test.go); canceled is left out of that rate.
			name:   "client errors the peers do not see open",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 60, t0, 10*time.Second, 0, canceled, clientErr)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError, Reason: "other 4xx rate 1.00 vs pool median 0.00 over 30 requests in 30s",
				OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name: "429 rate opens for at least the largest retry-after",
			events: concat(healthy(200, "a", "b"),
				withRetry(alternate("p", "x", 40, t0, 10*time.Second, 200, throttled, ok, throttled, throttled, ok), 45_000)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 0.60 >= 0.50 over 40 requests; retry-after 45s", OpenFor: 45 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name: "429 rate opens for the open time when retry-after is shorter",
			events: concat(healthy(200, "a", "b"),
				withRetry(alternate("p", "x", 40, t0, 10*time.Second, 200, throttled, ok, throttled, throttled, ok), 2_000)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 0.60 >= 0.50 over 40 requests; retry-after 2s", OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name:   "429 rate below the threshold lowers the weight",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 40, t0, 10*time.Second, 200, throttled, ok, ok, ok)),
			want: want{State: fleetwatch.StateClosed, Reason: "weight 0.54: 429 pressure (rate_429 0.25 of throttle_rate 0.50 gives 0.50), shrinkage toward the pool's 0.83 over 40 requests (k 5) gives 0.54",
				HeldGate: map[string]uint64{}, WeightMax: 0.6},
		},
		{
			name:   "one backend at 6x the median opens",
			events: concat(healthy(200, "a", "b", "c"), healthy(1200, "x")),
			want: want{State: fleetwatch.StateOpen, Cause: CauseSlow,
				// The medians come from the histogram (relative error <= 3%).
				Reason: "median ttft 1183ms > 5.0 x pool median 204ms (ewma 1200ms) over 25 requests", OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			name:   "one peer is enough to compare with",
			events: concat(healthy(200, "a"), healthy(1200, "x")),
			want: want{State: fleetwatch.StateOpen, Cause: CauseSlow,
				Reason: "median ttft 1183ms > 5.0 x pool median 204ms (ewma 1200ms) over 25 requests", OpenFor: 30 * time.Second, HeldGate: map[string]uint64{}},
		},
		{
			// Heavy-tailed TTFT: the last few requests queued behind long
			// generations push the EWMA past 5x the median, but most
			// requests are as fast as the peers'.
			name: "a few very slow requests do not open a backend",
			events: concat(healthy(200, "a", "b", "c"), series("p", "x", ok, 22, t0, 8*time.Second, 200),
				series("p", "x", ok, 3, t0.Add(9*time.Second), 900*time.Millisecond, 20_000)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			// 20 failures and 20 oks, no five in a row, then only oks in the
			// newest quarter of the window: a rate of 0.5 over the window,
			// but the backend has recovered.
			name: "a recovered backend is not opened on its history",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 30, at(-15*time.Second), 15*time.Second, 200, fail, fail, ok),
				series("p", "x", ok, 10, at(3*time.Second), 6*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name: "a backend no longer throttled is not opened on its history",
			events: concat(healthy(200, "a", "b"), alternate("p", "x", 30, at(-15*time.Second), 15*time.Second, 200, throttled, throttled, ok),
				series("p", "x", ok, 10, at(3*time.Second), 6*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed, Reason: "weight 0.07: 429 pressure (rate_429 0.50 of throttle_rate 0.50 gives 0.00), shrinkage toward the pool's 0.67 over 40 requests (k 5) gives 0.07",
				HeldGate: map[string]uint64{}},
		},
		{
			name:   "4x the median is not slow",
			events: concat(healthy(200, "a", "b", "c"), healthy(800, "x")),
			want:   want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:   "a pool that slows down together trips nothing",
			events: concat(healthy(1200, "a", "b", "c", "x")),
			want:   want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:   "a lone backend is never slow",
			events: healthy(9000, "x"),
			want:   want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:   "slowness below min_requests is held",
			events: concat(healthy(200, "a", "b", "c"), series("p", "x", ok, 10, t0, 10*time.Second, 1200)),
			want:   want{State: fleetwatch.StateClosed, Reason: "not evaluated: 10 of 20 requests", HeldGate: map[string]uint64{CauseSlow: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(bareRate(tt.settings))})
			a.Observe(tt.events)
			ev := a.Evaluate(evalAt)
			d := backendOf(t, a, "p", "x", evalAt)
			got := want{State: d.State, Reason: d.Reason, HeldGate: a.Stats().HeldByGate, WeightMax: tt.want.WeightMax}
			if trs := transitionsOf(ev, "x"); len(trs) > 0 {
				got.Cause = trs[0].Cause
				if trs[0].Reason != d.Reason {
					t.Errorf("transition reason %q, snapshot reason %q", trs[0].Reason, d.Reason)
				}
			}
			if d.OpenUntil != nil {
				got.OpenFor = d.OpenUntil.Sub(evalAt)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if tt.want.WeightMax > 0 && d.Weight > tt.want.WeightMax {
				t.Errorf("weight %v > %v", d.Weight, tt.want.WeightMax)
			}
			if d.State == fleetwatch.StateOpen && d.Weight != 0 {
				t.Errorf("open backend has weight %v", d.Weight)
			}
			for _, peer := range []string{"a", "b", "c"} {
				if snap, _ := a.Snapshot("p", evalAt); snap.Find(peer) != nil && snap.Find(peer).State != fleetwatch.StateClosed {
					t.Errorf("healthy peer %s is %s", peer, snap.Find(peer).State)
				}
			}
		})
	}
}

// TestGateCountsOncePerEpisode: a held rule is counted when it starts being
// held, not at every Evaluate.
func TestGateCountsOncePerEpisode(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Observe(concat(healthy(200, "a"), alternate("p", "x", 4, t0, time.Second, 200, fail, ok)))
	for i := range 5 {
		a.Evaluate(at(5*time.Second + time.Duration(i)*time.Second))
	}
	want := map[string]uint64{CauseFailureRate: 1}
	if diff := cmp.Diff(want, a.Stats().HeldByGate); diff != "" {
		t.Errorf("held by gate (-want +got):\n%s", diff)
	}
	// The window empties; the rule stops firing; a new burst is a new episode.
	a.Evaluate(at(60 * time.Second))
	a.Observe(alternate("p", "x", 4, at(61*time.Second), time.Second, 200, fail, ok))
	a.Evaluate(at(66 * time.Second))
	want[CauseFailureRate] = 2
	if diff := cmp.Diff(want, a.Stats().HeldByGate); diff != "" {
		t.Errorf("held by gate (-want +got):\n%s", diff)
	}
}

func TestEWMA(t *testing.T) {
	errWithTTFT := func(sec int) fleetwatch.Event {
		e := event("p", "x", fail, at(time.Duration(sec)*time.Second), 0)
		e.TTFTMs, e.HasTTFT = 1, true // an instant 500
		return e
	}
	cold := func(sec int, ms float64) fleetwatch.Event {
		e := event("p", "x", ok, at(time.Duration(sec)*time.Second), ms)
		e.Cold = true
		return e
	}
	okAt := func(sec int, ms float64) fleetwatch.Event {
		return event("p", "x", ok, at(time.Duration(sec)*time.Second), ms)
	}
	noTTFT := func(sec int) fleetwatch.Event {
		return fleetwatch.Event{Pool: "p", Backend: "x", TS: at(time.Duration(sec) * time.Second), Outcome: ok}
	}
	tests := []struct {
		name     string
		events   []fleetwatch.Event
		want     *float64
		discount Discounts
		samples  int64 // p50 present?
	}{
		{"the first event of a new backend gives no sample", []fleetwatch.Event{okAt(0, 100)}, nil, Discounts{First: 1}, 0},
		{"the first sample sets the EWMA", []fleetwatch.Event{okAt(0, 100), okAt(1, 200)}, new(float64(200)), Discounts{First: 1}, 1},
		{"alpha 0.2", []fleetwatch.Event{okAt(0, 100), okAt(1, 200), okAt(2, 300)}, new(float64(220)), Discounts{First: 1}, 1},
		{"a first event that is an error is not discounted", []fleetwatch.Event{errWithTTFT(0), okAt(1, 200)}, new(float64(200)), Discounts{}, 1},
		{"cold samples are ignored", []fleetwatch.Event{okAt(0, 100), okAt(1, 200), cold(2, 5000)}, new(float64(200)), Discounts{First: 1, Cold: 1}, 1},
		{"the first sample after the idle gap is ignored",
			[]fleetwatch.Event{okAt(0, 100), okAt(1, 200), okAt(362, 900), okAt(363, 300)}, new(float64(220)), Discounts{First: 1, Idle: 1}, 1},
		{"a gap shorter than idle_gap is not idle",
			[]fleetwatch.Event{okAt(0, 100), okAt(1, 200), okAt(240, 300)}, new(float64(220)), Discounts{First: 1}, 1},
		{"instant 500s never lower the EWMA",
			[]fleetwatch.Event{okAt(0, 100), okAt(1, 1000), errWithTTFT(2), errWithTTFT(3), errWithTTFT(4)}, new(float64(1000)), Discounts{First: 1}, 1},
		{"throttled TTFTs are not samples", []fleetwatch.Event{okAt(0, 100), okAt(1, 500),
			{Pool: "p", Backend: "x", TS: at(2 * time.Second), Outcome: throttled, TTFTMs: 1, HasTTFT: true}}, new(float64(500)), Discounts{First: 1}, 1},
		{"an ok without TTFT is no sample", []fleetwatch.Event{okAt(0, 100), okAt(1, 500), noTTFT(2)}, new(float64(500)), Discounts{First: 1}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{})
			for _, e := range tt.events {
				a.Observe([]fleetwatch.Event{e})
			}
			last := tt.events[len(tt.events)-1].TS
			d := backendOf(t, a, "p", "x", last)
			if diff := cmp.Diff(tt.want, d.EWMATTFTMs, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("ewma (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.discount, a.Stats().LatencySamplesDiscounted); diff != "" {
				t.Errorf("discounts (-want +got):\n%s", diff)
			}
			if (d.P50TTFTMs != nil) != (tt.samples > 0) {
				t.Errorf("p50 %v, want samples %v", d.P50TTFTMs, tt.samples > 0)
			}
		})
	}
}

func TestOpenDuration(t *testing.T) {
	s := noJitter(Settings{}).WithDefaults()
	want := []time.Duration{30 * time.Second, time.Minute, 90 * time.Second, 2 * time.Minute, 150 * time.Second,
		3 * time.Minute, 210 * time.Second, 4 * time.Minute, 270 * time.Second, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	var got []time.Duration
	for trips := 1; trips <= len(want); trips++ {
		got = append(got, openDuration(&s, trips, nil))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("open durations (-want +got):\n%s", diff)
	}
	if d := openDuration(&s, math.MaxInt, nil); d != 5*time.Minute {
		t.Errorf("huge trip count: %v", d)
	}
}

func TestOpenDurationJitter(t *testing.T) {
	s := Settings{}.WithDefaults()
	draw := func(seed uint64) []time.Duration {
		a := newAnalyzer(t, Config{Seed: seed})
		var out []time.Duration
		for trips := 1; trips <= 20; trips++ {
			out = append(out, openDuration(&s, trips%3+1, a.rng))
		}
		return out
	}
	first, again, other := draw(42), draw(42), draw(43)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("same seed, different open times (-first +again):\n%s", diff)
	}
	if slices.Equal(first, other) {
		t.Error("different seeds gave the same open times")
	}
	distinct := map[time.Duration]bool{}
	for i, d := range first {
		base := time.Duration((i+1)%3+1) * 30 * time.Second
		if d < base*9/10 || d > base*11/10 {
			t.Errorf("trip %d: %v outside %v +-10%%", i, d, base)
		}
		distinct[d] = true
	}
	if len(distinct) < 10 {
		t.Errorf("only %d distinct jittered open times of 20", len(distinct))
	}
}

// openX opens backend x of pool p (with healthy peers a and b) by five
// failures at t0+1s..t0+5s and an Evaluate at t0+6s; x is open until t0+36s.
func openX(t *testing.T, a *Analyzer) {
	t.Helper()
	a.Observe(concat(healthy(200, "a", "b"), series("p", "x", fail, 5, at(time.Second), 5*time.Second, 0)))
	a.Evaluate(at(6 * time.Second))
	if d := backendOf(t, a, "p", "x", at(6*time.Second)); d.State != fleetwatch.StateOpen {
		t.Fatalf("setup: x is %s, want open", d.State)
	}
}

func TestHalfOpen(t *testing.T) {
	halfAt := at(36 * time.Second)
	after := func(d time.Duration) time.Time { return halfAt.Add(d) }
	tests := []struct {
		name        string
		events      []fleetwatch.Event
		wantState   fleetwatch.State
		wantCause   string
		wantReason  string
		wantOpenFor time.Duration
		wantStale   uint64
	}{
		{
			name:       "five ok in a row close it",
			events:     series("p", "x", ok, 5, after(time.Second), time.Second, 200),
			wantState:  fleetwatch.StateClosed,
			wantCause:  CauseRecovered,
			wantReason: "5 ok in a row while half-open",
		},
		{
			name:       "four ok are not enough",
			events:     series("p", "x", ok, 4, after(time.Second), time.Second, 200),
			wantState:  fleetwatch.StateHalfOpen,
			wantReason: "open for 30s; probing with weight 0.05",
		},
		{
			name:        "a failure reopens it with the next trip count",
			events:      alternate("p", "x", 5, after(time.Second), time.Second, 200, ok, ok, ok, ok, timeout),
			wantState:   fleetwatch.StateOpen,
			wantCause:   CauseHalfOpenFailure,
			wantReason:  "failure while half-open",
			wantOpenFor: time.Minute,
		},
		{
			name:        "a 429 reopens it for at least its retry-after",
			events:      withRetry(alternate("p", "x", 2, after(time.Second), time.Second, 200, ok, throttled), 90_000),
			wantState:   fleetwatch.StateOpen,
			wantCause:   CauseHalfOpenThrottled,
			wantReason:  "429 while half-open; retry-after 1m30s",
			wantOpenFor: 90 * time.Second,
		},
		{
			name:       "the first verdict wins",
			events:     alternate("p", "x", 6, after(time.Second), time.Second, 200, ok, ok, ok, ok, ok, fail),
			wantState:  fleetwatch.StateClosed,
			wantCause:  CauseRecovered,
			wantReason: "5 ok in a row while half-open",
		},
		{
			name:       "canceled and client errors decide nothing",
			events:     alternate("p", "x", 6, after(time.Second), time.Second, 200, canceled, clientErr),
			wantState:  fleetwatch.StateHalfOpen,
			wantReason: "open for 30s; probing with weight 0.05",
		},
		{
			name: "late events of the older generation neither reopen nor close it",
			events: concat(series("p", "x", fail, 5, at(30*time.Second), time.Second, 0),
				series("p", "x", ok, 6, at(31*time.Second), time.Second, 200)),
			wantState:  fleetwatch.StateHalfOpen,
			wantReason: "open for 30s; probing with weight 0.05",
			wantStale:  11,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
			openX(t, a)
			ev := a.Evaluate(halfAt)
			trs := transitionsOf(ev, "x")
			if len(trs) != 1 || trs[0].To != fleetwatch.StateHalfOpen || trs[0].Cause != CauseOpenElapsed {
				t.Fatalf("at open_until: transitions %+v, want one to half_open", trs)
			}
			if d := backendOf(t, a, "p", "x", halfAt); d.Weight != 0.05 || d.Requests != 0 {
				t.Fatalf("half-open: weight %v requests %d, want 0.05 and an empty window", d.Weight, d.Requests)
			}
			a.Observe(tt.events)
			now := after(10 * time.Second)
			ev = a.Evaluate(now)
			d := backendOf(t, a, "p", "x", now)
			// A closed backend's reason goes on with the gate and its weight.
			if d.State != tt.wantState || (d.Reason != tt.wantReason && !strings.HasPrefix(d.Reason, tt.wantReason+"; ")) {
				t.Errorf("state %s reason %q, want %s %q", d.State, d.Reason, tt.wantState, tt.wantReason)
			}
			trs = transitionsOf(ev, "x")
			switch {
			case tt.wantCause == "" && len(trs) > 0:
				t.Errorf("unexpected transitions %+v", trs)
			case tt.wantCause != "" && (len(trs) != 1 || trs[0].Cause != tt.wantCause || trs[0].Generation != 3):
				t.Errorf("transitions %+v, want one with cause %s, generation 3", trs, tt.wantCause)
			}
			var openFor time.Duration
			if d.OpenUntil != nil {
				openFor = d.OpenUntil.Sub(now)
			}
			if openFor != tt.wantOpenFor {
				t.Errorf("open for %v, want %v", openFor, tt.wantOpenFor)
			}
			if got := a.Stats().StaleGeneration; got != tt.wantStale {
				t.Errorf("stale generation events %d, want %d", got, tt.wantStale)
			}
		})
	}
}

// TestTripCount: open times grow while a backend keeps failing its probes
// (30s, 60s, 90s), keep growing when it trips again within a window of
// closing, and start again at 30s once it stayed closed for a whole window.
func TestTripCount(t *testing.T) {
	tests := []struct {
		name         string
		healthyAfter time.Duration // how long x stays closed before failing again
		want         []time.Duration
	}{
		{"flapping within the window continues the count", 10 * time.Second,
			[]time.Duration{time.Minute, 90 * time.Second, 2 * time.Minute}},
		{"a healthy window starts afresh", 31 * time.Second,
			[]time.Duration{time.Minute, 90 * time.Second, 30 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
			openX(t, a) // open 30s until t0+36s
			now := at(36 * time.Second)
			var openFor []time.Duration
			for range 2 {
				a.Evaluate(now) // half-open
				a.Observe([]fleetwatch.Event{event("p", "x", fail, now.Add(time.Second), 0)})
				now = now.Add(2 * time.Second)
				a.Evaluate(now)
				d := backendOf(t, a, "p", "x", now)
				openFor = append(openFor, d.OpenUntil.Sub(now))
				now = d.OpenUntil.Time
			}
			a.Evaluate(now) // half-open
			a.Observe(series("p", "x", ok, 5, now.Add(time.Second), time.Second, 200))
			now = now.Add(6 * time.Second)
			a.Evaluate(now)
			if d := backendOf(t, a, "p", "x", now); d.State != fleetwatch.StateClosed {
				t.Fatalf("x is %s, want closed", d.State)
			}
			for elapsed := time.Second; elapsed <= tt.healthyAfter; elapsed += time.Second {
				a.Evaluate(now.Add(elapsed))
			}
			now = now.Add(tt.healthyAfter)
			a.Observe(series("p", "x", fail, 5, now.Add(time.Second), time.Second, 0))
			now = now.Add(6 * time.Second)
			a.Evaluate(now)
			d := backendOf(t, a, "p", "x", now)
			if d.OpenUntil == nil {
				t.Fatalf("x is %s, want open", d.State)
			}
			openFor = append(openFor, d.OpenUntil.Sub(now))
			if diff := cmp.Diff(tt.want, openFor); diff != "" {
				t.Errorf("open times (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEjectionCap(t *testing.T) {
	tests := []struct {
		name     string
		backends int
		failing  int
		fraction float64
		wantOpen int
	}{
		{"a pool of one may open its backend", 1, 1, 0, 1},
		{"two failing of two: one opens", 2, 2, 0, 1},
		{"three failing of three: one opens", 3, 3, 0, 1},
		{"four failing of six: three open", 6, 4, 0, 3},
		{"two failing of six: both open", 6, 2, 0, 2},
		{"max_open_fraction 0.3 of ten: three open", 10, 6, 0.3, 3},
		{"max_open_fraction 1 opens everything", 4, 4, 1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: Settings{MaxOpenFraction: tt.fraction}})
			var evs []fleetwatch.Event
			for i := range tt.backends {
				id := string(rune('a' + i))
				if i < tt.failing {
					evs = append(evs, alternate("p", id, 30+i, t0, 10*time.Second, 200, fail, fail, ok)...)
				} else {
					evs = append(evs, series("p", id, ok, 30, t0, 10*time.Second, 200)...)
				}
			}
			a.Observe(evs)
			now := at(10 * time.Second)
			a.Evaluate(now)
			snap, _ := a.Snapshot("p", now)
			open, held := 0, 0
			f := tt.fraction
			if f == 0 {
				f = 0.5
			}
			for _, d := range snap.Backends {
				switch {
				case d.State == fleetwatch.StateOpen:
					open++
				case strings.HasPrefix(d.Reason, "ejection cap held: "):
					held++
					wantPrefix := fmt.Sprintf("ejection cap held: %d of %d already open (max_open_fraction %.2f); error rate ", tt.wantOpen, tt.backends, f)
					if !strings.HasPrefix(d.Reason, wantPrefix) {
						t.Errorf("held reason %q, want prefix %q", d.Reason, wantPrefix)
					}
					if d.State != fleetwatch.StateClosed || d.Weight != 0.05 {
						t.Errorf("held backend %s: %s weight %v, want closed 0.05", d.Backend, d.State, d.Weight)
					}
				}
			}
			if open != tt.wantOpen || held != tt.failing-tt.wantOpen {
				t.Errorf("open %d held %d, want %d and %d", open, held, tt.wantOpen, tt.failing-tt.wantOpen)
			}
			if got := a.Stats().HeldByCap; got != uint64(tt.failing-tt.wantOpen) {
				t.Errorf("HeldByCap = %d, want %d", got, tt.failing-tt.wantOpen)
			}
		})
	}
}

// TestEjectionCapReason checks the example sentence and that the
// worst backends are opened first.
func TestEjectionCapReason(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	var evs []fleetwatch.Event
	// a..c fail 2 in 3 (rate 0.67), d fails 3 in 5 (rate 0.6): d is held.
	for _, id := range []string{"a", "b", "c"} {
		evs = append(evs, alternate("p", id, 30, t0, 10*time.Second, 200, fail, fail, ok)...)
	}
	evs = append(evs, alternate("p", "d", 30, t0, 10*time.Second, 200, fail, ok, fail, ok, fail)...)
	evs = append(evs, healthy(200, "e", "f")...)
	a.Observe(evs)
	now := at(10 * time.Second)
	a.Evaluate(now)
	d := backendOf(t, a, "p", "d", now)
	want := "ejection cap held: 3 of 6 already open (max_open_fraction 0.50); error rate 0.60 >= 0.50 over 30 requests in 30s"
	if d.Reason != want || d.State != fleetwatch.StateClosed {
		t.Errorf("d: %s %q, want closed %q", d.State, d.Reason, want)
	}
	// When one opened backend recovers to half-open the cap frees a place.
	a.Observe(alternate("p", "d", 25, at(30*time.Second), 9*time.Second, 200, fail, ok, fail, ok, fail))
	ev := a.Evaluate(at(40 * time.Second)) // a..c half-open (their 30s +-10% are over)
	if d := backendOf(t, a, "p", "d", at(40*time.Second)); d.State != fleetwatch.StateOpen {
		t.Errorf("d after the cap freed: %s %q, transitions %+v", d.State, d.Reason, ev.Transitions)
	}
}

func TestMedianWithout(t *testing.T) {
	tests := []struct {
		name   string
		peers  peers // sorted
		own    float64
		want   float64
		wantOK bool
	}{
		{"no other backend", peers{200}, 200, 0, false},
		{"no backend", nil, 200, 0, false},
		{"one other", peers{200, 1200}, 1200, 200, true},
		{"two others: their mean", peers{100, 200, 300}, 200, 200, true},
		{"two others below", peers{100, 300, 1200}, 1200, 200, true},
		{"three others: the middle", peers{100, 200, 300, 1200}, 1200, 200, true},
		{"own is the lowest", peers{100, 200, 300, 400}, 100, 300, true},
		{"duplicates of own", peers{200, 200, 200}, 200, 200, true},
		{"own is not a peer (open)", peers{100, 200, 300}, 5000, 200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.peers.medianWithout(tt.own)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("medianWithout(%v) = %v %v, want %v %v", tt.own, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestObservedWeight: 429s lower the weight smoothly, reaching 0 only at the
// throttle rate, where the backend opens.
func TestObservedWeight(t *testing.T) {
	s := Settings{}.WithDefaults()
	tests := []struct {
		ok, throttled uint64
		want          float64
	}{
		{0, 0, 1},
		{100, 0, 1},
		{90, 10, 0.8},
		{75, 25, 0.5},
		{51, 49, 0.02},
		{50, 50, 0},
		{10, 90, 0},
	}
	for _, tt := range tests {
		v := windowStats{counted: tt.ok + tt.throttled}
		v.counts[ok], v.counts[throttled] = tt.ok, tt.throttled
		if got := observedWeight(&s, &v); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%d ok, %d throttled: weight %v, want %v", tt.ok, tt.throttled, got, tt.want)
		}
	}
}
