package route

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/retryhint"
	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// newTestServer serves h on a loopback port until the test ends.
func newTestServer(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func TestNewValidates(t *testing.T) {
	ok := Backend{ID: "b", URL: "http://127.0.0.1:1"}
	tests := []struct {
		name     string
		settings Settings
		mention  string // the error names it
	}{
		{"no pools", Settings{}, "no pools"},
		{"no pool id", Settings{Pools: []Pool{{Backends: []Backend{ok}}}}, "pools[0]"},
		{"no backends", Settings{Pools: []Pool{{ID: "llama"}}}, "pools[0] (llama)"},
		{"no url", Settings{Pools: []Pool{{ID: "llama", Backends: []Backend{ok, {ID: "b2"}}}}}, "pools[0].backends[1] (b2)"},
		{"bad url", Settings{Pools: []Pool{{ID: "llama", Backends: []Backend{{ID: "b", URL: "ftp://x"}}}}}, `"ftp://x"`},
		{"no scheme", Settings{Pools: []Pool{{ID: "llama", Backends: []Backend{{ID: "b", URL: "127.0.0.1:80"}}}}}, `"127.0.0.1:80"`},
		{"duplicate backend", Settings{Pools: []Pool{{ID: "llama", Backends: []Backend{ok, ok}}}}, "(b)"},
		{"duplicate pool", Settings{Pools: []Pool{{ID: "p", Backends: []Backend{ok}}, {ID: "p", Backends: []Backend{ok}}}}, `"p"`},
		{"prefix from", Settings{Pools: []Pool{{ID: "p", Backends: []Backend{ok}}}, PrefixFrom: "user"}, `"user"`},
		{"max attempts", Settings{Pools: []Pool{{ID: "p", Backends: []Backend{ok}}}, MaxAttempts: -1}, "MaxAttempts"},
		{"unknown score", Settings{Pools: []Pool{{ID: "p", Backends: []Backend{ok}, Picker: p2c.Settings{Score: p2c.Score{Name: "fastest"}}}}}, `"fastest"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.settings)
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v, want ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("error %q does not name %s", err, tt.mention)
			}
		})
	}
}

// New applies its defaults to its own copy: the caller's Settings and
// pools are not changed.
func TestNewDoesNotMutateSettings(t *testing.T) {
	s := Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: "http://127.0.0.1:1"}}}}}
	want := Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: "http://127.0.0.1:1"}}}}}
	rt, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if diff := cmp.Diff(want, s, cmp.Comparer(func(a, b func() time.Time) bool { return a == nil && b == nil })); diff != "" {
		t.Errorf("settings changed (-want +got):\n%s", diff)
	}
	if rt.maxAttempts != 3 || rt.source != "route" || rt.prefixFrom != PrefixSystem || rt.maxBody != 32<<20 || rt.idleGap != 5*time.Minute {
		t.Errorf("defaults: attempts %d source %q prefix %q body %d idle %v", rt.maxAttempts, rt.source, rt.prefixFrom, rt.maxBody, rt.idleGap)
	}
}

func TestBackendTarget(t *testing.T) {
	tests := []struct{ base, path, want string }{
		{"http://h:1", "/v1/completions", "http://h:1/v1/completions"},
		{"http://h:1/", "/v1/completions", "http://h:1/v1/completions"},
		{"http://h:1/v1", "/v1/chat/completions", "http://h:1/v1/chat/completions"},
		{"https://api.example.com/openai/v1/", "/v1/embeddings", "https://api.example.com/openai/v1/embeddings"},
	}
	for _, tc := range tests {
		rt, err := New(Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: tc.base}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := rt.core.pools["p"].backends["b"].target(tc.path); got != tc.want {
			t.Errorf("%s + %s = %s, want %s", tc.base, tc.path, got, tc.want)
		}
	}
}

// The route's side of the retry hint: headers are read in any case
// (http.Header canonicalizes) and the body is put back after a read.
func TestRetryAfterMs(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
		want   float64
	}{
		{"none", 429, http.Header{}, "", 0},
		{"seconds", 503, http.Header{"Retry-After": {"2"}}, "", 2000},
		{"ms wins", 429, http.Header{"Retry-After": {"2"}, "Retry-After-Ms": {"1500"}}, "", 1500},
		{"date", 503, http.Header{"Retry-After": {now.Add(3 * time.Second).Format(http.TimeFormat)}}, "", 3000},
		{"date past", 429, http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, "", 0},
		{"garbage", 429, http.Header{"Retry-After": {"soon"}}, "", 0},
		{"capped at an hour", 429, http.Header{"Retry-After": {"99999999"}}, "", retryhint.MaxMs},
		{"openai", 429, http.Header{"X-Ratelimit-Reset-Requests": {"2m0s"}}, "", 120_000},
		{"anthropic", 429, http.Header{"Anthropic-Ratelimit-Tokens-Reset": {"2026-12-02T08:00:09Z"}}, "", 9000},
		{"body", 429, http.Header{"Content-Type": {"application/json"}}, `{"error":{"retryDelay":"7s"}}`, 7000},
		{"stream body not read", 429, http.Header{"Content-Type": {"text/event-stream"}}, `data: {"retryDelay":"7s"}`, 0},
	}
	rt, err := New(Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: "http://127.0.0.1:1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		resp := &http.Response{StatusCode: tc.status, Header: tc.header, Body: io.NopCloser(strings.NewReader(tc.body))}
		if got := rt.retryHint("p", resp, now).Ms; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if got, _ := io.ReadAll(resp.Body); string(got) != tc.body {
			t.Errorf("%s: body read back %q, want %q", tc.name, got, tc.body)
		}
	}
	var text strings.Builder
	rt.metrics.set.WritePrometheus(&text)
	if want := `fleetwatch_route_retry_hint_malformed_total{pool="p",source="retry-after"} 1`; !strings.Contains(text.String(), want) {
		t.Errorf("metrics lack %s:\n%s", want, text.String())
	}
}

// Two pools: a request goes to the pool naming its model; an unknown model
// is ErrUnknownModel, a 404 by default.
func TestRouteTwoPools(t *testing.T) {
	backends := testkit.StartFakeBackends(t, 2)
	rt, err := New(Settings{Pools: []Pool{
		{ID: "llama", Models: []string{"llama-3.1-70b"}, Backends: []Backend{{ID: "b0", URL: backends[0].URL()}}},
		{ID: "qwen", Backends: []Backend{{ID: "b1", URL: backends[1].URL() + "/v1"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if diff := cmp.Diff([]string{"llama", "qwen"}, rt.Pools()); diff != "" {
		t.Errorf("Pools (-want +got):\n%s", diff)
	}
	c := testkit.NewChatClient(newTestServer(t, rt))
	for model, want := range map[string]string{"llama": "b0", "llama-3.1-70b": "b0", "qwen": "b1"} {
		r, err := c.Post("/v1/completions", map[string]any{"model": model, "prompt": "x"})
		if err != nil || r.Status != 200 || r.Backend != want {
			t.Errorf("model %s: %v status %d from %q, want 200 from %s", model, err, r.Status, r.Backend, want)
		}
	}
	r, err := c.Post("/v1/completions", map[string]any{"model": "gpt-9", "prompt": "x"})
	if err != nil || r.Status != 404 || !strings.Contains(string(r.Body), "model_not_found") {
		t.Errorf("unknown model: %v status %d body %s", err, r.Status, r.Body)
	}
	for _, tc := range []struct {
		body string
		want int
	}{{`not json`, 400}, {`{"model":"qwen","prompt":"` + strings.Repeat("x", 40<<20) + `"}`, 413}} {
		resp, err := c.HTTP.Post(c.Base+"/v1/completions", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("body %.20q: status %d, want %d", tc.body, resp.StatusCode, tc.want)
		}
	}
}

// The hooks: Rewrite sees every attempt and its changes reach the backend;
// ErrorHandler answers what no backend can serve, with the sentinel errors.
func TestRouteHooks(t *testing.T) {
	var mu sync.Mutex
	var attempts []Attempt
	var seenAuth, seenHeader []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seenAuth = append(seenAuth, r.Header.Get("Authorization"))
		seenHeader = append(seenHeader, r.Header.Get("X-Tenant"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	}))
	defer backend.Close()
	var handled []error
	now := time.Now()
	rt, err := New(Settings{
		Pools: []Pool{
			{ID: "a", Backends: []Backend{{ID: "x", URL: backend.URL, APIKey: "sk-x"}}},
			{ID: "b", Backends: []Backend{{ID: "y", URL: backend.URL}}},
		},
		Now: func() time.Time { return now },
		Rewrite: func(out *http.Request, a Attempt) {
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
			out.Header.Set("X-Tenant", a.Pool+"/"+a.Backend)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			mu.Lock()
			handled = append(handled, err)
			mu.Unlock()
			http.Error(w, "custom", http.StatusTeapot)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := testkit.NewChatClient(newTestServer(t, rt))
	r, err := c.Post("/v1/completions", map[string]any{"model": "a", "prompt": "x"})
	if err != nil || r.Status != 200 {
		t.Fatalf("%v %d", err, r.Status)
	}
	mu.Lock()
	if diff := cmp.Diff([]Attempt{{Pool: "a", Backend: "x"}}, attempts); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Bearer sk-x"}, seenAuth); diff != "" {
		t.Errorf("Authorization (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a/x"}, seenHeader); diff != "" {
		t.Errorf("rewritten header (-want +got):\n%s", diff)
	}
	mu.Unlock()

	// Shed: pool b's only backend open.
	open := feedtest.Snapshot("b", "e1", 1, now, feedtest.Open("y", now.Add(time.Minute), "x"))
	open.TTLMs = 60_000
	rt.Apply(open)
	r, _ = c.Post("/v1/completions", map[string]any{"model": "b", "prompt": "x"})
	if r.Status != http.StatusTeapot || r.Header.Get("Retry-After") != "60" {
		t.Errorf("shed: status %d Retry-After %q", r.Status, r.Header.Get("Retry-After"))
	}
	r, _ = c.Post("/v1/completions", map[string]any{"model": "nope", "prompt": "x"})
	if r.Status != http.StatusTeapot {
		t.Errorf("unknown model: status %d", r.Status)
	}
	rt.Close()
	rt.Close() // idempotent
	r, _ = c.Post("/v1/completions", map[string]any{"model": "a", "prompt": "x"})
	if r.Status != http.StatusTeapot {
		t.Errorf("closed: status %d", r.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 3 || !errors.Is(handled[0], p2c.ErrShed) || !errors.Is(handled[1], ErrUnknownModel) || !errors.Is(handled[2], ErrClosed) {
		t.Errorf("ErrorHandler saw %v, want shed, unknown model, closed", handled)
	}
	var text strings.Builder
	rt.metrics.set.WritePrometheus(&text)
	if !strings.Contains(text.String(), `fleetwatch_route_requests_total{pool="b",code="418"} 1`) {
		t.Errorf("the handler's status is not counted:\n%s", text.String())
	}
}

// A backend that gives no answer reaches the ErrorHandler as a
// *BackendError; the default answers 502, or 504 for a timeout.
func TestRouteBackendErrors(t *testing.T) {
	backends := testkit.StartFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{Refuse: true})
	backends[1].SetBehavior(fakeai.Behavior{Hang: true})
	for _, tc := range []struct {
		backend *fakeai.Server
		status  int
		typ     string
	}{{backends[0], 502, "bad_gateway"}, {backends[1], 504, "gateway_timeout"}} {
		rt, err := New(Settings{
			Pools:         []Pool{{ID: "p", Backends: []Backend{{ID: tc.backend.Name(), URL: tc.backend.URL()}}}},
			HeaderTimeout: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		c := testkit.NewChatClient(newTestServer(t, rt))
		r, err := c.Post("/v1/completions", map[string]any{"model": "p", "prompt": "x"})
		if err != nil || r.Status != tc.status || r.Backend != tc.backend.Name() || !strings.Contains(string(r.Body), tc.typ) {
			t.Errorf("%s: %v status %d backend %q body %s", tc.backend.Name(), err, r.Status, r.Backend, r.Body)
		}
		rt.Close()
	}
	var be *BackendError
	err := fmt.Errorf("wrapped: %w", &BackendError{Pool: "p", Backend: "b", Err: errors.New("refused")})
	if !errors.As(err, &be) || be.Backend != "b" || be.Timeout() {
		t.Errorf("BackendError: %v", err)
	}
}
