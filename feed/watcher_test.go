package feed

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// startWatcher runs a watcher until the test ends and waits until it has
// read the KV once.
func startWatcher(t *testing.T, nc *nats.Conn, s WatcherSettings) *Watcher {
	t.Helper()
	w, err := NewWatcher(nc, s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-w.Synced():
	case <-time.After(15 * time.Second):
		t.Fatal("watcher not synced")
	}
	// The subscription is registered before Synced closes; make sure the
	// server has it before the test publishes.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyEvery(t, 15*time.Second, 2*time.Millisecond, what, cond)
}

// seqOf is the (epoch, seq) a view holds, "" when none.
func seqOf(w *Watcher, pool string) (string, uint64) {
	v, ok := w.View(pool)
	if !ok {
		return "", 0
	}
	return v.Snapshot.Epoch, v.Snapshot.Seq
}

func TestWatcherReadsKVAtStart(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	script := feedtest.NewScript(t, feedtest.Connect(t, url), "")
	p1 := feedtest.Snapshot("p1", "e1", 4, t0, feedtest.Closed("a"), feedtest.Open("b", t0.Add(time.Minute), "error rate 0.5"))
	p2 := feedtest.Snapshot("meta-llama/Llama-3.1-70B-Instruct", "e1", 9, t0, feedtest.Closed("x"))
	script.Put(p1, p2) // before any watcher exists: only the KV has them

	tests := []struct {
		name  string
		pools []string
		want  map[string]*fleetwatch.Snapshot
	}{
		{"all pools", nil, map[string]*fleetwatch.Snapshot{"p1": p1, p2.Pool: p2}},
		{"one pool", []string{"p1"}, map[string]*fleetwatch.Snapshot{"p1": p1}},
		{"a pool with no snapshot yet", []string{"p3"}, map[string]*fleetwatch.Snapshot{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{Pools: tt.pools})
			got := map[string]*fleetwatch.Snapshot{}
			for _, pool := range []string{"p1", p2.Pool, "p3"} {
				if v, ok := w.View(pool); ok {
					got[pool] = v.Snapshot
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("views after start (-want +got):\n%s", diff)
			}
			var wantPools []string
			for _, pool := range []string{p2.Pool, "p1"} { // sorted
				if tt.want[pool] != nil {
					wantPools = append(wantPools, pool)
				}
			}
			if diff := cmp.Diff(wantPools, w.Pools(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Pools() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWatcherOrdering(t *testing.T) {
	snap := func(epoch string, seq uint64, at time.Duration) *fleetwatch.Snapshot {
		return feedtest.Snapshot("p", epoch, seq, t0.Add(at), feedtest.Closed("a"))
	}
	tests := []struct {
		name      string
		publish   []*fleetwatch.Snapshot
		wantEpoch string
		wantSeq   uint64
		applied   int
	}{
		{"in order", []*fleetwatch.Snapshot{snap("e1", 1, 0), snap("e1", 2, time.Second), snap("e1", 3, 2*time.Second)}, "e1", 3, 3},
		{"out of order", []*fleetwatch.Snapshot{snap("e1", 3, 2*time.Second), snap("e1", 2, time.Second)}, "e1", 3, 1},
		{"duplicate", []*fleetwatch.Snapshot{snap("e1", 5, 0), snap("e1", 5, 0)}, "e1", 5, 1},
		{"older seq with a later at", []*fleetwatch.Snapshot{snap("e1", 5, 0), snap("e1", 4, time.Minute)}, "e1", 5, 1},
		{"new epoch replaces", []*fleetwatch.Snapshot{snap("e1", 900, 0), snap("e2", 1, time.Second)}, "e2", 1, 2},
		{"new epoch at the same time replaces", []*fleetwatch.Snapshot{snap("e1", 900, 0), snap("e2", 1, 0)}, "e2", 1, 2},
		{"old epoch after a new one", []*fleetwatch.Snapshot{snap("e2", 1, time.Second), snap("e1", 901, 0)}, "e2", 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
			var mu sync.Mutex
			var updates []uint64
			w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{OnUpdate: func(s *fleetwatch.Snapshot) {
				mu.Lock()
				updates = append(updates, s.Seq)
				mu.Unlock()
			}})
			feedtest.NewScript(t, feedtest.Connect(t, url), "").PublishSubject(tt.publish...)
			waitFor(t, "every snapshot handled", func() bool {
				return w.applied.Get()+w.older.Get() == uint64(len(tt.publish))
			})
			epoch, seq := seqOf(w, "p")
			if epoch != tt.wantEpoch || seq != tt.wantSeq {
				t.Errorf("view holds (%s, %d), want (%s, %d)", epoch, seq, tt.wantEpoch, tt.wantSeq)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(updates) != tt.applied || int(w.applied.Get()) != tt.applied {
				t.Errorf("OnUpdate called %d times, applied %d; want %d", len(updates), w.applied.Get(), tt.applied)
			}
		})
	}
}

func TestWatcherStaleness(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{Now: clock})
	feedtest.NewScript(t, feedtest.Connect(t, url), "").PublishSubject(feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("a")))
	waitFor(t, "snapshot", func() bool { _, ok := w.View("p"); return ok })

	tests := []struct {
		at        time.Duration // since the snapshot's at; its TTL is 5 s
		wantStale bool
	}{
		{0, false},
		{5 * time.Second, false}, // at + ttl is still fresh
		{5*time.Second + time.Millisecond, true},
		{time.Hour, true},
	}
	for _, tt := range tests {
		mu.Lock()
		now = t0.Add(tt.at)
		mu.Unlock()
		v, _ := w.View("p")
		if v.Stale != tt.wantStale {
			t.Errorf("at +%v: Stale = %v, want %v", tt.at, v.Stale, tt.wantStale)
		}
		if !v.Received.Equal(t0) {
			t.Errorf("Received = %v, want the clock at arrival %v", v.Received, t0)
		}
	}
}

func TestWatcherIgnoresMalformed(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{})
	script := feedtest.NewScript(t, feedtest.Connect(t, url), "")
	good := feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("a"))
	mutate := func(f func(s *fleetwatch.Snapshot)) []byte {
		s := *good
		s.Backends = append([]fleetwatch.Backend(nil), good.Backends...)
		f(&s)
		data, _ := json.Marshal(&s)
		return data
	}
	bad := [][]byte{
		[]byte(`{"v":1,"pool":`),
		[]byte(`{"v":1,"pool":"p","seq":"one"}`),
		mutate(func(s *fleetwatch.Snapshot) { s.V = 2 }),
		mutate(func(s *fleetwatch.Snapshot) { s.Pool = "other" }),
		mutate(func(s *fleetwatch.Snapshot) { s.Epoch = "" }),
		mutate(func(s *fleetwatch.Snapshot) { s.Mode = "random" }),
		mutate(func(s *fleetwatch.Snapshot) { s.Backends[0].State = "broken" }),
		mutate(func(s *fleetwatch.Snapshot) { s.Backends[0].Weight = 1.5 }),
		mutate(func(s *fleetwatch.Snapshot) { s.Backends[0].Backend = "" }),
		mutate(func(s *fleetwatch.Snapshot) { s.Backends = append(s.Backends, s.Backends[0]) }), // duplicate
		mutate(func(s *fleetwatch.Snapshot) { s.Backends[0].Drift = "" }),
	}
	for _, data := range bad {
		script.PublishRaw("p", data)
	}
	script.PublishSubject(good)
	waitFor(t, "the good snapshot", func() bool { _, ok := w.View("p"); return ok })
	if got := w.malformed.Get(); got != uint64(len(bad)) {
		t.Errorf("malformed = %d, want %d", got, len(bad))
	}
	if v, _ := w.View("p"); v.Snapshot.Seq != 1 {
		t.Errorf("view seq %d, want 1", v.Snapshot.Seq)
	}
}

func TestDecodeSnapshotErrors(t *testing.T) {
	good := mustJSON(t, feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("a"), feedtest.Closed("b")))
	unsorted := mustJSON(t, feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("b"), feedtest.Closed("a")))
	tests := []struct {
		name    string
		data    []byte
		pool    string
		invalid bool // wraps fleetwatch.ErrInvalidSnapshot
	}{
		{"not an object", []byte(`[]`), "p", false},
		{"truncated", good[:len(good)/2], "p", false},
		{"another pool's snapshot", good, "q", false},
		{"backends not sorted", unsorted, "p", true},
		{"no version", []byte(`{"pool":"p","epoch":"e","at":"2026-12-02T07:50:00.000Z","mode":"balance","all_open":"shed"}`), "p", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeSnapshot(tt.data, tt.pool)
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error = %v, want ErrMalformed", err)
			}
			if got := errors.Is(err, fleetwatch.ErrInvalidSnapshot); got != tt.invalid {
				t.Errorf("errors.Is(%v, fleetwatch.ErrInvalidSnapshot) = %v, want %v", err, got, tt.invalid)
			}
		})
	}
	if _, err := decodeSnapshot(good, "p"); err != nil {
		t.Errorf("decodeSnapshot(good) = %v", err)
	}
}

