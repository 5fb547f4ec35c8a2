package serve

import (
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
	startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{})
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
}
