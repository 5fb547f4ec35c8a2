package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// countingBackend is an HTTP backend on a loopback socket that counts the
// requests it gets and answers 200, 503 while failing, or 429 while
// throttling (with Retry-After: retryAfter when it is not empty).
type countingBackend struct {
	url        string
	hits       atomic.Int64
	last       atomic.Int64 // unix ns of the latest request
	failing    atomic.Bool
	throttling atomic.Bool
	retryAfter atomic.Value // string
}

func startCountingBackend(t *testing.T, name string) *countingBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &countingBackend{url: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		b.hits.Add(1)
		b.last.Store(time.Now().UnixNano())
		if b.failing.Load() {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		if b.throttling.Load() {
			if ra, _ := b.retryAfter.Load().(string); ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			http.Error(w, "rate limited", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, `{"backend":%q}`, name)
	})}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return b
}

// toolPath finds a tool on PATH, or returns its Debian path for
// testkit.RequireTool to report missing.
func toolPath(name string) string { return testkit.ToolPath(name) }

// nodeRouterDir copies examples/node-router (without node_modules) into a
// temporary directory and runs `npm ci` there.
func nodeRouterDir(t *testing.T, npm string) string {
	t.Helper()
	src := filepath.Join("..", "..", "examples", "node-router")
	dir := t.TempDir()
	for _, name := range []string{"package.json", "package-lock.json", "decisions.js", "router.js", "test/decisions.test.js"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in a copy of examples/node-router: %v\n%s", err, out)
	}
	return dir
}

var nodeRouterListen = regexp.MustCompile(`node-router: listening on (http://\S+)`)