func TestWatcherSurvivesServerRestart(t *testing.T) {
	store := t.TempDir()
	url, srv := feedtest.NewServer(t, feedtest.WithStoreDir(store))
	port := feedtest.Port(srv)

	// The watcher's client waits a second between reconnect attempts, so
	// that the KV is updated on the new server before it comes back: it
	// must then find the update by reading the KV, not on the subject.
	wnc := feedtest.Connect(t, url, nats.ReconnectWait(time.Second), nats.ReconnectJitter(0, 0))
	reconnected := wnc.StatusChanged(nats.CONNECTED)
	defer wnc.RemoveStatusListener(reconnected)
	w := startWatcher(t, wnc, WatcherSettings{Pools: []string{"p"}})

	first := feedtest.NewScript(t, feedtest.Connect(t, url), "")
	first.Publish(feedtest.Snapshot("p", "e1", 1, t0, feedtest.Closed("a")))
	waitFor(t, "seq 1", func() bool { _, seq := seqOf(w, "p"); return seq == 1 })

	srv.Shutdown()
	srv.WaitForShutdown()
	url2, _ := feedtest.NewServer(t, feedtest.WithStoreDir(store), feedtest.WithPort(port))
	if url2 != url {
		t.Fatalf("restarted server at %s, want %s", url2, url)
	}
	second := feedtest.NewScript(t, feedtest.Connect(t, url2), "")
	second.Put(feedtest.Snapshot("p", "e1", 2, t0.Add(time.Second), feedtest.Closed("a")))

	select {
	case <-reconnected:
	case <-time.After(15 * time.Second):
		t.Fatal("watcher's client did not reconnect")
	}
	waitFor(t, "seq 2 from the KV after the reconnect", func() bool { _, seq := seqOf(w, "p"); return seq == 2 })

	second.PublishSubject(feedtest.Snapshot("p", "e1", 3, t0.Add(2*time.Second), feedtest.Closed("a")))
	waitFor(t, "seq 3 on the re-established subscription", func() bool { _, seq := seqOf(w, "p"); return seq == 3 })
}

