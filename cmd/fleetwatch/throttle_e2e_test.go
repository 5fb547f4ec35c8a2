package main

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestBareAndHintedThrottles runs `fleetwatch serve` as a subprocess, the
// router in-process and four fake backends. b2 answers 70% of its requests
// with bare 429s (a full queue's), b3 90% with 429s that carry Retry-After
// (a quota's). The quota opens b3. The full queue only lowers b2's weight
// (analyzer.throttle_rate_counts: hinted, the default): b2 is never opened
// while its window holds enough requests for the 429 rate to count, and
// its weight falls to the floor. The route reads the hint from the
// response and publishes it as retry_after_ms; nothing else tells the two
// apart. (A backend refusing 90% or more of its requests, bare 429s
// included, is opened while its peers serve: throttle_refuse_rate,
// TestBrokenBackendShare. At 90% b2 sat on that line and was opened in
// some runs, so it refuses 70% here.)
func TestBareAndHintedThrottles(t *testing.T) {
	t.Parallel() // its own servers and processes
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs for several seconds")
	}
	bin := fleetwatchBinary(t)
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	var (
		mu       sync.Mutex
		b2Opened bool
		b2       fleetwatch.Backend
		b3       fleetwatch.State
	)
	sub, err := nc.Subscribe(fleetwatch.Subjects{}.Decisions("llama"), func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if json.Unmarshal(m.Data, &s) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if b := s.Find("b2"); b != nil {
			b2 = *b
			b2Opened = b2Opened || b.State == fleetwatch.StateOpen
		}
		if b := s.Find("b3"); b != nil {
			b3 = b.State
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	describe := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("b2 %s weight %.2f over %d requests (%s); b3 %s", b2.State, b2.Weight, b2.Requests, b2.Reason, b3)
	}

	backends := testkit.StartFakeBackends(t, 4)
	healthy := fakeai.Behavior{TTFT: 10 * time.Millisecond, TokenTime: 500 * time.Microsecond}
	full, quota := healthy, healthy
	full.ThrottleRate, full.BareThrottle = 0.7, true
	quota.ThrottleRate = 0.9
	backends[0].SetBehavior(healthy)
	backends[1].SetBehavior(healthy)
	backends[2].SetBehavior(full)
	backends[3].SetBehavior(quota)
	// Breakers stay open past the test; slowness is not under test (see
	// TestRouteEndToEnd).
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {open_base: 2m, max_open_fraction: 0.75, slow_factor: 50}\n")
	startServe(t, bin, cfg, natsURL)
	base := startRouteCmd(t, cfg)
	load := startLoad(t, base, 6)
	load.phase.Store(1)
	testkit.EventuallyShowing(t, 30*time.Second, "the quota to open b3", describe, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return b3 == fleetwatch.StateOpen
	})
	// b2's 429 rate is far past throttle_rate once its window holds
	// min_requests (20): the rate rule has had its chance to open it.
	testkit.EventuallyShowing(t, 30*time.Second, "b2's window to hold 20 requests and its weight to fall", describe, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return b2.Requests >= 20 && b2.Weight <= 0.2
	})
	time.Sleep(3 * time.Second) // three more evaluations
	mu.Lock()
	defer mu.Unlock()
	if b2Opened || b2.State != fleetwatch.StateClosed {
		t.Errorf("b2, answering bare 429s, was opened (now %s): %s", b2.State, b2.Reason)
	}
	total, failed, _ := load.count(1)
	t.Logf("%d requests, %d failed (a 429 retried onto the other throttling backend, or past the retry budget); %s", total, failed, fmt.Sprintf("b2 %s weight %.2f over %d requests", b2.State, b2.Weight, b2.Requests))
}
