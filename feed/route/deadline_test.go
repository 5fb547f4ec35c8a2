package route

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// stallFloor is the tests' first-token deadline: short, so that a test
// waits little for each stalled attempt.
const stallFloor = 200 * time.Millisecond

// TestRouteStallDeadline: a backend that accepts requests and sends no
// first token (no headers at all, or a stream's headers and role chunk and
// then nothing) has its attempts ended at the first-token deadline, well
// before the client's own timeout; the request is retried on the healthy
// backend, and a stalled outcome event is published for the staller.
func TestRouteStallDeadline(t *testing.T) {
	tests := []struct {
		name     string
		behavior fakeai.Behavior
		stream   bool
	}{
		{"no headers", fakeai.Behavior{Hang: true}, false},
		{"no headers, streaming", fakeai.Behavior{Hang: true}, true},
		// The fake streams its headers and a role-only chunk at once, then
		// the first content after TTFT.
		{"headers but no first token", fakeai.Behavior{TTFT: time.Minute}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			natsURL, _ := feedtest.NewServer(t)
			log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
			backends := testkit.StartFakeBackends(t, 2)
			backends[0].SetBehavior(tt.behavior)
			pool := llamaPool(backends)
			pool.Picker.RetryRatio = 10 // the budget is p2c's, tested there
			rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}, StallFloor: stallFloor})
			c := testkit.NewChatClient(rt.url)
			retried := 0
			for i := 0; retried < 2; i++ {
				if i > 1000 {
					t.Fatal("the picker never chose b0")
				}
				r, err := c.Chat("", fmt.Sprint(i), tt.stream)
				if err != nil || r.Status != 200 || r.Backend != "b1" || r.Text != fmt.Sprintf("user: %d user: %d", i, i) {
					t.Fatalf("request %d: %v, status %d from %q, text %q: want b1's whole answer", i, err, r.Status, r.Backend, r.Text)
				}
				if r.Header.Get("X-Fleetwatch-Attempts") == "2" {
					retried++
				}
			}
			// The stalled attempts were ended, not left to hang: the
			// backend saw its requests canceled.
			testkit.Eventually(t, 10*time.Second, "b0 to see its requests canceled", func() bool {
				return backends[0].Stats().Canceled >= 2
			})
			testkit.Eventually(t, 10*time.Second, "stalled events for b0", func() bool {
				n := 0
				for _, ev := range log.Events() {
					if ev.Backend == "b0" {
						if ev.Outcome != fleetwatch.OutcomeStalled || ev.Status != 0 || !ev.HasStatus || ev.HasTTFT ||
							ev.DurationMs < float64(stallFloor/time.Millisecond) {
							t.Fatalf("b0 event %+v: want stalled, status 0, no TTFT, duration >= the deadline", ev)
						}
						n++
					}
				}
				return n == retried
			})
			for _, ev := range log.Events() {
				if ev.Backend == "b1" && ev.Outcome != fleetwatch.OutcomeOK {
					t.Errorf("b1 event %+v, want ok", ev)
				}
			}
		})
	}
}

// TestRouteStallCountsFromSend: the first-token deadline starts when the
// request is sent, so the time the router spends before it (here a Rewrite
// hook that takes 50 ms) neither shortens the backend's deadline nor makes
// a stalled attempt's duration shorter than the deadline. Before, the
// deadline started before the request was built, and under a loaded
// machine a stalled event reported 199 ms against a 200 ms deadline.
func TestRouteStallCountsFromSend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	backends := testkit.StartFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	const build = 50 * time.Millisecond
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}, StallFloor: stallFloor,
		Rewrite: func(*http.Request, Attempt) { time.Sleep(build) }})
	r, err := testkit.NewChatClient(rt.url).Chat("", "hello", false)
	if err != nil || r.Status != http.StatusGatewayTimeout {
		t.Fatalf("request: %v, status %d; want 504 (the only backend stalls)", err, r.Status)
	}
	testkit.Eventually(t, 10*time.Second, "a stalled event for b0", func() bool {
		return len(log.Events()) > 0
	})
	ev := log.Events()[0]
	if ev.Outcome != fleetwatch.OutcomeStalled || ev.DurationMs < float64(stallFloor/time.Millisecond) {
		t.Errorf("event %+v: want stalled with a duration of at least the %v deadline", ev, stallFloor)
	}
}

