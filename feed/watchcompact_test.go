package feed

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// recorder keeps what a compact watcher hands its hooks.
type recorder struct {
	mu    sync.Mutex
	snaps []*fleetwatch.Snapshot
	loads []p2c.LoadUpdate // copies
}

func (r *recorder) settings(s WatcherSettings) WatcherSettings {
	s.Compact = true
	s.OnUpdate = func(snap *fleetwatch.Snapshot) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.snaps = append(r.snaps, snap)
	}
	s.OnLoads = func(pool string, u *p2c.LoadUpdate) {
		r.mu.Lock()
		defer r.mu.Unlock()
		c := *u
		c.Backends = slices.Clone(u.Backends)
		r.loads = append(r.loads, c)
	}
	return s
}

func (r *recorder) counts() (snaps, loads int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.snaps), len(r.loads)
}

func (r *recorder) lastLoads() p2c.LoadUpdate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loads[len(r.loads)-1]
}

// loaded is a 3-backend pool at t0+d with a's load running.
func loaded(seq uint64, d time.Duration, running float64) *fleetwatch.Snapshot {
	s := feedtest.Snapshot("p", "e1", seq, t0.Add(d), feedtest.Closed("a"), feedtest.Closed("b"), feedtest.Closed("c"))
	s.Backends[0].Load = &fleetwatch.Load{Running: running, AgeMs: 10, Source: fleetwatch.LoadSourceMetrics}
	return s
}

func publish(t *testing.T, p *Publisher, s *fleetwatch.Snapshot) {
	t.Helper()
	if err := p.Publish(t.Context(), s); err != nil {
		t.Fatal(err)
	}
}

// noConsumers fails when the server holds any JetStream consumer: a
// router joins by direct gets.
func noConsumers(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, _ := jetstream.New(nc)
	info, err := js.AccountInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Consumers != 0 {
		t.Errorf("%d JetStream consumers on the server, want none", info.Consumers)
	}
}

// A compact watcher that starts after the publisher reads the key frame
// from the fw_feed bucket (no consumer), follows the compact feed alone,
// and hands the load frames to OnLoads with the backends by id: the loads
// that moved, based on the key frame applied.
func TestCompactWatcherFollowsTheFeed(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	pub, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, loaded(1, 0, 3))
	if err := pub.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var rec recorder
	wnc := feedtest.Connect(t, url)
	w := startWatcher(t, wnc, rec.settings(WatcherSettings{}))
	if !w.Compact() {
		t.Fatal("the watcher does not follow the compact feed though the bucket is there")
	}
	if v, ok := w.View("p"); !ok || v.Snapshot.Seq != 1 || v.Snapshot.Backends[0].Load.Running != 3 {
		t.Fatalf("view after start: %+v, want the key frame of seq 1 with a's load 3", v.Snapshot)
	}
	noConsumers(t, nc)
	if err := pub.PublishLoads(loaded(1, 250*time.Millisecond, 9)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the load frame", func() bool { _, n := rec.counts(); return n == 1 })
	u := rec.lastLoads()
	if u.Epoch != "e1" || u.Base != 1 || len(u.Backends) != 3 || u.Backends[0].Backend != "a" || u.Backends[0].Running != 9 ||
		u.Backends[0].AgeMs != 0 || !math.IsNaN(u.Backends[1].Running) || u.Backends[1].AgeMs != -1 {
		t.Errorf("load update %+v, want a's load 9 reported now, b and c without a load, on e1/1", u)
	}
	// A decision snapshot goes out as a key frame (a's weight moved).
	next := loaded(2, time.Second, 9)
	next.Backends[0].Weight = 0.5
	publish(t, pub, next)
	waitFor(t, "the second key frame", func() bool { v, _ := w.View("p"); return v.Snapshot.Seq == 2 })
	// The JSON snapshots are not followed any more: one published on its
	// own (by an older serve, say) is not applied.
	script := feedtest.NewScript(t, nc, "")
	script.PublishSubject(loaded(7, 2*time.Second, 1))
	beat := loaded(2, 2500*time.Millisecond, 4)
	beat.Backends[0].Weight = 0.5
	if err := pub.PublishLoads(beat); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next load frame", func() bool { _, n := rec.counts(); return n == 2 })
	if v, _ := w.View("p"); v.Snapshot.Seq != 2 {
		t.Errorf("the watcher applied a JSON snapshot (seq %d) while it follows the compact feed", v.Snapshot.Seq)
	}
}

