package route

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/fleetwatch/fleetwatch"
)

// countingBackend is an OpenAI-compatible backend on a loopback port that
// counts its requests and answers each with status at once (a short
// completion for 200).
type countingBackend struct {
	id       string
	srv      *httptest.Server
	requests atomic.Int64
	status   atomic.Int64
	delay    atomic.Int64 // time.Duration before the answer
}

func startCountingBackend(t testing.TB, id string, status int) *countingBackend {
	t.Helper()
	b := &countingBackend{id: id}
	b.status.Store(int64(status))
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests.Add(1)
		if d := time.Duration(b.delay.Load()); d > 0 {
			time.Sleep(d)
		}
		code := int(b.status.Load())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if code == http.StatusOK {
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi from %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, id)
			return
		}
		fmt.Fprintf(w, `{"error":{"message":"%s fails","code":%d}}`, id, code)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// serveRouter serves a Router over s on a loopback port, without NATS (the
// test hands it decisions with Apply); everything stops in t.Cleanup.
func serveRouter(t testing.TB, s Settings) (*Router, string) {
	t.Helper()
	rt, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt)
	t.Cleanup(func() {
		srv.Close()
		rt.Close()
	})
	return rt, srv.URL
}

func countingPool(bs ...*countingBackend) Pool {
	p := Pool{ID: "llama", Models: []string{"llama-3.1-70b"}}
	for _, b := range bs {
		p.Backends = append(p.Backends, Backend{ID: b.id, URL: b.srv.URL})
	}
	return p
}

// In failover mode a tier is judged by its weights, through the router:
// a half-open primary gets about its trickle and the next tier the rest; a
// quarantined primary (closed, weight 0, drifted) gets nothing.
func TestRouteFailoverFollowsWeights(t *testing.T) {
	tests := []struct {
		name           string
		primary        fleetwatch.Backend
		minShare, maxS float64 // the band the primary's share of requests must fall in
	}{
		{"half-open primary: a trickle", fleetwatch.Backend{State: fleetwatch.StateHalfOpen, Weight: 0.05, Drift: fleetwatch.DriftOK}, 0.02, 0.09},
		{"quarantined primary: nothing", fleetwatch.Backend{State: fleetwatch.StateClosed, Weight: 0, Drift: fleetwatch.DriftDrifted}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			primary := startCountingBackend(t, "primary", http.StatusOK)
			s1 := startCountingBackend(t, "second-1", http.StatusOK)
			s2 := startCountingBackend(t, "second-2", http.StatusOK)
			pool := countingPool(primary, s1, s2)
			pool.Mode = fleetwatch.ModeFailover
			rt, url := serveRouter(t, Settings{Pools: []Pool{pool}, Seed: 42, PrefixFrom: PrefixNone})

			p := tt.primary
			p.Backend, p.Priority = "primary", 0
			snap := &fleetwatch.Snapshot{
				V: 1, Pool: "llama", Epoch: "e1", Seq: 1, At: fleetwatch.At(time.Now()), TTLMs: 3_600_000,
				Mode: fleetwatch.ModeFailover, AllOpen: fleetwatch.AllOpenShed,
				Backends: []fleetwatch.Backend{
					p,
					{Backend: "second-1", State: fleetwatch.StateClosed, Weight: 1, Priority: 1, Drift: fleetwatch.DriftOK},
					{Backend: "second-2", State: fleetwatch.StateClosed, Weight: 1, Priority: 1, Drift: fleetwatch.DriftOK},
				},
			}
			rt.Apply(snap)

			c := testkit.NewChatClient(url)
			const n = 1000
			for i := range n {
				if r, err := c.Chat("", fmt.Sprint(i), false); err != nil || r.Status != http.StatusOK {
					t.Fatalf("request %d: %v, status %d", i, err, r.Status)
				}
			}
			got := []int64{primary.requests.Load(), s1.requests.Load(), s2.requests.Load()}
			if got[0]+got[1]+got[2] != n {
				t.Fatalf("requests per backend %v, want %d in all", got, n)
			}
			if share := float64(got[0]) / n; share < tt.minShare || share > tt.maxS {
				t.Errorf("the primary got %d of %d requests (share %.3f), want a share in [%.2f, %.2f]; per backend %v",
					got[0], n, share, tt.minShare, tt.maxS, got)
			}
			if got[1] < n/3 || got[2] < n/3 {
				t.Errorf("the second tier is not balanced: %v", got)
			}
		})
	}
}
