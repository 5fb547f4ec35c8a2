package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestBrokenBackendShare measures, with real processes (`fleetwatch
// serve` as a subprocess, fake backends with a 20 ms TTFT, routers each
// with its own clients), the share of the attempts that a broken backend
// gets once the analyzer has opened it, over pools of 4, 16 and 64. b1
// answers every request with an instant bare 429 (no retry hint: a full
// queue's, or a backend whose admission limit other clients hold), b2 with
// an instant 500. Each gets at most 1% of the attempts the backends see
// over the measurement (a few thousand), its half-open trickles included:
// the open time is 2-4 s here (open_base, open_max), so the measurement
// sees a few half-open periods, each ended by the backend's first answer;
// a period costs at most two attempts per router.
//
// Why a bare-429 backend needs opening: its 429s leave it nothing in flight
// and no TTFT sample, so a router's scan scores it as an idle backend at
// the pool median's TTFT (p2c TestScanInstantFailureShare). Merely
// down-weighted (to 0.05-0.15 by its 429 rate and the shrinkage over its
// few requests), it joins a scan with probability weight / largest weight
// and wins unless idle peers tie with it. In a lightly loaded pool most
// peers tie, which is why the issue measured only 0.77% among 16 (weight
// 0.06) and 0.29% among 64 (0.15) before the analyzer's refusal rule
// (throttle_refuse_rate) opened it; in the simulator, whose backends have
// requests in flight, it kept 2-12% (docs/EVALUATION.md "A backend that
// refuses everything").
//
// The pool of 64 runs behind two routers and measures fewer attempts, to
// keep the test short for CI.
func TestBrokenBackendShare(t *testing.T) {
	t.Parallel() // its own servers and processes
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs for about a minute")
	}
	bin := fleetwatchBinary(t)
	for _, c := range []struct {
		backends, routers, attempts int
	}{{4, 4, 3000}, {16, 4, 3000}, {64, 2, 2000}} {
		t.Run(fmt.Sprintf("%d backends", c.backends), func(t *testing.T) {
			brokenShare(t, bin, c.backends, c.routers, c.attempts)
		})
	}
}

func brokenShare(t *testing.T, bin string, n, routers, attempts int) {
	natsURL, _ := feedtest.NewServer(t)
	states := watchStates(t, feedtest.Connect(t, natsURL), "llama")
	backends := testkit.StartFakeBackends(t, n)
	healthy := fakeai.Behavior{TTFT: 20 * time.Millisecond, TokenTime: 500 * time.Microsecond}
	for _, b := range backends {
		b.SetBehavior(healthy)
	}
	refusing, failing := backends[1], backends[2]
	refusing.SetBehavior(fakeai.Behavior{ThrottleRate: 1, BareThrottle: true})
	failing.SetBehavior(fakeai.Behavior{InstantError: true})
	// Slowness is not under test (see TestRouteEndToEnd); short open times
	// put half-open periods in the measurement. (At 1-2 s a CI machine
	// running the other packages' tests beside this one served so few
	// requests a second that 22 periods of 1-2 attempts each made 1.12%
	// of 3,031: the share is per period of time, not per attempt.) How
	// soon the refusal rule opens b1 is not under test either: it needs
	// recent_min_requests in the newest quarter of the window, and once
	// b1's 429s have shrunk its weight (to 0.18 among 64) a loaded CI
	// machine sent it 22 requests in 3 minutes, never 10 in a quarter;
	// 4 opens it as surely with a tenth of the traffic.
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {open_base: 2s, open_max: 4s, slow_factor: 50, recent_min_requests: 4}\n")
	startServe(t, bin, cfg, natsURL)
	var loads []*loadGen
	for r := range routers {
		loads = append(loads, startLoad(t, startRouteCmd(t, cfg, "--source", fmt.Sprintf("route-%d", r)), 4))
	}
	for _, g := range loads {
		g.phase.Store(1)
	}
	// (A liveness bound: 64 backends behind two routers on a loaded
	// machine send the refusing one few requests a second.)
	testkit.EventuallyShowing(t, 3*time.Minute, "both broken backends to open", states.describe, func() bool {
		return states.everOpen(refusing.Name()) && states.everOpen(failing.Name())
	})
	reason := states.openReason(refusing.Name())

	// The measurement: attempts as the backends count them.
	for _, g := range loads {
		g.phase.Store(2)
	}
	for _, b := range backends {
		b.ResetStats()
	}
	halfOpens := states.halfOpens()
	total := func() (sum int64) {
		for _, b := range backends {
			sum += b.Stats().Requests
		}
		return sum
	}
	eventually(t, 120*time.Second, fmt.Sprintf("%d attempts", attempts), func() bool { return total() >= int64(attempts) })
	for _, g := range loads {
		g.halt()
	}
	all := total()
	periods := states.halfOpens()
	for _, b := range []*fakeai.Server{refusing, failing} {
		got := b.Stats().Requests
		share := float64(got) / float64(all)
		episodes := periods[b.Name()] - halfOpens[b.Name()]
		t.Logf("%d backends, %d routers: %s got %d of %d attempts (%.3f%%) over %d half-open periods",
			n, routers, b.Name(), got, all, 100*share, episodes)
		if share > 0.01 {
			t.Errorf("%s got %.2f%% of the attempts once open, want at most 1%%", b.Name(), 100*share)
		}
		// The trickle: a period ends at the backend's first answer, so
		// each costs about one attempt per router (those picked before
		// the reopening snapshot reached them), never a stream of them.
		if limit := int64((episodes + 1) * routers * 2); got > limit {
			t.Errorf("%s got %d attempts over %d half-open periods behind %d routers, want at most %d (2 per router and period)",
				b.Name(), got, episodes, routers, limit)
		}
	}
	if !strings.Contains(reason, "bare 429s included") {
		t.Errorf("%s was opened for %q, want the refusal rule (bare 429s included)", refusing.Name(), reason)
	}
	for phase, what := range map[int]string{1: "until both opened", 2: "while measured"} {
		requests, failed := 0, 0
		for _, g := range loads {
			n, f, _ := g.count(phase)
			requests, failed = requests+n, failed+f
		}
		t.Logf("%s: %d client requests, %d failed (a retry budget spent, or a retry onto the other broken backend)", what, requests, failed)
	}
}

