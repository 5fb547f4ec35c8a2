package serve

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
)

// TestTakeoverReplayKeepsTheSnapshotsTrip: a takeover replays, in one
// batch, the failures that tripped a breaker and some events after the
// trip. The owner tripped it on the fifth failure and stored that
// snapshot; the new owner must publish the breaker exactly as routers saw
// it (same since, same open_until), not a trip dated at the batch's end.
func TestTakeoverReplayKeepsTheSnapshotsTrip(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 23, 0, 9, 0, time.UTC)
	var events []fleetwatch.Event
	for i := range 10 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		events = append(events,
			fleetwatch.Event{Pool: "p", Backend: "bad", TS: at, Status: 500, HasStatus: true, Outcome: fleetwatch.OutcomeError},
			fleetwatch.Event{Pool: "p", Backend: "good", TS: at, Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, TTFTMs: 100, HasTTFT: true})
	}
	newAnalyzer := func() *analyzer.Analyzer {
		a, err := analyzer.New(config.Default().AnalyzerSettings(1))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	// The owner, live: every event evaluated as it arrives.
	live := newAnalyzer()
	var snap fleetwatch.Snapshot
	for _, ev := range events {
		live.Observe([]fleetwatch.Event{ev})
		live.Evaluate(ev.TS)
		if s, ok := live.Snapshot("p", ev.TS); ok && s.Find("bad") != nil && s.Find("bad").State == fleetwatch.StateOpen {
			snap = s // the snapshot of the trip, as stored in fw_decisions
			break
		}
	}
	want := snap.Find("bad")
	if want == nil || want.OpenUntil == nil {
		t.Fatalf("the owner did not open bad on %d failures: %+v", len(events)/2, snap)
	}

	// The new owner: the stream replayed in one batch, then the snapshot
	// laid over it.
	scratch := newAnalyzer()
	newReplayer(scratch, func(string) bool { return true }, []fleetwatch.Snapshot{snap}).batch(events)
	now := events[len(events)-1].TS.Add(time.Millisecond)
	scratch.Restore([]fleetwatch.Snapshot{snap}, now)
	got, _ := scratch.Snapshot("p", now)
	b := got.Find("bad")
	if b == nil || b.State != fleetwatch.StateOpen || b.OpenUntil == nil || !b.OpenUntil.Equal(want.OpenUntil.Time) || !b.Since.Equal(want.Since.Time) {
		t.Errorf("after the takeover bad is %+v, want open since %v until %v as the owner published", b, want.Since, want.OpenUntil)
	}
}
