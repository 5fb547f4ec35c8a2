package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// TestRefusingBackendOpens: ThrottleRefuseRate opens a backend whose newest
// quarter of the window is (nearly) all 429s, bare ones included, while its
// peers serve; under the defaults it is the only rule that opens on bare
// 429s (throttle_rate_counts: hinted), so without it such a backend is
// only down-weighted. It needs recent_min_requests in the quarter, the
// rate at the threshold, and no peer answering 429s to a twentieth or more
// of its requests over the quarter (the strict hold).
// Each case also reads the rule's row of Explain.
func TestRefusingBackendOpens(t *testing.T) {
	evalAt := at(10 * time.Second)
	// x served 40 requests in [-20s, -5s), then answers 429s (the
	// newest quarter is [4s, 10s]).
	served := series("p", "x", ok, 40, at(-20*time.Second), 15*time.Second, 200)
	recent := func(b string, n int, outcomes ...fleetwatch.Outcome) []fleetwatch.Event {
		return alternate("p", b, n, at(4*time.Second), 6*time.Second, 200, outcomes...)
	}
	// Peers answering 429s too: 14 of their 35 requests in the quarter.
	peersThrottling := concat(recent("a", 20, throttled, throttled, ok), recent("b", 20, throttled, throttled, ok),
		recent("c", 20, throttled, throttled, ok))
	const opened = "429 rate 1.00 >= 0.90 over the newest 7s (20 requests), bare 429s included"
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		reason   string // "" = stays closed
		fires    bool   // the row fires (held or not)
		held     string
	}{
		{name: "every request of the quarter refused with a bare 429 opens",
			events: concat(healthy(200, "a", "b", "c"), served, recent("x", 20, throttled)),
			reason: opened, fires: true},
		{name: "five in six refused stays closed (below 0.9)",
			events: concat(healthy(200, "a", "b", "c"), served, recent("x", 24, throttled, throttled, throttled, throttled, throttled, ok))},
		{name: "the quarter needs recent_min_requests",
			events: concat(healthy(200, "a", "b", "c"), served, recent("x", 9, throttled))},
		{name: "peers answering 429s too hold it: a saturated pool",
			events: concat(healthy(200, "a", "b", "c"), peersThrottling, served, recent("x", 20, throttled)),
			fires:  true, held: HeldByPoolThrottle},
		{name: "one peer answering 429s to a tenth of its requests holds it",
			events: concat(healthy(200, "a", "b", "c"), recent("a", 20, throttled, ok, ok, ok, ok, ok), served, recent("x", 20, throttled)),
			fires:  true, held: HeldByPoolThrottle},
		{name: "a lower threshold opens on fewer",
			settings: Settings{ThrottleRefuseRate: 0.8},
			events:   concat(healthy(200, "a", "b", "c"), served, recent("x", 24, throttled, throttled, throttled, throttled, throttled, ok)),
			reason:   "429 rate 0.83 >= 0.80 over the newest 7s (24 requests), bare 429s included", fires: true},
		{name: "a negative throttle_refuse_rate turns it off",
			settings: Settings{ThrottleRefuseRate: -1},
			events:   concat(healthy(200, "a", "b", "c"), served, recent("x", 20, throttled))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(tt.settings)})
			a.Observe(tt.events)
			e, found := a.Explain("p", "x", evalAt)
			if !found {
				t.Fatal("x not found")
			}
			ev := a.Evaluate(evalAt)
			d := backendOf(t, a, "p", "x", evalAt)
			var reason string
			if trs := transitionsOf(ev, "x"); len(trs) > 0 {
				reason = trs[0].Reason
			}
			if tt.reason != "" && (d.State != fleetwatch.StateOpen || reason != tt.reason) {
				t.Errorf("x is %s (%q), want open (%q)", d.State, reason, tt.reason)
			}
			if tt.reason == "" && (d.State != fleetwatch.StateClosed || d.Weight >= 1) {
				t.Errorf("x is %s at weight %v (%q), want closed and down-weighted", d.State, d.Weight, reason)
			}
			var r RuleCheck
			for _, c := range e.Rules {
				if c.Rule == RuleThrottledRefuse {
					r = c
				}
			}
			if r.Rule == "" {
				t.Fatalf("no %s row: %+v", RuleThrottledRefuse, e.Rules)
			}
			if r.Fires != tt.fires || r.HeldBy != tt.held || r.TripReason != tt.reason {
				t.Errorf("row %+v, want fires %v, held by %q, trip reason %q", r, tt.fires, tt.held, tt.reason)
			}
			if tt.settings.ThrottleRefuseRate < 0 && !strings.HasPrefix(r.Detail, "off") {
				t.Errorf("row %+v, want it off", r)
			}
		})
	}
}

// TestRefusingBackendReopens: opened by the refusal rule, a backend that
// still answers 429 when its open time is over reopens on the first one
// (the half-open trickle ends there), for twice the open time; one that
// serves again closes after half_open_successes ok answers.
func TestRefusingBackendReopens(t *testing.T) {
	s := noJitter(Settings{OpenBase: 10 * time.Second, OpenMax: time.Minute})
	for _, tt := range []struct {
		name  string
		probe []fleetwatch.Outcome
		want  fleetwatch.State
	}{
		{"still refusing", []fleetwatch.Outcome{throttled}, fleetwatch.StateOpen},
		{"serving again", []fleetwatch.Outcome{ok, ok, ok, ok, ok}, fleetwatch.StateClosed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: s})
			a.Observe(concat(healthy(200, "a", "b", "c"),
				series("p", "x", ok, 40, at(-20*time.Second), 15*time.Second, 200),
				series("p", "x", throttled, 20, at(4*time.Second), 6*time.Second, 200)))
			a.Evaluate(at(10 * time.Second))
			if d := backendOf(t, a, "p", "x", at(10*time.Second)); d.State != fleetwatch.StateOpen {
				t.Fatalf("x is %s (%s), want open", d.State, d.Reason)
			}
			half := at(21 * time.Second)
			a.Evaluate(half)
			if d := backendOf(t, a, "p", "x", half); d.State != fleetwatch.StateHalfOpen || d.Weight != s.WithDefaults().HalfOpenWeight {
				t.Fatalf("after the open time x is %s at weight %v, want half_open at the trickle", d.State, d.Weight)
			}
			a.Observe(alternate("p", "x", len(tt.probe), half, time.Second, 200, tt.probe...))
			next := half.Add(2 * time.Second)
			a.Evaluate(next)
			d := backendOf(t, a, "p", "x", next)
			if diff := cmp.Diff(tt.want, d.State); diff != "" {
				t.Fatalf("x after its probe (-want +got):\n%s (%s)", diff, d.Reason)
			}
			if tt.want == fleetwatch.StateOpen && d.OpenUntil != nil && d.OpenUntil.Sub(next) < 19*time.Second {
				t.Errorf("reopened until %v, %v from now: want twice the open time (the second trip in a row)", d.OpenUntil, d.OpenUntil.Sub(next))
			}
		})
	}
}
