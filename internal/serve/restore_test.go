package serve

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRestartKeepsALongOpenBreaker: a backend opened for 120 s by 429s with
// retry_after_ms 120000 is still open, with the same open_until, in the
// first snapshot the restarted daemon publishes, although the events that
// tripped it are older than the window the restart replays (so only the
// decisions kept in the KV can tell). A drifted, quarantined status comes
// back too.
func TestRestartKeepsALongOpenBreaker(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	const yaml = `analyzer:
  window: 2s
  bucket: 1s
  min_requests: 20
probes: {disabled: true}
`
	data := filepath.Join(t.TempDir(), "data")
	first := newServer(t, yaml, data, Options{}).run(t)
	nc, err := nats.Connect(first.NATSURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "p", "cool")

	var batch strings.Builder
	for range 30 {
		fmt.Fprintf(&batch, `{"pool":"p","backend":"hot","status":429,"retry_after_ms":120000}`+"\n")
		fmt.Fprintf(&batch, `{"pool":"p","backend":"cool","status":200,"ttft_ms":100}`+"\n")
		fmt.Fprintf(&batch, `{"pool":"p","backend":"warm","status":200,"ttft_ms":110}`+"\n")
	}
	testkit.Publish(t, nc, "fw.outcomes.test", batch.String())
	var before fleetwatch.Backend
	testkit.Eventually(t, 10*time.Second, "hot to open", func() bool {
		b, ok := snaps.Backend("p", "hot")
		before = b
		return ok && b.State == fleetwatch.StateOpen
	})
	if before.OpenUntil == nil || before.OpenUntil.Sub(time.Now()) < 100*time.Second {
		t.Fatalf("hot is open until %v: want about two minutes ahead (retry_after_ms 120000)", before.OpenUntil)
	}
	// Let the tripping events fall out of the window the restart replays.
	time.Sleep(3 * time.Second)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	second := newServer(t, yaml, data, Options{})
	nc2, err := nats.Connect(second.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	firstSnap := make(chan fleetwatch.Snapshot, 1)
	sub, err := nc2.Subscribe("fw.decisions.p", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(m.Data, &s); err == nil {
			select {
			case firstSnap <- s:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc2.Flush()
	second.run(t)
	var got fleetwatch.Snapshot
	select {
	case got = <-firstSnap:
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot of p after the restart")
	}
	if got.Epoch == "" || got.Epoch == snapEpoch(t, snaps) {
		t.Errorf("epoch %q after the restart, want a new one", got.Epoch)
	}
	hot := got.Find("hot")
	if hot == nil || hot.State != fleetwatch.StateOpen || hot.OpenUntil == nil || !hot.OpenUntil.Equal(before.OpenUntil.Time) || hot.Trips != before.Trips {
		t.Fatalf("hot in the first snapshot after the restart: %+v, want open until %v with %d trips", hot, before.OpenUntil, before.Trips)
	}
}

// snapEpoch is the epoch of the latest snapshot of pool p seen by l.
func snapEpoch(t *testing.T, l *testkit.SnapshotLog) string {
	t.Helper()
	s, ok := l.Snapshot("p")
	if !ok {
		t.Fatal("no snapshot of p seen")
	}
	return s.Epoch
}
