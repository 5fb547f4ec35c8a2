package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestCaddySteeredByPick runs docs/INTEGRATIONS.md's Caddyfile, as the
// document writes it, with real Caddy 2.6 asking `fleetwatch epp`'s
// /v1/pick through forward_auth, `fleetwatch serve` and three fake
// backends. Caddy's own outcomes reach no fleetwatch adapter, so the
// decisions here come from operator overrides (`fleetwatch override
// force-open`). It checks:
//
//   - every request goes to the backend the pick names (the backend that
//     answered is the one in X-Fleetwatch-Backend), and none to a backend
//     forced open;
//   - a backend failing while its decision is closed: its 500s reach the
//     client (Caddy 2.6 cannot retry a steered attempt), as the document
//     says;
//   - the pick service killed: Caddy keeps answering 200 through
//     handle_errors (fail open), and steers again once it is back;
//   - every backend open: the pick's 503 with Retry-After and
//     X-Fleetwatch-Shed reaches the client, and no backend sees the request.
func TestCaddySteeredByPick(t *testing.T) {
	t.Parallel() // its own servers and processes
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs real Caddy for several seconds")
	}
	caddyBin := testkit.RequireTool(t, "/usr/bin/caddy", "caddy")
	natsURL, _ := feedtest.NewServer(t)
	decisions := watchDecisions(t, feedtest.Connect(t, natsURL), "llama")
	backends := testkit.StartFakeBackends(t, 3)
	healthy := fakeai.Behavior{TTFT: 10 * time.Millisecond, TokenTime: 500 * time.Microsecond}
	for _, b := range backends {
		b.SetBehavior(healthy)
	}
	// The decisions come from overrides, which key frames carry in full:
	// epp follows the compact feed (route.feed's default).
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {max_open_fraction: 1, slow_factor: 50}\n")
	serveP := startProc(t, true, "serve", "--nats", natsURL, "--config", cfg, "--http", "127.0.0.1:0",
		"--data", t.TempDir(), "--no-probes")
	pickAddr := freeLoopbackAddr(t)
	pick := startPickService(t, cfg, pickAddr)
	base := startCaddy(t, caddyBin, backends, pickAddr)
	c := testkit.NewChatClient(base)
	eventually(t, 30*time.Second, "a first decision", func() bool { return decisions.state("b0") == "closed" })

	served := caddyRound(t, c, 30, true)
	if len(served) != 3 {
		t.Errorf("30 requests served by %v: want all three backends", served)
	}
	forceOpen(t, serveP.HTTPAddr, pickAddr, "b1")
	if served := caddyRound(t, c, 30, true); served["b1"] != 0 {
		t.Errorf("b1, forced open, served %d of 30 requests", served["b1"])
	}

	// A failing backend the decisions do not know of: no retry.
	backends[2].SetBehavior(fakeai.Behavior{InstantError: true})
	failed := 0
	for i := range 30 {
		r, err := c.Chat("", fmt.Sprint("failing ", i), false)
		if err == nil && r.Status == http.StatusInternalServerError && r.Header.Get("X-Fakeai-Name") == "b2" {
			failed++
		}
	}
	if failed == 0 {
		t.Error("b2 fails fast and its decision is closed, yet no 500 of it reached the client: the document says Caddy 2.6 cannot retry a steered attempt")
	}
	backends[2].SetBehavior(healthy)

	pick.cmd.Process.Kill()
	<-pick.done
	if served := caddyRound(t, c, 30, false); served[""] != 30 {
		t.Errorf("with the pick service killed, 30 requests served by %v: want every one unsteered (handle_errors)", served)
	}
	startPickService(t, cfg, pickAddr)
	eventually(t, 30*time.Second, "the restarted pick service to be ready", func() bool {
		status, _ := testkit.HTTPGet(t, "http://"+pickAddr+"/healthz")
		return status == http.StatusOK
	})
	if served := caddyRound(t, c, 30, true); served["b1"] != 0 {
		t.Errorf("after the restart, b1, forced open, served %d of 30 requests", served["b1"])
	}
	checkCaddyShed(t, c, serveP.HTTPAddr, pickAddr, backends)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// caddyRound sends n requests through Caddy and returns how many each