// TestNodeRouterExample runs examples/node-router, a router in Node with
// the nats npm client alone, beside a real `fleetwatch serve`: the router
// reads the pool's snapshot from the KV bucket at start, its outcome events
// reach the analyzer (a backend failing through it is opened), it follows
// the decisions (the open backend gets no requests), and its event for a
// 429 carries the answer's Retry-After as retry_after_ms (none for a bare
// 429).
func TestNodeRouterExample(t *testing.T) {
	t.Parallel() // its own servers and processes: overlaps the rest of the package
	node := testkit.RequireTool(t, toolPath("node"), "nodejs")
	npm := testkit.RequireTool(t, toolPath("npm"), "npm")
	dir := nodeRouterDir(t, npm)

	// The example's own unit tests (ordering, fences, staleness, weights).
	if out, err := exec.Command(node, "--test", filepath.Join(dir, "test")).CombinedOutput(); err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}

	sp := startServeProcess(t, "probes: {disabled: true}\npools:\n  - id: llama\n    backends: [{id: b0}, {id: b1}, {id: b2}]\n", "--no-probes")
	nc := feedtest.Connect(t, sp.natsURL)
	snaps := testkit.SubscribeSnapshots(t, nc)
	var evMu sync.Mutex
	var fromRouter []fleetwatch.Event
	sub, err := nc.Subscribe("fw.outcomes.>", func(m *nats.Msg) {
		var d fleetwatch.Decoder
		var ev fleetwatch.Event
		if err := d.Decode(m.Data, &ev); err != nil {
			t.Errorf("the router published an event that breaks the protocol: %v: %s", err, m.Data)
			return
		}
		if m.Subject == "fw.outcomes.node-router" && ev.Source == "node-router" {
			evMu.Lock()
			fromRouter = append(fromRouter, ev)
			evMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the pool's snapshot in the KV bucket", func() bool {
		kv, err := js.KeyValue("fw_decisions")
		if err != nil {
			return false
		}
		_, err = kv.Get("llama")
		return err == nil
	})

	backends := map[string]*countingBackend{}
	var list []string
	for _, name := range []string{"b0", "b1", "b2"} {
		backends[name] = startCountingBackend(t, name)
		list = append(list, name+"="+backends[name].url)
	}
	backends["b2"].failing.Store(true)

	var out syncBuffer
	router := exec.Command(node, filepath.Join(dir, "router.js"))
	router.Env = append(os.Environ(), "NATS_URL="+sp.natsURL, "POOL=llama", "BACKENDS="+strings.Join(list, ","), "LISTEN=127.0.0.1:0")
	router.Stdout, router.Stderr = &out, &out
	if err := router.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { router.Wait(); close(exited) }()
	t.Cleanup(func() {
		router.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			router.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("node router output:\n%s", out.String())
		}
	})
	var base string
	testkit.Eventually(t, 20*time.Second, "the node router to listen", func() bool {
		select {
		case <-exited:
			t.Fatalf("the node router exited:\n%s", out.String())
		default:
		}
		m := nodeRouterListen.FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	if !strings.Contains(out.String(), "fw_decisions/llama from KV: applied") {
		t.Errorf("the router did not apply the KV's snapshot at start:\n%s", out.String())
	}

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	send := func() (backend string, status int) {
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama"}`))
		if err != nil {
			t.Fatalf("request through the node router: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-Fw-Backend"), resp.StatusCode
	}

	// b2 fails through the router; only the router's events can open it.
	testkit.Eventually(t, 20*time.Second, "b2 to open from the node router's events", func() bool {
		for range 10 {
			send()
		}
		b, ok := snaps.Backend("llama", "b2")
		return ok && b.State == fleetwatch.StateOpen
	})
	evMu.Lock()
	var b2Errors int
	for _, ev := range fromRouter {
		if ev.Backend == "b2" && ev.Status == 503 && ev.Outcome == fleetwatch.OutcomeError && ev.Pool == "llama" {
			b2Errors++
		}
	}
	evMu.Unlock()
	if b2Errors == 0 {
		t.Errorf("no 503 event of b2 from the node router on fw.outcomes.node-router")
	}

	type routerState struct {
		States map[string]string `json:"states"`
		Stale  bool              `json:"stale"`
	}
	testkit.Eventually(t, 10*time.Second, "the node router to apply b2 open", func() bool {
		_, body := testkit.HTTPGet(t, base+"/fw/state")
		var st routerState
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("/fw/state: %v: %s", err, body)
		}
		return st.States["b2"] == "open" && !st.Stale
	})
	for _, b := range backends {
		b.hits.Store(0)
	}
	picks := map[string]int{}
	for range 60 {
		backend, status := send()
		if status != http.StatusOK {
			t.Errorf("status %d from %s with b2 open", status, backend)
		}
		picks[backend]++
	}
	if n := backends["b2"].hits.Load(); n != 0 || picks["b2"] != 0 {
		t.Errorf("open b2 got %d requests (%d picks); picks %v", n, picks["b2"], picks)
	}
	if picks["b0"] == 0 || picks["b1"] == 0 {
		t.Errorf("the healthy backends should share the traffic: %v", picks)
	}

	// b1 throttles: a quota's 429 (Retry-After: 2), then a full queue's.
	for _, c := range []struct {
		retryAfter string
		wantMs     float64
	}{{"2", 2000}, {"", 0}} {
		backends["b1"].retryAfter.Store(c.retryAfter)
		backends["b1"].throttling.Store(true)
		// Events of the phase before may still be on their way: only
		// requests sent from now on count (an event's ts is when the
		// router received the request; ms precision).
		since := time.Now().Add(time.Millisecond)
		var got *fleetwatch.Event
		testkit.Eventually(t, 20*time.Second, "a throttled event of b1 from the node router", func() bool {
			for range 5 {
				send()
			}
			evMu.Lock()
			defer evMu.Unlock()
			for _, ev := range fromRouter {
				if ev.Backend == "b1" && ev.Outcome == fleetwatch.OutcomeThrottled && ev.TS.After(since) {
					got = &ev
					return true
				}
			}
			return false
		})
		if got.Status != http.StatusTooManyRequests || got.RetryAfterMs != c.wantMs {
			t.Errorf("Retry-After %q: event status %d, retry_after_ms %v, want 429 and %v", c.retryAfter, got.Status, got.RetryAfterMs, c.wantMs)
		}
		backends["b1"].throttling.Store(false)
	}
}