// TestRouteStallLastAttempt: with no other backend to retry on, a stalled
// attempt is a 504 for the client, whose error wraps ErrStalled.
func TestRouteStallLastAttempt(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	var got error
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}, StallFloor: stallFloor,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			DefaultErrorHandler(w, r, err)
		}})
	r, err := testkit.NewChatClient(rt.url).Chat("", "x", true)
	if err != nil || r.Status != 504 {
		t.Fatalf("%v, status %d; want 504", err, r.Status)
	}
	var be *BackendError
	if !errors.Is(got, ErrStalled) || !errors.As(got, &be) || be.Backend != "b0" || !be.Timeout() {
		t.Errorf("ErrorHandler got %v, want a timeout *BackendError of b0 wrapping ErrStalled", got)
	}
	if !strings.Contains(rt.metricsText(), `fleetwatch_route_attempts_total{pool="llama",backend="b0",code="0"} 1`) {
		t.Errorf("the stalled attempt is not counted:\n%s", rt.metricsText())
	}
}

// TestStallDeadline checks the deadline's arithmetic: max(floor, multiple x
// the largest p95 TTFT of the backends not open), the floor alone without
// p95s, and nothing when turned off.
func TestStallDeadline(t *testing.T) {
	p95 := func(id string, ms float64) fleetwatch.Backend {
		b := feedtest.Closed(id)
		b.P95TTFTMs = &ms
		return b
	}
	now := time.Now()
	openC := p95("c", 60000)
	openC.State = fleetwatch.StateOpen
	tests := []struct {
		name     string
		settings Settings
		backends []fleetwatch.Backend // nil: no decision applied
		want     time.Duration
	}{
		{"default floor without a decision", Settings{}, nil, 10 * time.Second},
		{"default floor above 8 x p95", Settings{}, []fleetwatch.Backend{p95("a", 500), p95("b", 800)}, 10 * time.Second},
		{"8 x the largest p95", Settings{}, []fleetwatch.Backend{p95("a", 3000), p95("b", 4000), p95("c", 1000)}, 32 * time.Second},
		{"an open backend is left out", Settings{StallMultiple: 2},
			[]fleetwatch.Backend{p95("a", 6000), p95("b", 7000), openC}, 14 * time.Second},
		{"backends without p95 are left out", Settings{StallFloor: time.Second},
			[]fleetwatch.Backend{feedtest.Closed("a"), p95("b", 1000)}, 8 * time.Second},
		{"off", Settings{StallFloor: -1}, []fleetwatch.Backend{p95("a", 3000)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.settings
			s.Pools = []Pool{{ID: "p", Backends: []Backend{
				{ID: "a", URL: "http://127.0.0.1:1"}, {ID: "b", URL: "http://127.0.0.1:2"}, {ID: "c", URL: "http://127.0.0.1:3"}}}}
			rt, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			if tt.backends != nil {
				rt.Apply(feedtest.Snapshot("p", "e", 1, now, tt.backends...))
			}
			if got := rt.stallDeadline(rt.core.pools["p"]); got != tt.want {
				t.Errorf("deadline %v, want %v", got, tt.want)
			}
		})
	}
	for _, m := range []float64{-1, math.Inf(1)} {
		_, err := New(Settings{StallMultiple: m, Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "a", URL: "http://127.0.0.1:1"}}}}})
		if !errors.Is(err, ErrConfig) {
			t.Errorf("StallMultiple %v: New = %v, want ErrConfig", m, err)
		}
	}
}
