package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// parseConfig is a configuration file with NATS at natsURL, pool p over
// the backends and the route block route (YAML, may be empty).
func parseConfig(t *testing.T, natsURL string, backends []*fakeai.Server, route string) *config.Config {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "nats: {url: %q}\npools:\n  - id: p\n    backends:\n", natsURL)
	for _, s := range backends {
		fmt.Fprintf(&b, "      - id: %s\n        url: %s\n", s.Name(), s.URL())
	}
	b.WriteString(route)
	cfg, err := config.Parse([]byte(b.String()), "fleetwatch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRouterLifecycle(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	cfg := parseConfig(t, natsURL, testkit.StartFakeBackends(t, 1), "")
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		r, err := New(cfg, Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return testkit.Lifecycle{Run: r.Run, Close: r.Close, Ready: r.Ready(), Once: true}
	}, ErrRunning, ErrClosed)
}

func TestNewWithoutPools(t *testing.T) {
	if _, err := New(config.Default(), Options{}); !errors.Is(err, ErrNoPools) {
		t.Errorf("New without pools: %v, want ErrNoPools", err)
	}
	natsURL, _ := feedtest.NewServer(t)
	cfg := parseConfig(t, natsURL, testkit.StartFakeBackends(t, 1), "")
	cfg.Pools[0].Backends[0].URL = ""
	if _, err := New(cfg, Options{}); !errors.Is(err, route.ErrConfig) {
		t.Errorf("New with a backend without url: %v, want route.ErrConfig", err)
	}
}

// The assembly serves the router's API, /metrics and /healthz on a real
// socket, publishes the outcome events on <prefix>.outcomes.<source>, and
// the route block's keys reach the router: max_attempts bounds the
// attempts on failing backends, max_body_bytes the request body.
func TestRouterServesWithTheRouteBlock(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	events := testkit.CollectEvents(t, nc)
	backends := testkit.StartFakeBackends(t, 3)
	cfg := parseConfig(t, natsURL, backends, "route:\n  max_attempts: 2\n  max_body_bytes: 4096\n")
	r, err := New(cfg, Options{Source: "edge.1", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.Subject() != "fw.outcomes.edge_1" {
		t.Errorf("subject %q, want fw.outcomes.edge_1", r.Subject())
	}
	chat := testkit.NewChatClient(r.URL())
	if got, err := chat.Post("/v1/completions", map[string]any{"model": "p", "prompt": "hello"}); err != nil || got.Status != 200 {
		t.Fatalf("completion: %v status %d", err, got.Status)
	}

	// Every backend fails at once: two attempts, then the error.
	for _, b := range backends {
		b.SetBehavior(fakeai.Behavior{InstantError: true})
	}
	got, err := chat.Post("/v1/completions", map[string]any{"model": "p", "prompt": "fail"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status < 500 || got.Header.Get("X-Fleetwatch-Attempts") != "2" {
		t.Errorf("failing backends: status %d, %s attempts; want 5xx after 2 (route.max_attempts)", got.Status, got.Header.Get("X-Fleetwatch-Attempts"))
	}
	big, err := chat.Post("/v1/completions", map[string]any{"model": "p", "prompt": strings.Repeat("x", 5000)})
	if err != nil {
		t.Fatal(err)
	}
	if big.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 5000-byte body: status %d, want 413 (route.max_body_bytes 4096)", big.Status)
	}

	testkit.Eventually(t, 20*time.Second, "3 outcome events on fw.outcomes.edge_1", func() bool {
		return len(events.Events()) >= 3 && events.Messages("fw.outcomes.edge_1") > 0
	})
	for _, ev := range events.Events() {
		if ev.Source != "edge.1" || ev.Pool != "p" {
			t.Errorf("event source %q pool %q, want edge.1 and p", ev.Source, ev.Pool)
		}
	}
	status, body := testkit.HTTPGet(t, r.URL()+"/metrics")
	for _, want := range []string{`fleetwatch_route_requests_total{pool="p",code="200"} 1`, "fleetwatch_route_events_published_total", "fleetwatch_feed_"} {
		if status != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics: status %d, lacks %q", status, want)
		}
	}
	if status, _ := testkit.HTTPGet(t, r.URL()+"/healthz"); status != 200 {
		t.Errorf("/healthz: %d", status)
	}
	var b strings.Builder
	r.Metrics().WritePrometheus(&b)
	if !strings.Contains(b.String(), "fleetwatch_route_requests_total") {
		t.Errorf("Metrics() is not the set /metrics serves")
	}

	// Close drains: Run has returned, the socket is closed.
	r.Close()
	resp, err := http.Get(r.URL() + "/healthz")
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		t.Errorf("after Close: /healthz answered %d", resp.StatusCode)
	}
}
