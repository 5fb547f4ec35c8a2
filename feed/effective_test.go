package feed

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

func TestEffective(t *testing.T) {
	halfOpen := fleetwatch.Backend{Backend: "h", State: fleetwatch.StateHalfOpen, Weight: 0.05, Reason: "probing", Drift: fleetwatch.DriftOK}
	throttled := fleetwatch.Backend{Backend: "t", State: fleetwatch.StateClosed, Weight: 0.4, Reason: "429 rate 0.3", Drift: fleetwatch.DriftOK,
		EWMATTFTMs: new(float64(300))}
	openLong := feedtest.Open("o1", t0.Add(time.Minute), "error rate 0.5")
	openShort := feedtest.Open("o2", t0.Add(6*time.Second), "error rate 0.9")
	openNoUntil := fleetwatch.Backend{Backend: "o3", State: fleetwatch.StateOpen, Reason: "drift quarantine"}
	snap := feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("a"), halfOpen, throttled, openLong, openShort, openNoUntil)

	closedBy := func(b fleetwatch.Backend) fleetwatch.Backend {
		b.State, b.Weight, b.OpenUntil, b.Reason = fleetwatch.StateClosed, 1, nil, StaleReason
		return b
	}
	tests := []struct {
		name string
		now  time.Time
		want []fleetwatch.Backend
	}{
		{"fresh: unchanged", t0.Add(time.Second), snap.Backends},
		{"at the ttl: still fresh", t0.Add(5 * time.Second), snap.Backends},
		{"stale: breakers still open stay open, the rest closed with weight 1", t0.Add(5*time.Second + time.Millisecond),
			[]fleetwatch.Backend{feedtest.Closed("a"), closedBy(halfOpen), closedBy(throttled), openLong, openShort, closedBy(openNoUntil)}},
		{"stale past one breaker's open_until", t0.Add(6 * time.Second),
			[]fleetwatch.Backend{feedtest.Closed("a"), closedBy(halfOpen), closedBy(throttled), openLong, closedBy(openShort), closedBy(openNoUntil)}},
		{"long stale: nothing open", t0.Add(time.Hour),
			[]fleetwatch.Backend{feedtest.Closed("a"), closedBy(halfOpen), closedBy(throttled), closedBy(openLong), closedBy(openShort), closedBy(openNoUntil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := *snap
			before.Backends = append([]fleetwatch.Backend(nil), snap.Backends...)
			got := Effective(snap, tt.now)
			if diff := cmp.Diff(tt.want, got.Backends); diff != "" {
				t.Errorf("backends (-want +got):\n%s", diff)
			}
			if got.Seq != snap.Seq || got.Epoch != snap.Epoch || got.Mode != snap.Mode {
				t.Errorf("snapshot fields changed: %+v", got)
			}
			if diff := cmp.Diff(&before, snap); diff != "" {
				t.Errorf("Effective modified its argument (-before +after):\n%s", diff)
			}
		})
	}
	if Effective(nil, t0) != nil {
		t.Error("Effective(nil) != nil")
	}
}
