package route

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// A backend that throttles every request, stating its wait only in a
// provider's own header or in its JSON error body: the published event
// carries that wait as retry_after_ms (so the analyzer opens the breaker
// for it, not for its default open time), the client gets the backend's
// answer byte for byte, and a malformed hint is counted.
func TestRouteRetryHintsReachTheEvent(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	// A Google error body larger than the 64 KiB read for the hint, so the
	// client's copy is the held start and the unread rest put together.
	googleBody := `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"180s"}],` +
		`"message":"` + strings.Repeat("quota ", 20_000) + `"}}`
	type answer struct {
		status int
		header map[string]string
		body   string
	}
	cases := []struct {
		name      string
		answer    answer
		wantMs    float64
		malformed string // the source counted malformed, if any
	}{
		{"openai reset only", answer{429, map[string]string{"x-ratelimit-reset-requests": "2m0s", "x-ratelimit-remaining-requests": "0"},
			`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`}, 120_000, ""},
		{"google retryDelay in the body", answer{429, nil, googleBody}, 180_000, ""},
		{"anthropic RFC 3339 reset", answer{429, map[string]string{"anthropic-ratelimit-tokens-reset": now.Add(45 * time.Second).Format(time.RFC3339)},
			`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`}, 45_000, ""},
		{"503 with a body retryDelay", answer{503, nil, `{"error":{"code":503,"retryDelay":"20s"}}`}, 20_000, ""},
		{"malformed reset", answer{429, map[string]string{"x-ratelimit-reset-requests": "soon"}, `{"error":{}}`}, 0, "x-ratelimit-reset-requests"},
	}
	byName := map[string]answer{}
	for _, tc := range cases {
		byName[tc.name] = tc.answer
	}
	backend := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Prompt string }
		json.NewDecoder(r.Body).Decode(&req)
		a := byName[req.Prompt]
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		w.Write([]byte(a.body))
	}))
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	rt := startRouter(t, natsURL, Settings{
		Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: backend}}}},
		Now:   func() time.Time { return now },
	})
	c := testkit.NewChatClient(rt.url)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := c.Post("/v1/completions", map[string]any{"model": "p", "prompt": tc.name})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != tc.answer.status {
				t.Errorf("status %d, want %d", r.Status, tc.answer.status)
			}
			if string(r.Body) != tc.answer.body {
				t.Errorf("the client's body (%d bytes) is not the backend's (%d bytes)", len(r.Body), len(tc.answer.body))
			}
			for k, v := range tc.answer.header {
				if got := r.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			eventually(t, 30*time.Second, "the event", func() bool { return len(log.Events()) > i })
			ev := log.Events()[i]
			type got struct {
				Status  int
				Outcome fleetwatch.Outcome
				Retry   float64
			}
			want := got{tc.answer.status, fleetwatch.OutcomeFromStatus(tc.answer.status), tc.wantMs}
			if diff := cmp.Diff(want, got{ev.Status, ev.Outcome, ev.RetryAfterMs}); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
			if tc.malformed != "" {
				line := `fleetwatch_route_retry_hint_malformed_total{pool="p",source="` + tc.malformed + `"} 1`
				if text := rt.metricsText(); !strings.Contains(text, line) {
					t.Errorf("metrics lack %s:\n%s", line, text)
				}
			}
		})
	}
}

// A throttled attempt whose hint is in its body is retried on the other
// backend: the held body is discarded as before, the event keeps the hint,
// the client gets the second backend's answer.
func TestRouteRetryHintThenRetry(t *testing.T) {
	throttled := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"90s"}]}}`))
	}))
	ok := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}))
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{{ID: "p", Backends: []Backend{
		{ID: "throttled", URL: throttled}, {ID: "ok", URL: ok}}}}, Seed: 1})
	c := testkit.NewChatClient(rt.url)
	// Until the throttled backend has been tried once, the picks may go
	// to ok alone; ask until one request took the retry path.
	eventually(t, 30*time.Second, "a throttled attempt", func() bool {
		r, err := c.Post("/v1/completions", map[string]any{"model": "p", "prompt": "x"})
		if err != nil || r.Status != 200 || r.Backend != "ok" {
			t.Fatalf("%v: status %d backend %q, want 200 from ok", err, r.Status, r.Backend)
		}
		for _, ev := range log.Events() {
			if ev.Backend == "throttled" {
				return true
			}
		}
		return false
	})
	for _, ev := range log.Events() {
		if ev.Backend == "throttled" && ev.RetryAfterMs != 90_000 {
			t.Errorf("throttled event retry_after_ms %v, want 90000", ev.RetryAfterMs)
		}
	}
}
