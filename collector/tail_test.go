package collector

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// The catch-up leaves out the capture's copies of events a collector had
// decided on already: the capture may store an event after the batch that
// republished it (it stores asynchronously; a stopping collector's last
// events under load), and replayed they were counted twice. Here the
// late copies are made on purpose: batches are stored in FW_OUTCOMES, and
// after them the capture stores the copies of their events (one sent with a
// ts, one without: stamped with its arrival when decided on), an identical
// second copy of one of them (two requests with the same outcome in the
// same millisecond: both are events) and a new event. The catch-up replays
// the second copy and the new event, nothing else.
func TestCatchUpLeavesOutWhatWasRepublished(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	first, stop := startCollector(t, nc, &recordingSink{}, Settings{Capture: true})
	publishFailures(t, nc, "live", 3) // decided on, republished, captured before the batch: not replayed
	waitFor(t, "the live events decided on", func() bool { return first.Stats().AcceptedTotal() == 3 })
	stop()
	waitRepublished(t, js, first)

	now := time.Now().UTC().Truncate(time.Millisecond)
	withTS := fleetwatch.Event{Pool: "p", Backend: "sent-ts", TS: now.Add(-20 * time.Millisecond), Status: 200, HasStatus: true}
	stamped := fleetwatch.Event{Pool: "p", Backend: "stamped", TS: now, Status: 503, HasStatus: true}
	// One batch as a collector republishes it, one as serve's does with
	// partitions (ha).
	publish(t, nc, "fw.accepted.p", string(fleetwatch.AppendEvent(nil, &withTS))+"\n")
	publish(t, nc, "fw.partition.3", string(fleetwatch.AppendEvent(nil, &stamped))+"\n")
	waitStored(t, js, "FW_OUTCOMES", first.Stats().StreamPublished+2)
	line := string(fleetwatch.AppendEvent(nil, &withTS))
	publish(t, nc, "fw.outcomes", line)                                                 // the late copy
	publish(t, nc, "fw.outcomes.edge", `{"pool":"p","backend":"stamped","status":503}`) // the late copy, sent without ts
	publish(t, nc, "fw.outcomes", line)                                                 // a second request, identical
	publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"new","status":200}`)
	waitStored(t, js, "FW_CAPTURE", 3+4)

	sink := &recordingSink{}
	c, _ := startCollector(t, nc, sink, Settings{Capture: true})
	st := c.Stats()
	got := map[string]int{}
	for _, ev := range sink.snapshot() {
		got[ev.Backend]++
	}
	want := map[string]int{"sent-ts": 1, "new": 1}
	if len(got) != len(want) || got["sent-ts"] != 1 || got["new"] != 1 {
		t.Errorf("replayed %v, want %v: the copies of what was decided on left out, the identical second request and the new event replayed", got, want)
	}
	if st.CaptureDeduplicated != 2 || st.CaptureReplayed != 2 {
		t.Errorf("%d deduplicated and %d replayed messages, want 2 and 2", st.CaptureDeduplicated, st.CaptureReplayed)
	}
	if got := metricValue(t, c, "fleetwatch_capture_deduplicated_events_total"); got != 2 {
		t.Errorf("fleetwatch_capture_deduplicated_events_total = %v, want 2", got)
	}
}

// A replay that did not read every message from its start up to the last
// batch (a work queue deletes what was acknowledged; a capture's bounds
// discard its head) cannot take every republished event's copy off: an
// event sent without ts is not matched then (a legitimate one identical to
// one whose copy is missing would be left out), one sent with a ts still
// is (the same event to the millisecond).
func TestRepublishedMatchesOnlyWithEveryCopy(t *testing.T) {
	last := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	ev := fleetwatch.Event{Pool: "p", Backend: "a", Status: 200, HasStatus: true}
	copyOf := string(fleetwatch.AppendEvent(nil, &ev)) + "\n" // sent without ts
	withTS := fleetwatch.Event{Pool: "p", Backend: "c", Status: 200, HasStatus: true, TS: last.Add(-time.Second)}
	other := `{"pool":"p","backend":"b","status":200}` + "\n"
	for _, tt := range []struct {
		name    string
		reads   map[uint64]string // read up to the last batch, by sequence
		stamped int               // of the copy sent without ts after it, left out
	}{
		{"every sequence read", map[uint64]string{10: copyOf, 11: other, 12: copyOf}, 1},
		{"a hole: one deleted", map[uint64]string{10: copyOf, 12: copyOf}, 0},
		{"the head deleted", map[uint64]string{11: copyOf, 12: copyOf}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &republished{last: last, since: last.Add(-2 * tailSpan), from: 10, byKey: map[string][]time.Time{}}
			for i := range 3 { // three republished, their arrival stamped
				e := ev
				e.TS = last.Add(-time.Duration(3-i) * time.Second)
				r.add(&e)
			}
			r.add(&withTS)
			for seq := uint64(10); seq <= 12; seq++ {
				if line, ok := tt.reads[seq]; ok {
					if _, n := r.filter([]byte(line), last.Add(-time.Duration(13-seq)*time.Second), seq); n != -1 {
						t.Fatalf("a message stored before the last batch: %d, want -1", n)
					}
				}
			}
			data, n := r.filter([]byte(copyOf), last.Add(time.Millisecond), 13)
			if n != tt.stamped || (n == 0) != (string(data) == copyOf) {
				t.Errorf("the copy sent without ts: %d left out (%q), want %d", n, data, tt.stamped)
			}
			line := string(fleetwatch.AppendEvent(nil, &withTS)) + "\n"
			if data, n := r.filter([]byte(line), last.Add(2*time.Millisecond), 14); n != 1 || len(data) != 0 {
				t.Errorf("the copy sent with a ts: %d left out (%q), want it left out", n, data)
			}
		})
	}
}
