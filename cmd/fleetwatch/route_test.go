package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// routeConfig writes a config with one pool "llama" (model alias
// "llama-3.1-70b") whose backends are the fakes, and returns its path.
func routeConfig(t testing.TB, natsURL string, backends []*fakeai.Server, extra string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "nats: {url: %q}\npools:\n  - id: llama\n    models: [llama-3.1-70b]\n%s    backends:\n", natsURL, extra)
	for _, s := range backends {
		fmt.Fprintf(&b, "      - id: %s\n        url: %s\n", s.Name(), s.URL())
	}
	path := filepath.Join(t.TempDir(), "fleetwatch.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startRouteCmd runs `fleetwatch route` in-process on a free port and
// returns its base URL; it stops in t.Cleanup.
func startRouteCmd(t testing.TB, configPath string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	all := append([]string{"--config", configPath, "--listen", "127.0.0.1:0", "--source", "test-route"}, args...)
	go func() { done <- runRoute(ctx, all, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("route: %v\nstderr:\n%s", err, stderr.String())
		}
	})
	var url string
	eventually(t, 30*time.Second, "route to listen", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("route exited: %v\nstderr:\n%s", err, stderr.String())
		default:
		}
		out := stdout.String()
		if i := strings.Index(out, "listening on "); i >= 0 {
			url = strings.Fields(out[i+len("listening on "):])[0]
			return true
		}
		return false
	})
	return url
}

// TestRouteProxiesAndPublishesEvents is the smoke test of `fleetwatch
// route` as a command: flags, configuration, NATS, /metrics and /healthz.
// The router's behaviour is tested in feed/route.
func TestRouteProxiesAndPublishesEvents(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := testkit.CollectEvents(t, nc)
	backends := testkit.StartFakeBackends(t, 2)
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	c := testkit.NewChatClient(base)

	direct := &testkit.ChatClient{Base: backends[0].URL(), HTTP: http.DefaultClient}
	want, err := direct.Chat("be brief", "hello world", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		got, err := c.Chat("be brief", "hello world", stream)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != 200 || got.Text != want.Text || got.Backend == "" {
			t.Errorf("stream=%v: status %d backend %q text %q, want 200 and %q", stream, got.Status, got.Backend, got.Text, want.Text)
		}
	}
	// Embeddings and an unknown model.
	if r, err := c.Post("/v1/embeddings", map[string]any{"model": "llama", "input": "x"}); err != nil || r.Status != 200 {
		t.Errorf("embeddings: %v status %d", err, r.Status)
	}
	// One pool: a request for an unknown model still goes there.
	if r, err := c.Post("/v1/completions", map[string]any{"model": "other", "prompt": "x"}); err != nil || r.Status != 200 {
		t.Errorf("unknown model with one pool: %v status %d", err, r.Status)
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct{ Data []struct{ ID string } }
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if diff := cmp.Diff([]string{"llama", "llama-3.1-70b"}, []string{models.Data[0].ID, models.Data[1].ID}); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}

	eventually(t, 30*time.Second, "4 outcome events", func() bool { return len(log.Events()) >= 4 })
	testkit.CheckEchoChatEvents(t, log.Events(), "llama", "test-route")
	if log.Messages("fw.outcomes.test-route") == 0 {
		t.Errorf("no message on fw.outcomes.test-route")
	}

	// The router's metrics count what happened.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`fleetwatch_route_requests_total{pool="llama",code="200"} 4`,
		`fleetwatch_route_events_published_total 4`,
		`fleetwatch_route_decision_age_seconds{pool="llama"} -1`, // no decision yet
		`fleetwatch_route_backend_weight{pool="llama",backend="b0"} 1`,
		`fleetwatch_route_backend_open{pool="llama",backend="b1"} 0`,
		`fleetwatch_route_pick_duration_seconds_count 4`,
		`fleetwatch_route_event_batches_total`,
		`fleetwatch_feed_`, // the watcher's series share the set
	} {
		if !strings.Contains(string(metricsText), want) {
			t.Errorf("metrics lack %q:\n%s", want, metricsText)
		}
	}
	resp, err = http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
}

// The flags reach the router and bad ones are usage errors; a backend
// without a URL is a configuration error that names it.
func TestRouteFlagsAndConfigErrors(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 1)
	cfg := routeConfig(t, natsURL, backends, "")
	for _, args := range [][]string{{"--prefix-from", "user"}, {"--max-attempts", "0"}} {
		var stderr syncBuffer
		err := runRoute(t.Context(), append([]string{"--config", cfg}, args...), io.Discard, &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("%v: %v, stderr %q; want a usage error naming the flag", args, err, stderr.String())
		}
	}
	noURL := filepath.Join(t.TempDir(), "fleetwatch.yaml")
	os.WriteFile(noURL, []byte(fmt.Sprintf("nats: {url: %q}\npools:\n  - id: llama\n    backends:\n      - id: b0\n", natsURL)), 0o600)
	err := runRoute(t.Context(), []string{"--config", noURL}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "pools[0].backends[0] (b0)") {
		t.Errorf("backend without url: %v", err)
	}
}

// The route block's keys reach `fleetwatch route`, and a flag given on the
// command line wins over its key, even when it states the default: the
// file's max_attempts 1 and max_body_bytes 4096 hold without flags;
// --max-attempts 3 and --max-body override them.
func TestRouteFlagsOverrideConfigKeys(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 3)
	for _, b := range backends {
		b.SetBehavior(fakeai.Behavior{InstantError: true})
	}
	path := routeConfig(t, natsURL, backends, "")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "route:\n  max_attempts: 1\n  max_body_bytes: 4096\n")
	f.Close()
	for _, tc := range []struct {
		name         string
		args         []string
		wantAttempts string
		wantBigBody  func(status int) bool
	}{
		{"file", nil, "1", func(s int) bool { return s == http.StatusRequestEntityTooLarge }},
		{"flags", []string{"--max-attempts", "3", "--max-body", "65536"}, "3", func(s int) bool { return s != http.StatusRequestEntityTooLarge }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testkit.NewChatClient(startRouteCmd(t, path, tc.args...))
			r, err := c.Post("/v1/completions", map[string]any{"model": "llama", "prompt": "x"})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Header.Get("X-Fleetwatch-Attempts"); r.Status < 500 || got != tc.wantAttempts {
				t.Errorf("failing backends: status %d after %s attempts, want 5xx after %s", r.Status, got, tc.wantAttempts)
			}
			big, err := c.Post("/v1/completions", map[string]any{"model": "llama", "prompt": strings.Repeat("x", 5000)})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.wantBigBody(big.Status) {
				t.Errorf("a 5000-byte body: status %d", big.Status)
			}
		})
	}
}
