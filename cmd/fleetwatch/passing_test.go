package main

import (
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRouteMidStreamErrorsOpenTheBreaker is issue 21's measured bug end to
// end: a backend whose 200 streams carry an error event after their first
// token and then end with [DONE] was published ok and never opened. Through
// a real `fleetwatch route` following a real `fleetwatch serve`, its
// attempts are now errors and its breaker opens, while its peer stays
// closed.
func TestRouteMidStreamErrorsOpenTheBreaker(t *testing.T) {
	healthy := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "ok", Behavior: fakeai.Behavior{Model: "llama-3.1-70b"}}))
	t.Cleanup(healthy.Close)
	broken := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "bad",
		Behavior: fakeai.Behavior{Model: "llama-3.1-70b", StreamErrorAfterTokens: 1}}))
	t.Cleanup(broken.Close)
	config := fmt.Sprintf(`pools:
  - id: llama
    models: [llama-3.1-70b]
    backends:
      - id: ok
        url: %s
      - id: bad
        url: %s
`, healthy.URL, broken.URL)
	p := startServeProcess(t, config, "--no-probes")
	nc, err := nats.Connect(p.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	snaps := testkit.SubscribeSnapshots(t, nc)
	cfgPath := filepath.Join(t.TempDir(), "route.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startRouteProcess(t, nil, "--nats", p.natsURL, "--config", cfgPath, "--source", "passing-test")
	c := testkit.NewChatClient(base)
	open := func() bool { b, ok := snaps.Backend("llama", "bad"); return ok && b.State == fleetwatch.StateOpen }
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; !open(); i++ {
		if time.Now().After(deadline) {
			b, _ := snaps.Backend("llama", "bad")
			t.Fatalf("after %d streaming requests bad is %q (%s), want open", i, b.State, b.Reason)
		}
		if r, err := c.Chat("", fmt.Sprintf("request %d", i), true); err != nil || r.Status != 200 {
			t.Fatalf("request %d: %v, status %d: the client gets the backend's 200 either way", i, err, r.Status)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if b, ok := snaps.Backend("llama", "ok"); !ok || b.State != fleetwatch.StateClosed {
		t.Errorf("ok is %q (%s), want closed", b.State, b.Reason)
	}
}
