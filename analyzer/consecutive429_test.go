package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// TestConsecutiveThrottled: a run of consecutive_throttled (5 by default)
// 429s with a retry hint opens a backend at once, once it has min_requests
// counted requests, unless its peers answer 429 too; an ok or a bare 429
// (no hint: a full queue) ends the run, bare 429s count only with
// throttled_run_counts: all, and a run the gate or the pool's hold kept
// from opening the backend must happen again.
func TestConsecutiveThrottled(t *testing.T) {
	now := at(12 * time.Second)
	run := func(n int, from time.Duration) []fleetwatch.Event {
		evs := series("p", "x", throttled, n, at(from), 500*time.Millisecond, 0)
		for i := range evs {
			evs[i].RetryAfterMs = 2000
		}
		return evs
	}
	bare := func(n int, from time.Duration) []fleetwatch.Event {
		return series("p", "x", throttled, n, at(from), 500*time.Millisecond, 0)
	}
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		state    fleetwatch.State
		reason   string
		held     string // the throttled_consecutive row's held_by, when it fires
	}{
		{name: "five 429s in a row open it", events: concat(healthy(200, "a", "b", "x"), run(5, 11*time.Second)),
			state: fleetwatch.StateOpen, reason: "5 consecutive 429s; retry-after 2s"},
		{name: "an ok ends the run", events: concat(healthy(200, "a", "b", "x"), run(4, 10*time.Second),
			series("p", "x", ok, 1, at(10900*time.Millisecond), 0, 200), run(4, 11*time.Second)),
			state: fleetwatch.StateClosed},
		{name: "bare 429s do not open it", events: concat(healthy(200, "a", "b", "x"), bare(5, 11*time.Second)),
			state: fleetwatch.StateClosed},
		{name: "a bare 429 ends the run", events: concat(healthy(200, "a", "b", "x"), run(4, 10*time.Second),
			bare(1, 10900*time.Millisecond), run(4, 11*time.Second)),
			state: fleetwatch.StateClosed},
		{name: "bare 429s count with throttled_run_counts all", settings: Settings{ThrottledRunCounts: RunCountsAll},
			events: concat(healthy(200, "a", "b", "x"), bare(5, 11*time.Second)),
			state:  fleetwatch.StateOpen, reason: "5 consecutive 429s"},
		{name: "off", settings: Settings{ConsecutiveThrottled: -1}, events: concat(healthy(200, "a", "b", "x"), run(5, 11*time.Second)),
			state: fleetwatch.StateClosed},
		{name: "held while a peer answers 429s too",
			events: concat(healthy(200, "a", "b", "x"), series("p", "a", throttled, 10, at(11*time.Second), 900*time.Millisecond, 0),
				series("p", "b", throttled, 10, at(11*time.Second), 900*time.Millisecond, 0), run(5, 11*time.Second)),
			state: fleetwatch.StateClosed, held: HeldByPoolThrottle},
		{name: "gated below min_requests", events: concat(healthy(200, "a", "b"), series("p", "x", ok, 10, t0, 5*time.Second, 200), run(5, 11*time.Second)),
			state: fleetwatch.StateClosed, held: HeldByGate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(tt.settings)})
			urgent := a.Observe(tt.events)
			e, found := a.Explain("p", "x", now)
			if !found {
				t.Fatal("x not found")
			}
			a.Evaluate(now)
			d := backendOf(t, a, "p", "x", now)
			if d.State != tt.state || tt.reason != "" && d.Reason != tt.reason {
				t.Fatalf("x is %s (%q), want %s (%q)", d.State, d.Reason, tt.state, tt.reason)
			}
			if tt.reason != "" && !urgent {
				t.Error("the run's fifth 429 did not ask for an evaluation now")
			}
			var r RuleCheck
			for _, c := range e.Rules {
				if c.Rule == RuleThrottledRun {
					r = c
				}
			}
			if r.Rule == "" {
				t.Fatalf("no %s row: %+v", RuleThrottledRun, e.Rules)
			}
			if tt.reason != "" && (r.TripReason != tt.reason || !r.Fires || r.HeldBy != "") {
				t.Errorf("the row that opened it: %+v", r)
			}
			if tt.held != "" && (!r.Fires || r.HeldBy != tt.held) {
				t.Errorf("row %+v, want it firing, held by %s", r, tt.held)
			}
			if tt.settings.ConsecutiveThrottled < 0 && !strings.HasPrefix(r.Detail, "off") {
				t.Errorf("row %+v, want it off", r)
			}
		})
	}

	// A run the gate held must happen again: the next 429 alone does not
	// open the backend once it has the requests.
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(200, "a", "b"), series("p", "x", ok, 10, t0, 5*time.Second, 200), run(5, 6*time.Second)))
	a.Evaluate(at(7 * time.Second))
	a.Observe(series("p", "x", ok, 15, at(7*time.Second), 2*time.Second, 200))
	a.Observe(run(1, 10*time.Second))
	a.Evaluate(at(11 * time.Second))
	if d := backendOf(t, a, "p", "x", at(11*time.Second)); d.State != fleetwatch.StateClosed {
		t.Errorf("x is %s (%s) on a run the gate held before", d.State, d.Reason)
	}
	a.Observe(run(5, 11*time.Second))
	a.Evaluate(at(12 * time.Second))
	if d := backendOf(t, a, "p", "x", at(12*time.Second)); d.State != fleetwatch.StateOpen {
		t.Errorf("x is %s (%s) after a new run of five", d.State, d.Reason)
	}
}
