package serve

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// A resync request (fw.resync.<pool>: a router missed frames) makes serve
// publish the pool's decision snapshot at once, its compact frame a key
// frame, where the pool's next key frame would otherwise be up to 5 s
// away; requests of a pool are answered at most once a second.
func TestResyncSendsAKeyFrame(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	srv := startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{})
	nc := feedtest.Connect(t, url)
	snaps := testkit.SubscribeSnapshots(t, nc)
	var keys atomic.Int64
	if _, err := nc.Subscribe("fw.feed.p", func(m *nats.Msg) {
		if kind, err := feed.FrameKind(m.Data); err == nil && kind == feed.FrameKey {
			keys.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitConsuming(t, nc, snaps, "p", "a")
	// After the pool's first key frame, ask until a key frame comes within
	// half a second of a request (a key frame of KeyEvery could come by
	// chance once; answered requests bring one each time).
	testkit.Eventually(t, 10*time.Second, "the pool's first key frame", func() bool { return keys.Load() > 0 })
	answered := 0
	for range 3 {
		before := keys.Load()
		testkit.Publish(t, nc, "fw.resync.p", "")
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) && keys.Load() == before {
			time.Sleep(10 * time.Millisecond)
		}
		if keys.Load() > before {
			answered++
		}
		time.Sleep(1100 * time.Millisecond) // past the once-a-second bound
	}
	if answered < 2 {
		t.Errorf("%d of 3 resync requests were followed by a key frame within 500 ms, want every one (a key frame otherwise comes every 5 s)", answered)
	}

	// A request within a second of the last answer is answered when the
	// second is over, not dropped: a router that reconnected after the
	// last answer's key frame went out still gets one (bench scale's
	// reconnect storm: without it, routers of the lost node waited up to
	// the 5 s key frame).
	answeredBefore := srv.m.resyncs.Get()
	keysBefore := keys.Load()
	testkit.Publish(t, nc, "fw.resync.p", "")
	testkit.Eventually(t, 5*time.Second, "the first request answered", func() bool { return srv.m.resyncs.Get() == answeredBefore+1 })
	time.Sleep(200 * time.Millisecond)
	testkit.Publish(t, nc, "fw.resync.p", "")
	testkit.Publish(t, nc, "fw.resync.p", "") // folded into the same answer
	testkit.Eventually(t, 10*time.Second, "the second request answered once its second was over", func() bool {
		return srv.m.resyncs.Get() == answeredBefore+2 && keys.Load() >= keysBefore+2
	})
	time.Sleep(1500 * time.Millisecond)
	if got := srv.m.resyncs.Get(); got != answeredBefore+2 {
		t.Errorf("%v answers to three requests within a second, want 2 (one now, one when the second is over)", got-answeredBefore)
	}
	// A pool nobody publishes is not answered and leaves nothing behind.
	r := &resyncs{s: srv.Server, last: map[string]time.Time{}, later: map[string]*time.Timer{}}
	now := time.Now()
	r.request("invented", now)
	r.request("invented", now.Add(10*time.Millisecond))
	r.mu.Lock()
	_, remembered := r.last["invented"]
	pending := len(r.later)
	r.mu.Unlock()
	if remembered || pending != 0 {
		t.Errorf("an invented pool left an entry (%v) or an answer due (%d)", remembered, pending)
	}
	r.stop()
}

// Pools publish across the load beat, each on its own phase, not all at
// one instant: the load frames of eight pools carry several evaluation
// times per beat (one per pool but for pools whose phases share a tick),
// where one evaluation of every pool per tick gave them all the same.
// Routers following many pools then take their frames evenly rather than
// in one burst four times a second.
func TestPoolsPublishOnTheirOwnPhases(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{})
	nc := feedtest.Connect(t, url)
	snaps := testkit.SubscribeSnapshots(t, nc)
	var mu sync.Mutex
	ats := map[string][]time.Time{}
	if _, err := nc.Subscribe("fw.feed.*", func(m *nats.Msg) {
		var l feed.Loads
		if feed.DecodeLoads(m.Data, &l) != nil {
			return // a key frame
		}
		mu.Lock()
		ats[m.Subject] = append(ats[m.Subject], l.At)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	const pools = 8
	for i := range pools {
		testkit.WaitConsuming(t, nc, snaps, fmt.Sprintf("p%d", i), "a")
	}
	mu.Lock()
	clear(ats)
	mu.Unlock()
	time.Sleep(2 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	distinct := map[int64]bool{}
	frames := 0
	for _, as := range ats {
		for _, at := range as {
			distinct[at.UnixMilli()] = true
		}
		frames = max(frames, len(as))
	}
	if len(ats) != pools || frames == 0 {
		t.Fatalf("load frames of %d pools (at most %d of one), want all %d pools'", len(ats), frames, pools)
	}
	if len(distinct) < 3*frames {
		t.Errorf("the load frames of %d pools carry %d evaluation times, %d frames of the busiest pool: want the pools on phases of their own (at least three times as many times as one pool's frames)", pools, len(distinct), frames)
	}
}

// The routers count follows the traffic (each event's source), not the
// decisions: while it moves, serve's load beats go on sending load frames
// on the last key frame, and the heartbeat's key frame carries the new
// count. Before, a count that had moved since the key frame held back
// every load frame until the next heartbeat: here, with a new source
// every 50 ms, none went out.
func TestLoadFramesGoOnWhileTheRoutersCountMoves(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{})
	nc := feedtest.Connect(t, url)
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "p", "a")

	var mu sync.Mutex
	var counts []int // the routers count of each key frame
	loads := 0       // load frames after the first key frame
	if _, err := nc.Subscribe("fw.feed.p", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		var l feed.Loads
		if feed.DecodeLoads(m.Data, &l) == nil {
			if len(counts) > 0 {
				loads++
			}
			return
		}
		if snap, _, err := feed.DecodeKey(m.Data, "p"); err == nil {
			counts = append(counts, snap.Routers)
		}
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ev := fmt.Sprintf(`{"v":1,"pool":"p","backend":"a","status":200,"ttft_ms":100,"source":"router-%d"}`, i)
			if nc.Publish("fw.outcomes", []byte(ev)) != nil {
				return
			}
		}
	}()
	testkit.Eventually(t, 30*time.Second, "four key frames", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(counts) >= 4
	})
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if counts[len(counts)-1] <= counts[0] {
		t.Fatalf("key frames' routers counts %v: the count did not grow", counts)
	}
	if loads == 0 {
		t.Errorf("no load frame between %d key frames whose routers counts moved (%v)", len(counts), counts)
	}
	t.Logf("%d load frames between key frames with routers counts %v", loads, counts)
}
