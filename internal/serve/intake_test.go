package serve

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestEventsPublishedWhileServeIsDown: with ingest.durable, failures
// published while no serve runs reach a decision when serve comes back;
// with the default core intake the same failures are lost (which is why
// the durable intake exists).
func TestEventsPublishedWhileServeIsDown(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	for _, tc := range []struct {
		name    string
		durable bool
		opens   bool
	}{
		{"durable", true, true},
		{"core", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := feedtest.NewServer(t)
			yaml := fmt.Sprintf("nats: {url: %q}\ningest: {durable: %v}\nprobes: {disabled: true}\n", url, tc.durable)
			data := filepath.Join(t.TempDir(), "data")
			nc := feedtest.Connect(t, url)
			snaps := testkit.SubscribeSnapshots(t, nc)

			first := newServer(t, yaml, data, Options{}).run(t)
			testkit.WaitConsuming(t, nc, snaps, "p", "healthy")
			if err := first.stop(); err != nil {
				t.Fatal(err)
			}
			// serve is down: thirty failures in a row, and some ok events
			// of a healthy peer.
			for range 30 {
				testkit.Publish(t, nc, "fw.outcomes.edge-1", `{"pool":"p","backend":"dead","status":503}`)
				testkit.Publish(t, nc, "fw.outcomes.edge-1", `{"pool":"p","backend":"healthy","status":200,"ttft_ms":100}`)
			}
			nc.Flush()
			time.Sleep(500 * time.Millisecond)

			newServer(t, yaml, data, Options{}).run(t)
			if tc.opens {
				testkit.Eventually(t, 20*time.Second, "dead to open from the events published while serve was down", func() bool {
					b, ok := snaps.Backend("p", "dead")
					return ok && b.State == fleetwatch.StateOpen
				})
				return
			}
			// Core: wait until the restarted serve has published p, then
			// check that dead was never seen.
			testkit.WaitConsuming(t, nc, snaps, "p", "healthy")
			time.Sleep(time.Second)
			if b, ok := snaps.Backend("p", "dead"); ok && b.State == fleetwatch.StateOpen {
				t.Errorf("dead opened with the core intake: %+v (the test's premise, that core loses these events, is wrong)", b)
			}
		})
	}
}