// backend served, by the backend that answered. Each must be a 200; when
// steered, from the backend the pick named (X-Fleetwatch-Backend), else
// without that header (counted under "").
func caddyRound(t *testing.T, c *testkit.ChatClient, n int, steered bool) map[string]int {
	t.Helper()
	served := map[string]int{}
	for i := range n {
		r, err := c.Chat("", fmt.Sprint("request ", i), i%2 == 0)
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("request %d through Caddy: %v, status %d %s", i, err, r.Status, r.Body)
		}
		answered := r.Header.Get("X-Fakeai-Name")
		switch {
		case steered && r.Backend != answered:
			t.Errorf("request %d: the pick named %q, %q answered", i, r.Backend, answered)
		case !steered && r.Backend != "":
			t.Errorf("request %d: steered to %q with the pick service down", i, r.Backend)
		}
		if steered {
			served[answered]++
		} else {
			served[r.Backend]++
		}
	}
	return served
}

// forceOpen forces backend open with `fleetwatch override force-open` and
// waits until the pick service follows it.
func forceOpen(t *testing.T, serveAddr, pickAddr, backend string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := Run(t.Context(), []string{"override", "force-open", "llama", backend, "--reason", "test", "--for", "10m",
		"--url", "http://" + serveAddr}, &stdout, &stderr); code != 0 {
		t.Fatalf("override force-open %s: exit %d\n%s%s", backend, code, stdout.String(), stderr.String())
	}
	eventually(t, 30*time.Second, "the pick service to follow "+backend+"'s override", func() bool {
		return pickStatus(t, pickAddr, backend) == http.StatusServiceUnavailable
	})
}

// checkCaddyShed forces every backend open and checks that the pick's
// shed answer reaches the client through Caddy: 503, a Retry-After in
// seconds and the reason; no backend sees the requests.
func checkCaddyShed(t *testing.T, c *testkit.ChatClient, serveAddr, pickAddr string, backends []*fakeai.Server) {
	t.Helper()
	forceOpen(t, serveAddr, pickAddr, "b0")
	forceOpen(t, serveAddr, pickAddr, "b2")
	attempts := func() (n int64) {
		for _, b := range backends {
			n += b.Stats().Requests
		}
		return n
	}
	before := attempts()
	for i := range 10 {
		r, err := c.Chat("", fmt.Sprint("shed ", i), i%2 == 0)
		if err != nil || r.Status != http.StatusServiceUnavailable {
			t.Fatalf("request %d with every backend open: %v %d, want 503", i, err, r.Status)
		}
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if err != nil || retry < 1 || r.Header.Get("X-Fleetwatch-Shed") != "all_open" {
			t.Errorf("shed answer: Retry-After %q, X-Fleetwatch-Shed %q: want seconds and all_open",
				r.Header.Get("Retry-After"), r.Header.Get("X-Fleetwatch-Shed"))
		}
	}
	if got := attempts() - before; got != 0 {
		t.Errorf("the backends got %d attempts of 10 shed requests", got)
	}
}

// docCaddyfile returns docs/INTEGRATIONS.md's Caddyfile with the test's
// port (bound to loopback), pick service and backends, after a global
// block that turns the admin endpoint off; each placeholder must be found
// as the test expects, or the document changed under the test.
func docCaddyfile(t *testing.T, port string, backends []*fakeai.Server, pickAddr string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "INTEGRATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n## Caddy\n.*?```caddyfile\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/INTEGRATIONS.md: no caddyfile block under \"## Caddy\"")
	}
	conf := string(m[1])
	replace := [][2]string{
		{":8080 {\n", "http://127.0.0.1:" + port + " {\n\tbind 127.0.0.1\n"},
		{"127.0.0.1:9090", pickAddr},
		{"10.0.0.5:8000 10.0.0.6:8000 10.0.0.7:8000", backends[0].Addr() + " " + backends[1].Addr() + " " + backends[2].Addr()},
	}
	for _, r := range replace {
		if strings.Count(conf, r[0]) != 1 {
			t.Fatalf("docs/INTEGRATIONS.md's Caddyfile has %d %q, want 1", strings.Count(conf, r[0]), r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	return "{\n\tadmin off\n}\n" + conf
}

// startCaddy runs Caddy with the documented Caddyfile (its state under a
// temporary directory, not the home directory) and returns its base URL;
// Caddy stops in t.Cleanup.
func startCaddy(t *testing.T, caddyBin string, backends []*fakeai.Server, pickAddr string) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	dir := t.TempDir()
	conf := docCaddyfile(t, port, backends, pickAddr)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // reaps Caddy
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("caddy output:\n%s\nCaddyfile:\n%s", out.String(), conf)
		}
	})
	base := "http://" + addr
	eventually(t, 10*time.Second, "Caddy to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("caddy exited:\n%s", out.String())
		default:
		}
		resp, err := http.Get(base + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return base
}
