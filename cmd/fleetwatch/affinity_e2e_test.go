package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRoutersAgreeOnPrefixesAfterAJoin: a router that starts during an
// incident sends each system prompt to the backend the router that was
// there before it does. Real parts: an embedded NATS server, serve, two
// `fleetwatch route` instances on real sockets and nine fake backends; the
// incident is two backends forced open through serve's override API.
// Affinity is the reason routers share decisions; a picker fed snapshots
// alone made fewer slots when its first snapshot came during an incident
// (p2c.TestAffinityAgreesAcrossHistories). route starts its picker from
// the configured pool, all closed, so it agreed with that rule too: this
// test keeps it so.
func TestRoutersAgreeOnPrefixesAfterAJoin(t *testing.T) {
	t.Parallel() // its own servers: overlaps the rest of the package
	if testing.Short() {
		t.Skip("end-to-end: serve and two routers")
	}
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	decisions := watchDecisions(t, nc, "llama")
	backends := testkit.StartFakeBackends(t, 9)
	for _, b := range backends {
		b.SetBehavior(fakeai.Behavior{TTFT: 5 * time.Millisecond, TokenTime: 200 * time.Microsecond})
	}
	// Affinity only: a prefix leaves its backend when that backend's TTFT
	// EWMA passes affinity_tolerance x the pool median, in each router's
	// own view (a loaded machine's spikes differ between the two); that
	// rule is not under test.
	path := routeConfig(t, natsURL, backends, "    affinity_tolerance: 1000\n")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTP.Listen, cfg.Data, cfg.Probes.Disabled = "127.0.0.1:0", t.TempDir(), true
	srv := runTestServe(t, cfg)

	before := startRouteCmd(t, path, "--source", "router-before")
	eventually(t, 30*time.Second, "the first router to apply a snapshot of every backend", func() bool {
		for _, b := range backends {
			if routeGauge(t, before, "open", b.Name()) != 0 {
				return false
			}
		}
		return true
	})
	// The incident: b0 and b1 forced open, the other seven closed.
	incident := []string{backends[0].Name(), backends[1].Name()}
	for _, id := range incident {
		var out, errOut bytes.Buffer
		if err := runOverride(t.Context(), []string{"force-open", "llama", id, "--reason", "incident", "--for", "10m",
			"--url", "http://" + srv.HTTPAddr()}, &out, &errOut); err != nil {
			t.Fatalf("force-open %s: %v %s", id, err, errOut.String())
		}
	}
	open := func(base string) func() bool {
		return func() bool {
			return routeGauge(t, base, "open", incident[0]) == 1 && routeGauge(t, base, "open", incident[1]) == 1
		}
	}
	testkit.EventuallyShowing(t, 30*time.Second, "the first router to apply the incident", decisions.describe, open(before))
	joined := startRouteCmd(t, path, "--source", "router-joined")
	testkit.EventuallyShowing(t, 30*time.Second, "the router that joined to apply the incident", decisions.describe, open(joined))

	a, b := testkit.NewChatClient(before), testkit.NewChatClient(joined)
	const prompts = 40
	differ, used := 0, map[string]bool{}
	for i := range prompts {
		system := fmt.Sprintf("you are assistant number %d", i)
		ra, err := a.Chat(system, "hello", false)
		if err != nil || ra.Status != 200 {
			t.Fatalf("prompt %d through the first router: %v %d", i, err, ra.Status)
		}
		rb, err := b.Chat(system, "hello", false)
		if err != nil || rb.Status != 200 {
			t.Fatalf("prompt %d through the router that joined: %v %d", i, err, rb.Status)
		}
		if ra.Backend != rb.Backend {
			differ++
			t.Logf("prompt %d: %s through the first router, %s through the one that joined", i, ra.Backend, rb.Backend)
		}
		used[ra.Backend] = true
	}
	if differ != 0 {
		t.Errorf("%d of %d system prompts went to another backend through the router that joined during the incident", differ, prompts)
	}
	for _, id := range incident {
		if used[id] {
			t.Errorf("a prompt went to %s, forced open", id)
		}
	}
	if len(used) < 4 {
		t.Errorf("%d prompts landed on %d backends, want them spread over the seven closed ones", prompts, len(used))
	}
}
