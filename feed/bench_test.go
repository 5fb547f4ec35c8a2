package feed

import (
	"encoding/binary"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// BenchmarkWatcherView measures the request path's read of the current
// snapshot, from many goroutines at once, while the watcher applies updates.
// The baseline, in the same run, is the obvious alternative: a map guarded
// by a sync.RWMutex.
func BenchmarkWatcherView(b *testing.B) {
	url, _ := feedtest.NewServer(b, feedtest.WithoutJetStream())
	now := t0
	w, err := NewWatcher(feedtest.Connect(b, url), WatcherSettings{Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	pools := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
	for _, p := range pools {
		w.apply(feedtest.Snapshot(p, "e", 1, t0, feedtest.Closed("a"), feedtest.Closed("b")))
	}

	b.Run("watcher", func(b *testing.B) {
		stop := make(chan struct{})
		var updater sync.WaitGroup
		updater.Go(func() { // the single writer, as Run is
			for seq := uint64(2); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				w.apply(feedtest.Snapshot(pools[seq%8], "e", seq, t0, feedtest.Closed("a")))
				time.Sleep(10 * time.Microsecond)
			}
		})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if v, ok := w.View(pools[i&7]); !ok || v.Snapshot == nil {
					b.Fatal("no view")
				}
				i++
			}
		})
		close(stop)
		updater.Wait()
	})

	b.Run("rwmutex-map-baseline", func(b *testing.B) {
		var mu sync.RWMutex
		m := map[string]*watched{}
		for _, p := range pools {
			m[p] = &watched{snap: feedtest.Snapshot(p, "e", 1, t0), received: t0}
		}
		stop := make(chan struct{})
		var updater sync.WaitGroup
		updater.Go(func() {
			for seq := uint64(2); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				e := &watched{snap: feedtest.Snapshot(pools[seq%8], "e", seq, t0), received: t0}
				mu.Lock()
				m[e.snap.Pool] = e
				mu.Unlock()
				time.Sleep(10 * time.Microsecond)
			}
		})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				mu.RLock()
				e := m[pools[i&7]]
				mu.RUnlock()
				v := View{Snapshot: e.snap, Received: e.received, Stale: Stale(e.snap, now)}
				if v.Snapshot == nil {
					b.Fatal("no view")
				}
				i++
			}
		})
		close(stop)
		updater.Wait()
	})
}

// BenchmarkEffective measures failing static on a stale 16-backend snapshot,
// against returning a fresh one unchanged.
func BenchmarkEffective(b *testing.B) {
	var backends []fleetwatch.Backend
	for i := 0; i < 16; i++ {
		backends = append(backends, feedtest.Closed(string(rune('a'+i))))
	}
	snap := feedtest.Snapshot("p", "e", 1, t0, backends...)
	for _, v := range []struct {
		name string
		now  time.Time
	}{{"fresh-baseline", t0}, {"stale", t0.Add(time.Minute)}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Effective(snap, v.now)
			}
		})
	}
}