func TestWatcherLifecycle(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		w, err := NewWatcher(nc, WatcherSettings{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		return testkit.Lifecycle{Run: w.Run, Close: func() error { w.Close(); return nil }, Ready: w.Synced()}
	}, ErrRunning, ErrClosed)
}

func TestNewWatcherRejectsBadPool(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	if _, err := NewWatcher(feedtest.Connect(t, url), WatcherSettings{Pools: []string{"a..b"}}); !errors.Is(err, fleetwatch.ErrInvalidPool) {
		t.Errorf("error = %v, want ErrInvalidPool", err)
	}
}

func TestWatcherCountsDroppedSnapshots(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}) // slow-consumer notices expected
	release := make(chan struct{})
	w := startWatcher(t, nc, WatcherSettings{Buffer: 1, OnUpdate: func(*fleetwatch.Snapshot) { <-release }})

	script := feedtest.NewScript(t, feedtest.Connect(t, url), "")
	const n = 200
	for seq := uint64(1); seq <= n; seq++ {
		script.PublishRaw("p", mustJSON(t, feedtest.Snapshot("p", "e", seq, t0, feedtest.Closed("a"))))
	}
	// Once the publisher's connection is flushed, the server has every
	// snapshot; once the watcher's is, its client has handled them all
	// (queued or dropped).
	script.PublishSubject()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	close(release)
	// Every snapshot is applied, ignored as older, or counted as dropped
	// (the drop count is collected once a second).
	waitFor(t, "all snapshots accounted for", func() bool {
		return w.applied.Get()+w.older.Get()+w.dropped.Get() == n
	})
	if w.dropped.Get() == 0 {
		t.Error("no drops counted with a buffer of 1 and a blocked OnUpdate")
	}
	if _, seq := seqOf(w, "p"); seq == 0 {
		t.Error("no snapshot applied")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
