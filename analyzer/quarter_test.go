package analyzer

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

// TestRecentQuarterTrip: the failure-rate and 429 rules trip on the newest
// quarter of the window (7 of 30 buckets) alone when it holds
// RecentMinRequests counted requests past the threshold and the whole
// window (for 429s: the newest half of it) is at least half the threshold.
func TestRecentQuarterTrip(t *testing.T) {
	evalAt := at(10 * time.Second)
	// history: x was healthy for 15 s; the newest quarter is [4s, 10s].
	history := func(n int) []fleetwatch.Event {
		return series("p", "x", ok, n, at(-15*time.Second), 15*time.Second, 200)
	}
	recentHistory := func(n int) []fleetwatch.Event {
		return series("p", "x", ok, n, at(-3*time.Second), 3*time.Second, 200)
	}
	oldHistory := func(n int) []fleetwatch.Event {
		return series("p", "x", ok, n, at(-20*time.Second), 15*time.Second, 200)
	}
	recent := func(n int, outcomes ...fleetwatch.Outcome) []fleetwatch.Event {
		return alternate("p", "x", n, at(4*time.Second), 6*time.Second, 200, outcomes...)
	}
	type want struct {
		State  fleetwatch.State
		Cause  string
		Reason string
	}
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		want     want
	}{
		{
			name:   "a quarter of 429s opens before the window fills",
			events: concat(healthy(200, "a", "b"), history(40), recent(20, throttled)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 1.00 >= 0.50 over the newest 7s (20 requests; 0.33 over 30s)"},
		},
		{
			name:   "a quarter of failures opens before the window fills",
			events: concat(healthy(200, "a", "b"), history(40), recent(20, fail, fail, fail, fail, ok)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseFailureRate,
				Reason: "error rate 0.80 >= 0.50 over the newest 7s (20 requests; 0.27 over 30s)"},
		},
		{
			name:   "the quarter needs recent_min_requests",
			events: concat(healthy(200, "a", "b"), history(20), recent(9, throttled)),
			want:   want{State: fleetwatch.StateClosed},
		},
		{
			name:     "a smaller recent_min_requests trips on fewer",
			settings: Settings{RecentMinRequests: 5},
			events:   concat(healthy(200, "a", "b"), history(20), recent(9, throttled)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 1.00 >= 0.50 over the newest 7s (9 requests; 0.31 over 30s)"},
		},
		{
			name:   "the whole window must be at least half the threshold",
			events: concat(healthy(200, "a", "b"), history(80), recent(20, fail, fail, fail, fail, ok)),
			want:   want{State: fleetwatch.StateClosed},
		},
		{
			// 70 ok in [-3s, 0s) and 20 429s: 0.22 over the newest 14s.
			name:   "for 429s the newest half must be at least half the threshold",
			events: concat(healthy(200, "a", "b"), recentHistory(70), recent(20, throttled)),
			want:   want{State: fleetwatch.StateClosed},
		},
		{
			// 200 ok in [-20s, -5s): 0.09 over the window, 1.00 over the
			// newest 14s. The earlier traffic no longer delays the trip.
			name:   "for 429s the newest half stands in for the whole window",
			events: concat(healthy(200, "a", "b"), oldHistory(200), recent(20, throttled)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 1.00 >= 0.50 over the newest 7s (20 requests; 1.00 over the newest 14s)"},
		},
		{
			name:   "a quarter below the threshold does not trip",
			events: concat(healthy(200, "a", "b"), history(20), recent(20, throttled, ok, ok)),
			want:   want{State: fleetwatch.StateClosed},
		},
		{
			name:     "a negative recent_min_requests turns the quarter trip off",
			settings: Settings{RecentMinRequests: -1},
			events:   concat(healthy(200, "a", "b"), history(40), recent(20, throttled)),
			want:     want{State: fleetwatch.StateClosed},
		},
		{
			name:   "the window trip keeps its reason",
			events: concat(healthy(200, "a", "b"), history(10), recent(20, throttled)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseThrottled,
				Reason: "429 rate 0.67 >= 0.50 over 30 requests"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.settings
			if st.ConsecutiveThrottled == 0 {
				st.ConsecutiveThrottled = -1 // the rate rules alone: a run of 429s opens at 5 (consecutive429_test.go)
			}
			if st.ThrottleRefuseRate == 0 {
				st.ThrottleRefuseRate = -1 // and a quarter of 429s alone opens at 0.9 (refuse_test.go)
			}
			a := newAnalyzer(t, Config{Settings: noJitter(bareRate(st))})
			a.Observe(tt.events)
			ev := a.Evaluate(evalAt)
			d := backendOf(t, a, "p", "x", evalAt)
			got := want{State: d.State}
			if trs := transitionsOf(ev, "x"); len(trs) > 0 {
				got.Cause, got.Reason = trs[0].Cause, trs[0].Reason
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestPoolThrottleHold: a 429 trip is held while the median recent 429 rate
// of the backend's peers is at least PoolThrottleHold (the pool is
// saturated), and not otherwise.
func TestPoolThrottleHold(t *testing.T) {
	evalAt := at(10 * time.Second)
	throttling := func(b string, outcomes ...fleetwatch.Outcome) []fleetwatch.Event {
		return alternate("p", b, 40, t0, 10*time.Second, 200, outcomes...)
	}
	saturated := []fleetwatch.Outcome{throttled, ok, throttled, throttled, ok} // 60% 429s
	light := []fleetwatch.Outcome{throttled, ok, ok, ok, ok}                   // 20% 429s
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		wantOpen []string
	}{
		{
			name:     "one backend throttling opens",
			events:   concat(healthy(200, "a", "b", "c"), throttling("x", saturated...)),
			wantOpen: []string{"x"},
		},
		{
			name: "a pool throttling together holds every trip",
			events: concat(throttling("a", saturated...), throttling("b", saturated...),
				throttling("c", saturated...), throttling("x", saturated...)),
			wantOpen: nil,
		},
		{
			name: "peers below the hold do not hold",
			events: concat(throttling("a", light...), throttling("b", light...),
				throttling("c", light...), throttling("x", saturated...)),
			wantOpen: []string{"x"},
		},
		{
			name:     "a lower hold holds on lighter peers",
			settings: Settings{PoolThrottleHold: 0.15},
			events: concat(throttling("a", light...), throttling("b", light...),
				throttling("c", light...), throttling("x", saturated...)),
			wantOpen: nil,
		},
		{
			name:     "a negative hold turns it off (the ejection cap still applies)",
			settings: Settings{PoolThrottleHold: -1},
			events: concat(throttling("a", saturated...), throttling("b", saturated...),
				throttling("c", saturated...), throttling("x", saturated...)),
			wantOpen: []string{"a", "b"},
		},
		{
			name: "half the pool throttling is not a saturated pool",
			events: concat(healthy(200, "a", "b"), throttling("c", saturated...),
				throttling("x", saturated...)),
			wantOpen: []string{"c", "x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.settings
			if st.ConsecutiveThrottled == 0 {
				st.ConsecutiveThrottled = -1 // the rate rules alone: a run of 429s opens at 5 (consecutive429_test.go)
			}
			if st.ThrottleRefuseRate == 0 {
				st.ThrottleRefuseRate = -1 // and a quarter of 429s alone opens at 0.9 (refuse_test.go)
			}
			a := newAnalyzer(t, Config{Settings: noJitter(bareRate(st))})
			a.Observe(tt.events)
			ev := a.Evaluate(evalAt)
			var got []string
			for _, tr := range ev.Transitions {
				if tr.To == fleetwatch.StateOpen {
					got = append(got, tr.Backend)
				}
			}
			if diff := cmp.Diff(tt.wantOpen, got); diff != "" {
				t.Errorf("opened (-want +got):\n%s", diff)
			}
		})
	}
}