// BenchmarkFollowPool is what a router spends following one 100-backend
// pool (analyzerPool100: every field serve publishes), per message: a
// load frame of the compact feed in which 60 loads moved, decoded and
// applied to a p2c picker (Watcher.handleFrame, p2c.Picker.UpdateLoads),
// against the same-run baseline of the JSON snapshot decoded and applied
// (decodeSnapshot, Watcher.apply, p2c.Picker.Update), which is what it did
// at every beat before the compact feed. Four load frames a second is a
// router's cost per pool-second (issue 33's goal: 0.1 ms, no allocation
// for a message that changes only loads).
func BenchmarkFollowPool(b *testing.B) {
	url, _ := feedtest.NewServer(b, feedtest.WithoutJetStream())
	t0 := time.Unix(1_700_000_000, 0)
	snap := analyzerPool100(t0)
	picker := p2c.New(p2c.Settings{})
	w, err := NewWatcher(feedtest.Connect(b, url), WatcherSettings{Compact: true,
		OnUpdate: picker.Update,
		OnLoads:  func(_ string, u *p2c.LoadUpdate) { picker.UpdateLoads(u) }})
	if err != nil {
		b.Fatal(err)
	}
	enc := NewCompactEncoder(CompactSettings{})
	key, _, _ := enc.Frame(nil, snap, t0)
	w.handleFrame(snap.Pool, "fw.feed."+snap.Pool, key)
	// Two load frames (numbers 2 and 3) that alternate 60 loads, each
	// taken as the next frame (the pool's last number set back).
	var frames [2][]byte
	for i := range frames {
		next := analyzerPool100(t0.Add(time.Duration(i+1) * 250 * time.Millisecond))
		for k := range 60 {
			next.Backends[k].Load.Running += float64(2 * (i + 1))
		}
		frames[i], _ = enc.Loads(nil, next)
	}
	var l Loads
	if err := DecodeLoads(frames[0], &l); err != nil || len(l.Entries) != 60 {
		b.Fatalf("%v, %d entries", err, len(l.Entries))
	}
	data, err := json.Marshal(snap)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("compact-load-frame", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frames[0])))
		cp, subject := w.compact[snap.Pool], "fw.feed."+snap.Pool
		for i := range b.N {
			cp.n = uint64(1 + i&1)
			w.handleFrame(snap.Pool, subject, frames[i&1])
		}
		b.StopTimer()
		if got := w.loadsApplied.Get(); got < uint64(b.N) {
			b.Fatalf("%d load frames applied of %d", got, b.N)
		}
	})
	// Key frames: one that repeats the decisions applied (KeyEvery's; 60
	// loads moved), and two whose backend 0's weight differs, taken in
	// turn (new decisions every time); each renumbered as the next frame
	// of the next snapshot.
	same := analyzerPool100(t0.Add(time.Second))
	for k := range 60 {
		same.Backends[k].Load.Running += 3
	}
	repeated := AppendKey(nil, same, 1)
	var changed [2][]byte
	for i := range changed {
		c := analyzerPool100(t0.Add(time.Second))
		c.Backends[0].Weight = 0.123 + 0.333*float64(i) // neither is pool100's
		changed[i] = AppendKey(nil, c, 1)
	}
	// Two key frames of the same decisions whose routers count differs,
	// taken in turn: a key frame whose header moved is applied as a new
	// snapshot, though its backends' candidates are the same.
	var counted [2][]byte
	for i := range counted {
		c := analyzerPool100(t0.Add(time.Second))
		c.Routers = 40 + i
		counted[i] = AppendKey(nil, c, 1)
	}
	var buf []byte
	turn := 0
	keyRun := func(b *testing.B, frame func(i int) []byte) {
		b.ReportAllocs()
		b.SetBytes(int64(len(repeated)))
		cp, subject := w.compact[snap.Pool], "fw.feed."+snap.Pool
		for i := range b.N {
			buf = renumberKey(b, buf[:0], frame(i), cp.n+1, cp.seq+1)
			w.handleFrame(snap.Pool, subject, buf)
		}
	}
	b.Run("compact-key-frame-repeated", func(b *testing.B) {
		before := w.refreshed.Get()
		keyRun(b, func(int) []byte { return repeated })
		if got := w.refreshed.Get() - before; got != uint64(b.N) {
			b.Fatalf("%d of %d key frames refreshed", got, b.N)
		}
	})
	b.Run("compact-key-frame-new-decisions", func(b *testing.B) {
		before := w.applied.Get()
		keyRun(b, func(int) []byte { turn++; return changed[turn&1] }) // across the runs of b.N
		if got := w.applied.Get() - before; got != uint64(b.N) {
			b.Fatalf("%d of %d key frames applied", got, b.N)
		}
	})
	b.Run("compact-key-frame-routers-moved", func(b *testing.B) {
		before := w.applied.Get()
		keyRun(b, func(int) []byte { turn++; return counted[turn&1] })
		if got := w.applied.Get() - before; got != uint64(b.N) {
			b.Fatalf("%d of %d key frames applied", got, b.N)
		}
	})
	b.Run("json-snapshot-baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for i := range b.N {
			s, err := decodeSnapshot(data, snap.Pool)
			if err != nil {
				b.Fatal(err)
			}
			s.Seq = uint64(100 + i)
			w.apply(s)
		}
	})
}

// renumberKey appends key frame key to dst with its frame number n and
// snapshot seq replaced.
func renumberKey(b *testing.B, dst, key []byte, n, seq uint64) []byte {
	r := &reader{b: key[4:]}
	r.uvarint("n")
	r.bytes(r.uvarint("epoch"), "epoch")
	seqAt := len(key) - len(r.b)
	r.uvarint("seq")
	rest := len(key) - len(r.b)
	if r.err != nil {
		b.Fatal(r.err)
	}
	_, nLen := binary.Uvarint(key[4:])
	dst = append(dst, key[:4]...)
	dst = binary.AppendUvarint(dst, n)
	dst = append(dst, key[4+nLen:seqAt]...)
	dst = binary.AppendUvarint(dst, seq)
	return append(dst, key[rest:]...)
}
