package feed

import (
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
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