// A load frame whose key frame was missed makes the watcher fetch the key
// frame from the bucket, and then apply the next frames; a missed load
// frame is a gap, counted: the watcher asks serve for a snapshot now
// (fw.resync.<pool>), and the loads the lost frame may have moved keep
// their report times until listed again or the next key frame.
func TestCompactWatcherMissedFrames(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	pub, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	w := startWatcher(t, feedtest.Connect(t, url), rec.settings(WatcherSettings{}))
	if !w.Compact() {
		t.Fatal("not in compact mode")
	}
	resync, err := nc.SubscribeSync("fw.resync.>")
	if err != nil {
		t.Fatal(err)
	}
	// A key frame the watcher does not receive: encoded, stored, not sent.
	enc := NewCompactEncoder(CompactSettings{})
	key, _, _ := enc.Frame(nil, loaded(5, 0, 2), t0)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), "fw_feed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "p", key); err != nil {
		t.Fatal(err)
	}
	frame, _ := enc.Loads(nil, loaded(5, 250*time.Millisecond, 6))
	if err := nc.Publish("fw.feed.p", frame); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fetched key frame", func() bool { v, ok := w.View("p"); return ok && v.Snapshot.Seq == 5 })
	if got := w.keyFetches.Get(); got != 1 {
		t.Errorf("%d key fetches, want 1", got)
	}
	// Frame 3 lost, frame 4 received: a gap.
	enc.Loads(nil, loaded(5, 500*time.Millisecond, 7))
	frame, _ = enc.Loads(nil, loaded(5, 750*time.Millisecond, 12))
	if err := nc.Publish("fw.feed.p", frame); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the frame after the gap", func() bool { _, n := rec.counts(); return n >= 1 })
	if u := rec.lastLoads(); u.Backends[0].Running != 12 || u.Backends[1].AgeMs != -1 {
		t.Errorf("update after a lost frame: a's load %v (want 12), b's report age %d (want -1: it may have moved in the lost frame)",
			u.Backends[0].Running, u.Backends[1].AgeMs)
	}
	if w.gaps.Get() != 1 {
		t.Errorf("gaps counted %d, want 1", w.gaps.Get())
	}
	if _, err := resync.NextMsg(10 * time.Second); err != nil {
		t.Errorf("no resync request on fw.resync.p after the gap: %v", err)
	}
	_ = pub
}

