package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// scaleFrames runs the real analyzer on the scale benchmark's synthetic
// traffic (one pool of backends, 5 events per backend-second, for 10 s)
// and returns the pool's JSON snapshot, its key frame and the load frame
// of the next load beat, as serve would publish them.
func scaleFrames(tb testing.TB, backends int) (snap *fleetwatch.Snapshot, jsonSnap, key, loads []byte) {
	tb.Helper()
	a, err := analyzer.New(analyzer.Config{Seed: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tr := newTraffic(nil, 1, backends, 5, 1)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	now := t0
	var evs []fleetwatch.Event
	advance := func(d time.Duration) analyzer.Evaluation {
		var ev analyzer.Evaluation
		for end := now.Add(d); now.Before(end); now = now.Add(trafficTick) {
			evs = tr.tick(evs[:0], now)
			a.Observe(evs)
			e := a.Evaluate(now)
			if len(e.Snapshots)+len(e.Loads) > 0 {
				ev = e
			}
		}
		return ev
	}
	enc := feed.NewCompactEncoder(feed.CompactSettings{})
	ev := advance(10 * time.Second)
	for len(ev.Snapshots) == 0 {
		ev = advance(trafficTick)
	}
	snap = &ev.Snapshots[0]
	if jsonSnap, err = json.Marshal(snap); err != nil {
		tb.Fatal(err)
	}
	key, kind, _ := enc.Frame(nil, snap, now)
	if kind != feed.FrameKey {
		tb.Fatalf("first frame %q, want a key frame", kind)
	}
	for loads == nil {
		ev = advance(trafficTick)
		if len(ev.Loads) > 0 {
			loads, _ = enc.Loads(nil, &ev.Loads[0])
		}
	}
	return snap, jsonSnap, key, loads
}

// benchRouter is one router's pick core of the pool.
func benchRouter(tb testing.TB, backends int) *route.Pools {
	ps, err := route.NewPools(routePools([]int{0}, backends), nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return ps
}

// idsOf is the key frame's backend ids, in its order.
func idsOf(snap *fleetwatch.Snapshot) []string {
	ids := make([]string, len(snap.Backends))
	for i := range snap.Backends {
		ids[i] = snap.Backends[i].Backend
	}
	return ids
}

// BenchmarkScaleFrameApply measures what a router spends on one message
// of a 100-backend pool: decoding the JSON snapshot (the baseline, what a
// router following fw.decisions.<pool> decodes every message) and
// applying it to the picker, against decoding and applying a key frame
// and a load frame of the compact feed (fw.feed.<pool>), all of the same
// pool at the same moment.
func BenchmarkScaleFrameApply(b *testing.B) {
	const backends = 100
	snap, jsonSnap, key, loads := scaleFrames(b, backends)
	b.Logf("pool of %d backends: JSON snapshot %d B, key frame %d B, load frame %d B", backends, len(jsonSnap), len(key), len(loads))
	b.Run("json-decode-baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(jsonSnap)))
		for b.Loop() {
			var s fleetwatch.Snapshot
			if err := json.Unmarshal(jsonSnap, &s); err != nil || s.Validate() != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-decode+apply", func(b *testing.B) {
		ps := benchRouter(b, backends)
		b.ReportAllocs()
		b.SetBytes(int64(len(jsonSnap)))
		for i := 0; b.Loop(); i++ {
			var s fleetwatch.Snapshot
			if err := json.Unmarshal(jsonSnap, &s); err != nil || s.Validate() != nil {
				b.Fatal(err)
			}
			s.Seq += uint64(i) // newer each time, as on the feed
			ps.Apply(&s)
		}
	})
	b.Run("key-decode+apply", func(b *testing.B) {
		ps := benchRouter(b, backends)
		b.ReportAllocs()
		b.SetBytes(int64(len(key)))
		for i := 0; b.Loop(); i++ {
			s, _, err := feed.DecodeKey(key, snap.Pool)
			if err != nil {
				b.Fatal(err)
			}
			s.Seq += uint64(i)
			ps.Apply(s)
		}
	})
	b.Run("load-decode", func(b *testing.B) {
		var l feed.Loads
		b.ReportAllocs()
		b.SetBytes(int64(len(loads)))
		for b.Loop() {
			if err := feed.DecodeLoads(loads, &l); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("load-decode+apply", func(b *testing.B) {
		ps := benchRouter(b, backends)
		base, _, err := feed.DecodeKey(key, snap.Pool)
		if err != nil {
			b.Fatal(err)
		}
		ps.Apply(base)
		var l feed.Loads
		var u p2c.LoadUpdate
		picker := ps.Picker(snap.Pool)
		ids := idsOf(base)
		b.ReportAllocs()
		b.SetBytes(int64(len(loads)))
		for b.Loop() {
			if err := feed.DecodeLoads(loads, &l); err != nil {
				b.Fatal(err)
			}
			l.Update(&u, base.Epoch, base.Seq, ids) // what the watcher does (applyLoads)
			if !picker.UpdateLoads(&u) {
				b.Fatal("load update not applied")
			}
		}
	})
}

// TestScaleFramesApply checks the benchmark's frames: the load frame
// applies to the key frame's snapshot and lists part of the pool.
func TestScaleFramesApply(t *testing.T) {
	snap, _, key, loads := scaleFrames(t, 20)
	base, _, err := feed.DecodeKey(key, snap.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var l feed.Loads
	if err := feed.DecodeLoads(loads, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) == 0 || len(l.Entries) > len(snap.Backends) {
		t.Errorf("load frame lists %d of %d backends", len(l.Entries), len(snap.Backends))
	}
	ps := benchRouter(t, 20)
	ps.Apply(base)
	var u p2c.LoadUpdate
	l.Update(&u, base.Epoch, base.Seq, idsOf(base))
	if !ps.Picker(snap.Pool).UpdateLoads(&u) {
		t.Error("the load frame does not apply to its key frame's snapshot")
	}
}
