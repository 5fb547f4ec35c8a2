package route

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// events records what a router publishes.
type events struct {
	mu  sync.Mutex
	evs []fleetwatch.Event
}

func (e *events) Publish(ev fleetwatch.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// A quota's 429 (a retry hint of days) is published with the hour
// retry_after_ms may carry and the whole wait in quota_reset_ms; a 503
// that a scheduler in front of the backend marked as dropped, and a 529,
// are published as sheds.
func TestRoutePublishesQuotasAndSheds(t *testing.T) {
	for _, c := range []struct {
		name      string
		status    int
		header    [2]string
		wantQuota float64
		wantShed  string
	}{
		{"spend limit", 429, [2]string{"retry-after-ms", "274579000"}, 274_579_000, ""},
		{"short hint", 429, [2]string{"retry-after", "2"}, 0, ""},
		{"dropped by the scheduler", 503, [2]string{"x-llm-d-request-dropped-reason", "queue_full"}, 0, "queue_full"},
		{"overloaded frontend", 529, [2]string{}, 0, "overloaded_529"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.header[0] != "" {
					w.Header().Set(c.header[0], c.header[1])
				}
				w.WriteHeader(c.status)
			}))
			defer srv.Close()
			pub := &events{}
			rt, err := New(Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: srv.URL}}}},
				MaxAttempts: 1, Publisher: pub})
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(rt)
			defer front.Close()
			resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"p","messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			pub.mu.Lock()
			defer pub.mu.Unlock()
			if len(pub.evs) != 1 {
				t.Fatalf("%d events published, want 1", len(pub.evs))
			}
			ev := pub.evs[0]
			if ev.QuotaResetMs != c.wantQuota || ev.Shed != c.wantShed || ev.RetryAfterMs > fleetwatch.MaxDurationMs {
				t.Errorf("event retry_after_ms %v quota_reset_ms %v shed %q; want quota %v shed %q",
					ev.RetryAfterMs, ev.QuotaResetMs, ev.Shed, c.wantQuota, c.wantShed)
			}
		})
	}
}

// With Why, a response says why its backend stood where it did; without,
// nothing of it.
func TestRouteWhyHeaders(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"model":"p","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`))
	}))
	defer srv.Close()
	for _, why := range []bool{false, true} {
		rt, err := New(Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: srv.URL}}}}, Why: why})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		rt.Apply(&fleetwatch.Snapshot{V: 1, Pool: "p", Epoch: "e", Seq: 1, At: fleetwatch.At(now), TTLMs: 60000,
			Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
			Backends: []fleetwatch.Backend{{Backend: "b", State: fleetwatch.StateClosed, Weight: 0.5}}})
		front := httptest.NewServer(rt)
		resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"p","messages":[{"role":"user","content":"hi"}]}`))
		front.Close()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := [3]string{resp.Header.Get(HeaderState), resp.Header.Get(HeaderWeight), resp.Header.Get(HeaderReasonClass)}
		want := [3]string{}
		if why {
			want = [3]string{"closed", "0.5", WhyDownWeighted}
		}
		if got != want || (why && resp.Header.Get(HeaderDecisionAge) == "") {
			t.Errorf("why %v: headers %v, want %v and an age", why, got, want)
		}
	}
}
