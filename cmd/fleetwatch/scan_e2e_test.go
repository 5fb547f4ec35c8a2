package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRouteScanLargerPool runs the scan of few routers with real
// processes: `fleetwatch serve` as a subprocess, sixteen fake backends and
// two routers, each with its own clients. Once the snapshot counts the two
// routers, every pick compares all sixteen (p2c.Settings.ScanRouters; each
// router's fleetwatch_route_pick_candidates says 16). One
// backend (b5) then fails fast: an instant 500 leaves it the emptiest
// backend of the pool, which a scan compares on every pick
// (least-connections' trap), so the routers' local breakers and retries
// must keep its failures from the clients until the pool's breaker opens
// it; while it is open it gets nothing, and the picks spread over the
// fifteen others (ties at random). The scan's gain in tail latency is the
// simulator's to show (internal/sim TestScanInLargerPools); this shows
// that with real processes it does not walk into the trap.
func TestRouteScanLargerPool(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs for several seconds")
	}
	bin := fleetwatchBinary(t)
	natsURL, _ := feedtest.NewServer(t)
	decisions := watchDecisions(t, feedtest.Connect(t, natsURL), "llama")
	backends := testkit.StartFakeBackends(t, 16)
	healthy := fakeai.Behavior{TTFT: 10 * time.Millisecond, TokenTime: 500 * time.Microsecond}
	for _, b := range backends {
		b.SetBehavior(healthy)
	}
	// As TestRouteEndToEnd: breakers stay open past the test, and the
	// slow rule is out of reach of a loaded machine's TTFT spikes.
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {open_base: 2m, max_open_fraction: 0.75, slow_factor: 50}\n")
	startServe(t, bin, cfg, natsURL)
	bases := []string{startRouteCmd(t, cfg, "--source", "route-a"), startRouteCmd(t, cfg, "--source", "route-b")}
	loads := []*loadGen{startLoad(t, bases[0], 4), startLoad(t, bases[1], 4)}
	count := func(phase int) (total, failed int, by map[string]int) {
		by = map[string]int{}
		for _, g := range loads {
			n, f, b := g.count(phase)
			total, failed = total+n, failed+f
			for k, v := range b {
				by[k] += v
			}
		}
		return total, failed, by
	}
	setPhase := func(p int64) {
		for _, g := range loads {
			g.phase.Store(p)
		}
	}
	testkit.EventuallyShowing(t, 30*time.Second, "a snapshot counting both routers", decisions.describe, func() bool { return decisions.routers() == 2 })
	for _, base := range bases {
		eventually(t, 30*time.Second, "the router to compare all 16 backends", func() bool {
			return strings.Contains(routeMetricsText(t, base), `fleetwatch_route_pick_candidates{pool="llama"} 16`)
		})
	}

	// Phase 1: b5 fails fast until its breaker opens.
	setPhase(1)
	broken := backends[5]
	broken.SetBehavior(fakeai.Behavior{InstantError: true})
	testkit.EventuallyShowing(t, 30*time.Second, "the broken backend's breaker to open", decisions.describe, func() bool {
		return decisions.state(broken.Name()) == fleetwatch.StateOpen
	})
	// Phase 2: the breaker open, 600 requests, counted from when both
	// routers applied it and every worker finished a request it started
	// after that (as TestRouteEndToEnd: a request started before could
	// still reach the broken backend; a loaded full run saw 1).
	for _, base := range bases {
		eventually(t, 30*time.Second, "the router to apply the open breaker", func() bool { return routeGauge(t, base, "open", broken.Name()) == 1 })
	}
	setPhase(2)
	for _, g := range loads {
		eventually(t, 30*time.Second, "every worker done with a request of phase 2", func() bool { return g.allWorkersIn(2, 4) })
	}
	before := broken.Stats().Requests
	eventually(t, 60*time.Second, "600 requests with the broken backend open", func() bool { n, _, _ := count(2); return n >= 600 })
	for _, g := range loads {
		g.halt()
	}
	if decisions.state(broken.Name()) == fleetwatch.StateOpen {
		if got := broken.Stats().Requests - before; got != 0 {
			t.Errorf("the broken backend got %d requests while open", got)
		}
	}
	total1, failed1, _ := count(1)
	total2, failed2, by := count(2)
	t.Logf("until the breaker opened: %d requests, %d failed; open: %d requests, %d failed, 200s by backend %v", total1, failed1, total2, failed2, by)
	if failed1+failed2 > 10 {
		t.Errorf("%d+%d client failures around a fast-failing backend, want few", failed1, failed2)
	}
	if len(by) != 15 {
		t.Errorf("with the broken backend open, %d backends served (%v), want all 15 others", len(by), by)
	}
}
