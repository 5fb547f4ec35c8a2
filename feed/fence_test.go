package feed

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// fenced is a snapshot of pool p by an owner whose lease has revision fence.
func fenced(epoch string, seq, fence uint64, at time.Time, until time.Time) *fleetwatch.Snapshot {
	s := feedtest.Snapshot("p", epoch, seq, at, feedtest.Open("a", until, "error rate 0.5"))
	s.Fence = fence
	return s
}

// TestWatcherDropsAStaleOwnersSnapshot: after a snapshot of the new owner
// (fence 9), the old owner's snapshots (fence 4) are dropped even when they
// are later, on the subject as in the KV, and counted as fenced; the new
// owner's next ones are applied.
func TestWatcherDropsAStaleOwnersSnapshot(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{})
	script := feedtest.NewScript(t, feedtest.Connect(t, url), "")

	script.PublishSubject(fenced("old", 5, 4, t0, t0.Add(time.Minute)))
	script.PublishSubject(fenced("new", 1, 9, t0.Add(time.Second), t0.Add(2*time.Minute)))
	waitFor(t, "the new owner's snapshot", func() bool { e, _ := seqOf(w, "p"); return e == "new" })

	// The stale owner goes on: a later at, a higher seq in its epoch.
	script.PublishSubject(fenced("old", 6, 4, t0.Add(time.Hour), t0.Add(time.Hour)))
	waitFor(t, "the stale snapshot handled", func() bool { return w.fenced.Get() == 1 })
	if e, seq := seqOf(w, "p"); e != "new" || seq != 1 {
		t.Errorf("after the stale owner's snapshot the view holds (%s, %d), want (new, 1)", e, seq)
	}
	// And so is every later one of the stale owner.
	script.PublishSubject(fenced("old", 7, 4, t0.Add(2*time.Hour), t0.Add(time.Hour)))
	waitFor(t, "the second stale snapshot handled", func() bool { return w.fenced.Get() == 2 })

	script.PublishSubject(fenced("new", 2, 9, t0.Add(2*time.Second), t0.Add(2*time.Minute)))
	waitFor(t, "the new owner's next snapshot", func() bool { _, seq := seqOf(w, "p"); return seq == 2 })
	if got := w.applied.Get(); got != 3 {
		t.Errorf("applied = %d, want 3 (old 5, new 1, new 2)", got)
	}
}

// TestPublisherKVPutIsFenced: a publisher with a lower fence does not
// overwrite the KV value of one with a higher fence; an equal or higher
// fence does, and unfenced snapshots are put as before.
func TestPublisherKVPutIsFenced(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	every := PublisherSettings{KVEvery: -1} // every snapshot is put
	newOwner, err := NewPublisher(t.Context(), nc, every)
	if err != nil {
		t.Fatal(err)
	}
	stale, err := NewPublisher(t.Context(), feedtest.Connect(t, url), every)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	stored := func() (string, uint64) {
		t.Helper()
		e, err := kv.Get(t.Context(), "p")
		if err != nil {
			t.Fatal(err)
		}
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			t.Fatal(err)
		}
		return s.Epoch, s.Seq
	}
	put := func(p *Publisher, s *fleetwatch.Snapshot) {
		t.Helper()
		if err := p.Publish(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		if err := p.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	put(stale, fenced("old", 5, 4, t0, t0.Add(time.Minute)))
	put(newOwner, fenced("new", 1, 9, t0.Add(time.Second), t0.Add(2*time.Minute)))
	put(stale, fenced("old", 6, 4, t0.Add(time.Hour), t0.Add(time.Hour)))
	if e, seq := stored(); e != "new" || seq != 1 {
		t.Errorf("KV holds (%s, %d) after the stale owner's put, want (new, 1)", e, seq)
	}
	if got := stale.kvFenced.Get(); got != 2 {
		t.Errorf("stale publisher's fenced puts = %d, want 2 (the snapshot and its key frame)", got)
	}
	feedKV, err := js.KeyValue(t.Context(), "fw_feed")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := feedKV.Get(t.Context(), "p"); err != nil {
		t.Error(err)
	} else if key, _, err := DecodeKey(e.Value(), "p"); err != nil || key.Epoch != "new" {
		t.Errorf("fw_feed holds %+v (%v), want the new owner's key frame", key, err)
	}
	put(newOwner, fenced("new", 2, 9, t0.Add(2*time.Second), t0.Add(2*time.Minute)))
	if e, seq := stored(); e != "new" || seq != 2 {
		t.Errorf("KV holds (%s, %d), want (new, 2)", e, seq)
	}
	unfenced := fenced("single", 1, 0, t0.Add(3*time.Second), t0.Add(2*time.Minute))
	put(stale, unfenced)
	if e, _ := stored(); e != "single" {
		t.Errorf("KV holds epoch %s after an unfenced put, want single", e)
	}
}
