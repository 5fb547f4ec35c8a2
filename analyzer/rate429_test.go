package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// TestBare429sLowerTheWeight: by default (throttle_rate_counts: hinted) a
// 429 rate past throttle_rate opens a backend only when its 429s carry a
// retry hint (a quota); bare 429s (a full queue) lower its weight instead,
// so that an overloaded fleet keeps every backend's capacity. With
// throttle_rate_counts: all, bare 429s open it as before.
func TestBare429sLowerTheWeight(t *testing.T) {
	evalAt := at(10 * time.Second)
	saturated := []fleetwatch.Outcome{throttled, ok, throttled, throttled, ok} // 60% 429s
	x := func(hintMs float64) []fleetwatch.Event {
		evs := alternate("p", "x", 40, t0, 10*time.Second, 200, saturated...)
		for i := range evs {
			if evs[i].Outcome == throttled {
				evs[i].RetryAfterMs = hintMs
			}
		}
		return evs
	}
	for _, tt := range []struct {
		name      string
		counts    string
		hintMs    float64
		wantOpen  bool
		maxWeight float64 // when closed
	}{
		{name: "bare 429s lower the weight", hintMs: 0, maxWeight: 0.1},
		{name: "hinted 429s open", hintMs: 1000, wantOpen: true},
		{name: "bare 429s open with all", counts: RunCountsAll, hintMs: 0, wantOpen: true},
		{name: "hinted 429s open with all", counts: RunCountsAll, hintMs: 1000, wantOpen: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := Settings{ThrottleRateCounts: tt.counts, ConsecutiveThrottled: -1} // the rate rule alone
			a := newAnalyzer(t, Config{Settings: noJitter(st)})
			a.Observe(concat(healthy(200, "a", "b", "c"), x(tt.hintMs)))
			a.Evaluate(evalAt)
			d := backendOf(t, a, "p", "x", evalAt)
			switch {
			case tt.wantOpen && d.State != fleetwatch.StateOpen:
				t.Errorf("x: %s (%q), want open by its 429 rate", d.State, d.Reason)
			case !tt.wantOpen && (d.State != fleetwatch.StateClosed || d.Weight > tt.maxWeight):
				t.Errorf("x: %s with weight %v (%q), want closed with weight <= %v", d.State, d.Weight, d.Reason, tt.maxWeight)
			case tt.wantOpen && tt.counts == "" && !strings.HasPrefix(d.Reason, "hinted 429 rate 0.60 >= 0.50"):
				t.Errorf("x's reason %q, want it to name the hinted 429 rate", d.Reason)
			}
		})
	}
}