// TestPoolOverloadOpensNothing: every backend of a pool of 4 admits one
// request at a time (for 600 ms) and answers the rest with an instant bare
// 429 (a full queue), and 32 clients send far more than that: every
// backend answers more than 90% of its requests 429 (checked), so each
// looks refusing on its own
// (the refusal rule, throttle_refuse_rate 0.9), but its peers answer 429s
// too, so the analyzer opens nothing (the rule's hold; the hinted rules
// never count bare 429s). With the hold off (pool_throttle_hold: -1) the
// rule opens backends here and the test fails.
func TestPoolOverloadOpensNothing(t *testing.T) {
	t.Parallel() // its own servers and processes
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs for several seconds")
	}
	bin := fleetwatchBinary(t)
	natsURL, _ := feedtest.NewServer(t)
	states := watchStates(t, feedtest.Connect(t, natsURL), "llama")
	backends := testkit.StartFakeBackends(t, 4)
	for _, b := range backends {
		// One request at a time for 600 ms: the pool serves under 7 a
		// second, and the clients ask for many times that. (At 200 ms a
		// CI machine running the other packages' tests beside this one
		// sent too few: every backend refused only 82-84%.)
		b.SetBehavior(fakeai.Behavior{TTFT: 600 * time.Millisecond, TokenTime: 2 * time.Millisecond,
			MaxConcurrent: 1, RejectOverLimit: true, BareThrottle: true})
	}
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {slow_factor: 50}\n")
	startServe(t, bin, cfg, natsURL)
	var loads []*loadGen
	for r := range 2 {
		loads = append(loads, startLoad(t, startRouteCmd(t, cfg, "--source", fmt.Sprintf("route-%d", r)), 16))
	}
	for _, g := range loads {
		g.phase.Store(1)
	}
	throttled := func() (sum int64) {
		for _, b := range backends {
			sum += b.Stats().Throttled
		}
		return sum
	}
	// Enough 429s for every rate rule to have had its chance: each
	// backend's window holds far more than min_requests.
	eventually(t, 60*time.Second, "2,000 bare 429s", func() bool { return throttled() >= 2000 })
	time.Sleep(3 * time.Second) // three more evaluations
	for _, g := range loads {
		g.halt()
	}
	var rates []string
	for _, b := range backends {
		st := b.Stats()
		refused := float64(st.Throttled) / float64(st.OK+st.Throttled)
		rates = append(rates, fmt.Sprintf("%s served %d, refused %d (%.0f%%)", b.Name(), st.OK, st.Throttled, 100*refused))
		if refused < 0.9 {
			t.Errorf("%s refused %.0f%% of its requests: the overload must make every backend look refusing (90%%) for the test to mean anything", b.Name(), 100*refused)
		}
	}
	t.Logf("%s; %s", strings.Join(rates, "; "), states.describe())
	for _, b := range backends {
		if states.everOpen(b.Name()) {
			t.Errorf("%s was opened in a pool-wide overload: %s", b.Name(), states.openReason(b.Name()))
		}
	}
}

// stateLog follows a pool's snapshots: each backend's latest state, the
// reason of its first opening, and how many times it entered half_open.
type stateLog struct {
	mu        sync.Mutex
	last      *fleetwatch.Snapshot
	state     map[string]fleetwatch.State
	opened    map[string]string // backend -> the reason of its first opening
	halfOpen  map[string]int
	snapshots int
}

func watchStates(t *testing.T, nc *nats.Conn, pool string) *stateLog {
	t.Helper()
	l := &stateLog{state: map[string]fleetwatch.State{}, opened: map[string]string{}, halfOpen: map[string]int{}}
	sub, err := nc.Subscribe(fleetwatch.Subjects{}.Decisions(pool), func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if json.Unmarshal(m.Data, &s) != nil {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if !s.NewerThan(l.last) {
			return
		}
		l.last = &s
		l.snapshots++
		for _, b := range s.Backends {
			prev := l.state[b.Backend]
			if b.State == fleetwatch.StateOpen {
				if _, seen := l.opened[b.Backend]; !seen {
					l.opened[b.Backend] = b.Reason
				}
			}
			if b.State == fleetwatch.StateHalfOpen && prev != fleetwatch.StateHalfOpen {
				l.halfOpen[b.Backend]++
			}
			l.state[b.Backend] = b.State
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return l
}

func (l *stateLog) everOpen(backend string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.opened[backend]
	return ok
}

func (l *stateLog) openReason(backend string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.opened[backend]
}

// halfOpens returns how many times each backend entered half_open so far.
func (l *stateLog) halfOpens() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.halfOpen))
	for k, v := range l.halfOpen {
		out[k] = v
	}
	return out
}

func (l *stateLog) describe() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		return "no snapshot"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshots; ", l.snapshots)
	for _, be := range l.last.Backends {
		if be.State != fleetwatch.StateClosed || be.Weight < 1 {
			fmt.Fprintf(&b, "%s=%s w=%.2f (%s); ", be.Backend, be.State, be.Weight, be.Reason)
		}
	}
	return b.String()
}