// Without the fw_feed bucket (an older serve: JSON snapshots only) a
// watcher asked for the compact feed follows the JSON snapshots; once the
// bucket appears it switches to the compact feed.
func TestCompactWatcherFallsBackToJSON(t *testing.T) {
	defer func(d time.Duration) { feedRedetect = d }(feedRedetect)
	feedRedetect = 200 * time.Millisecond
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	script := feedtest.NewScript(t, nc, "")
	var rec recorder
	w := startWatcher(t, feedtest.Connect(t, url), rec.settings(WatcherSettings{}))
	if w.Compact() {
		t.Fatal("compact mode without the fw_feed bucket")
	}
	script.Publish(loaded(3, 0, 1))
	waitFor(t, "the JSON snapshot", func() bool { v, ok := w.View("p"); return ok && v.Snapshot.Seq == 3 })
	pub, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, loaded(4, time.Second, 1))
	waitFor(t, "the switch to the compact feed", w.Compact)
	for i := range 3 {
		if err := pub.PublishLoads(loaded(4, time.Second+time.Duration(i+1)*250*time.Millisecond, float64(10+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "load frames after the switch", func() bool { _, n := rec.counts(); return n > 0 })
}

// Without JetStream a watcher asked for the compact feed follows the JSON
// snapshots.
func TestCompactWatcherWithoutJetStream(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	var rec recorder
	w := startWatcher(t, feedtest.Connect(t, url), rec.settings(WatcherSettings{}))
	pub, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, loaded(1, 0, 1))
	waitFor(t, "the JSON snapshot", func() bool { v, ok := w.View("p"); return ok && v.Snapshot.Seq == 1 })
	if w.Compact() {
		t.Error("compact mode without JetStream")
	}
}

// An older reader of fw.decisions.<pool> (a JSON watcher, as every router
// before the compact feed, the Node example and third-party routers) gets
// every decision snapshot whole from a publisher that also sends the
// compact feed, and nothing of the load beats.
func TestOldReaderOfDecisions(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	pub, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seqs []uint64
	w := startWatcher(t, feedtest.Connect(t, url), WatcherSettings{OnUpdate: func(s *fleetwatch.Snapshot) {
		mu.Lock()
		defer mu.Unlock()
		seqs = append(seqs, s.Seq)
	}})
	for seq := uint64(1); seq <= 3; seq++ {
		s := loaded(seq, time.Duration(seq)*time.Second, float64(seq))
		s.Backends[1].Reason = fmt.Sprintf("reason %d", seq)
		publish(t, pub, s)
		if err := pub.PublishLoads(loaded(seq, time.Duration(seq)*time.Second+250*time.Millisecond, 40)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three snapshots", func() bool { mu.Lock(); defer mu.Unlock(); return len(seqs) == 3 })
	v, _ := w.View("p")
	if v.Snapshot.Seq != 3 || v.Snapshot.Backends[1].Reason != "reason 3" || v.Snapshot.Backends[0].Load.Running != 3 {
		t.Errorf("the JSON reader's view: %+v, want seq 3 whole (reasons, a's load 3)", v.Snapshot)
	}
	if w.Compact() {
		t.Error("a JSON watcher in compact mode")
	}
}

// Following a load frame (decoding it, handing it to OnLoads, a picker
// applying it) allocates nothing.
func TestFollowLoadFrameAllocatesNothing(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	t0 := time.Unix(1_700_000_000, 0)
	snap := analyzerPool100(t0)
	picker := p2c.New(p2c.Settings{})
	w, err := NewWatcher(feedtest.Connect(t, url), WatcherSettings{Compact: true, OnUpdate: picker.Update,
		OnLoads: func(_ string, u *p2c.LoadUpdate) { picker.UpdateLoads(u) }})
	if err != nil {
		t.Fatal(err)
	}
	enc := NewCompactEncoder(CompactSettings{})
	key, _, _ := enc.Frame(nil, snap, t0)
	subject := "fw.feed." + snap.Pool
	w.handleFrame(snap.Pool, subject, key)
	next := analyzerPool100(t0.Add(250 * time.Millisecond))
	for k := range 60 {
		next.Backends[k].Load.Running += 2
	}
	frame, _ := enc.Loads(nil, next)
	cp := w.compact[snap.Pool]
	// AllocsPerRun counts the process's allocations, the embedded NATS
	// server's and the connection's among them: a fresh-clone CI run once
	// saw 1 per frame. An allocation of the path shows in every one of
	// three measurements, a neighbour's in a few at most.
	least := math.Inf(1)
	for range 3 {
		least = min(least, testing.AllocsPerRun(1000, func() {
			cp.n = 1
			w.handleFrame(snap.Pool, subject, frame)
		}))
	}
	if least != 0 {
		t.Errorf("following a load frame allocates %v (the least of three measurements), want 0", least)
	}
	if w.loadsApplied.Get() < 100 {
		t.Errorf("%d load frames applied, want every one", w.loadsApplied.Get())
	}
}

// A key frame that repeats the decisions applied (KeyEvery's) is not
// handed to OnUpdate, which would rebuild the picker: it renews the view,
// OnLoads gets every backend's load from it based on the snapshot the
// picker has (which accepts it), and the load frames based on it apply
// there too. A key frame with other decisions, or whose deadline p95
// moved more than p95Step, is applied as new decisions.
func TestCompactWatcherRefreshesRepeatedDecisions(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	if _, err := NewPublisher(t.Context(), nc, PublisherSettings{}); err != nil { // the bucket
		t.Fatal(err)
	}
	picker := p2c.New(p2c.Settings{})
	var rec recorder
	var accepted, refused int
	s := rec.settings(WatcherSettings{Now: func() time.Time { return t0.Add(9 * time.Second) }})
	onUpdate, onLoads := s.OnUpdate, s.OnLoads
	s.OnUpdate = func(snap *fleetwatch.Snapshot) { picker.Update(snap); onUpdate(snap) }
	s.OnLoads = func(pool string, u *p2c.LoadUpdate) {
		rec.mu.Lock()
		if picker.UpdateLoads(u) {
			accepted++
		} else {
			refused++
		}
		rec.mu.Unlock()
		onLoads(pool, u)
	}
	w := startWatcher(t, feedtest.Connect(t, url), s)
	enc := NewCompactEncoder(CompactSettings{})
	send := func(frame []byte) {
		t.Helper()
		if err := nc.Publish("fw.feed.p", frame); err != nil {
			t.Fatal(err)
		}
	}
	withP95 := func(s *fleetwatch.Snapshot, p95 float64) *fleetwatch.Snapshot {
		s.Backends[1].P95TTFTMs = &p95
		return s
	}
	key, kind, _ := enc.Frame(nil, withP95(loaded(1, 0, 3), 400), t0)
	if kind != FrameKey {
		t.Fatal("the first frame is not a key frame")
	}
	send(key)
	waitFor(t, "the first key frame", func() bool { n, _ := rec.counts(); return n == 1 })

	// KeyEvery later, the same decisions: a key frame, refreshed.
	key, kind, changed := enc.Frame(nil, withP95(loaded(2, 6*time.Second, 8), 410), t0.Add(6*time.Second))
	if kind != FrameKey || changed {
		t.Fatalf("frame kind %c changed %v, want KeyEvery's key frame", kind, changed)
	}
	send(key)
	waitFor(t, "the repeated key frame", func() bool { _, n := rec.counts(); return n == 1 })
	if u := rec.lastLoads(); !u.Full || u.Base != 1 || u.Backends[0].Running != 8 || !u.Backends[1].NoLoad {
		t.Errorf("refresh: %+v, want every backend's load (a's 8, b none) based on seq 1", u)
	}
	if v, _ := w.View("p"); v.Snapshot.Seq != 1 || v.Stale {
		t.Errorf("view at seq %d, stale %v, after the repeated key frame: want seq 1 renewed (at t0+9s the key frame's at t0+6s + ttl 5s is ahead)",
			v.Snapshot.Seq, v.Stale)
	}
	if n, _ := rec.counts(); n != 1 || w.refreshed.Get() != 1 {
		t.Errorf("OnUpdate called %d times, %d refreshes counted: want 1 and 1", n, w.refreshed.Get())
	}
	if got, want := picker.StaleAt(), t0.Add(11*time.Second); !got.Equal(want) { // its at + ttl_ms 5000
		t.Errorf("picker stale at %v after the refresh, want %v (the repeated key frame's at + ttl)", got, want)
	}
	// A load frame based on the repeated key frame applies to the picker.
	frame, ok := enc.Loads(nil, withP95(loaded(2, 6250*time.Millisecond, 11), 410))
	if !ok {
		t.Fatal("no load frame")
	}
	send(frame)
	waitFor(t, "the load frame", func() bool { _, n := rec.counts(); return n == 2 })
	if u := rec.lastLoads(); u.Full || u.Base != 1 || u.Backends[0].Running != 11 {
		t.Errorf("load frame: %+v, want a's load 11 based on seq 1", u)
	}

	// Other decisions: applied as such; their load frames are based on them.
	next := withP95(loaded(3, 7*time.Second, 11), 410)
	next.Backends[2].Weight = 0.5
	key, _, _ = enc.Frame(nil, next, t0.Add(7*time.Second))
	send(key)
	waitFor(t, "the key frame with a new weight", func() bool { n, _ := rec.counts(); return n == 2 })
	frame, _ = enc.Loads(nil, next)
	send(frame)
	waitFor(t, "its load frame", func() bool { _, n := rec.counts(); return n == 3 })
	if u := rec.lastLoads(); u.Base != 3 {
		t.Errorf("load frame after new decisions based on seq %d, want 3", u.Base)
	}

	// The same decisions, but the deadline p95 moved 10%: new decisions.
	again := withP95(loaded(4, 13*time.Second, 11), 451)
	again.Backends[2].Weight = 0.5
	key, _, changed = enc.Frame(nil, again, t0.Add(13*time.Second))
	if changed {
		t.Fatal("the encoder saw a decision change")
	}
	send(key)
	waitFor(t, "the key frame with a moved p95", func() bool { n, _ := rec.counts(); return n == 3 })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if refused != 0 || accepted != 3 {
		t.Errorf("the picker accepted %d load updates and refused %d, want 3 and 0", accepted, refused)
	}
}

// RepeatsDecisions: what a key frame may differ in and still be applied
// as the loads of the snapshot applied.
func TestRepeatsDecisions(t *testing.T) {
	base := func() *fleetwatch.Snapshot {
		s := loaded(1, 0, 3)
		p95, ewma := 400.0, 120.0
		s.Backends[1].P95TTFTMs, s.Backends[1].EWMATTFTMs = &p95, &ewma
		return s
	}
	applied := base()
	for name, c := range map[string]struct {
		edit func(s *fleetwatch.Snapshot)
		want bool
	}{
		"loads, EWMA and p95 moved": {func(s *fleetwatch.Snapshot) {
			s.Backends[0].Load.Running, *s.Backends[1].EWMATTFTMs, *s.Backends[1].P95TTFTMs = 9, 180, 415
		}, true},
		"30s later":           {func(s *fleetwatch.Snapshot) { s.At = fleetwatch.At(t0.Add(MaxRepeatSpan)) }, true},
		"more than 30s later": {func(s *fleetwatch.Snapshot) { s.At = fleetwatch.At(t0.Add(MaxRepeatSpan + time.Millisecond)) }, false},
		"not newer":           {func(s *fleetwatch.Snapshot) { s.Seq = 1 }, false},
		"another epoch":       {func(s *fleetwatch.Snapshot) { s.Epoch = "e2" }, false},
		"another fence":       {func(s *fleetwatch.Snapshot) { s.Fence = 9 }, false},
		"a weight":            {func(s *fleetwatch.Snapshot) { s.Backends[2].Weight = 0.5 }, false},
		"a state":             {func(s *fleetwatch.Snapshot) { s.Backends[2].State = fleetwatch.StateHalfOpen }, false},
		"the routers":         {func(s *fleetwatch.Snapshot) { s.Routers = 7 }, false},
		"an EWMA gone":        {func(s *fleetwatch.Snapshot) { s.Backends[1].EWMATTFTMs = nil }, false},
		"the p95 by 10%":      {func(s *fleetwatch.Snapshot) { *s.Backends[1].P95TTFTMs = 440 }, false},
		"the p95 another backend's, 2% more": {func(s *fleetwatch.Snapshot) {
			p95 := 408.0
			s.Backends[1].P95TTFTMs, s.Backends[2].P95TTFTMs = nil, &p95
		}, true},
		"the p95 gone":   {func(s *fleetwatch.Snapshot) { s.Backends[1].P95TTFTMs = nil }, false},
		"a backend less": {func(s *fleetwatch.Snapshot) { s.Backends = s.Backends[:2] }, false},
	} {
		s := base()
		s.Seq, s.At = 2, fleetwatch.At(t0.Add(5*time.Second))
		c.edit(s)
		if got := RepeatsDecisions(applied, s); got != c.want {
			t.Errorf("%s: RepeatsDecisions = %v, want %v", name, got, c.want)
		}
	}
	// In shadow mode, where the picker applies no load update, never.
	shadowed, s := base(), base()
	shadowed.Shadow, s.Shadow, s.Seq = fleetwatch.ShadowObserve, fleetwatch.ShadowObserve, 2
	if RepeatsDecisions(shadowed, s) {
		t.Error("a key frame of a pool in shadow mode repeats its decisions: its picker would take no load")
	}
}
