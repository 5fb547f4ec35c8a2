package main

import (
	"encoding/json"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// TestServeRestartWithoutAmnesia restarts serve on the same data directory
// (its own embedded NATS server, so the outcome stream survives): an open
// breaker is still open afterwards, and a backend whose failures were a
// small share of the window before the restart is not opened by a burst
// that would be a majority of a window without the replayed history.
func TestServeRestartWithoutAmnesia(t *testing.T) {
	data := t.TempDir()
	// The first serve picks its NATS port (-1); the second binds the same
	// one, so the clients reconnect to it.
	first := startProc(t, true, "serve", "--nats-listen", "127.0.0.1:-1", "--http", "127.0.0.1:0", "--data", data, "--no-probes")
	url := first.NATSURL
	if url == "" {
		t.Fatalf("serve did not print its embedded NATS URL:\n%s", first.stdout.String())
	}
	args := []string{"serve", "--nats-listen", strings.TrimPrefix(url, "nats://"), "--http", "127.0.0.1:0", "--data", data, "--no-probes"}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "p", "steady")
	for i := 0; i < 5; i++ {
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event("p", "dead", 0, 0))
	}
	// steady: 80 ok and 8 errors, never two in a row (failure rate 0.09).
	for i := 0; i < 88; i++ {
		status := 200
		if i%11 == 5 {
			status = 500
		}
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event("p", "steady", status, 100))
	}
	testkit.Eventually(t, 10*time.Second, "dead to open and steady to count its events", func() bool {
		d, _ := snaps.Backend("p", "dead")
		s, _ := snaps.Backend("p", "steady")
		return d.State == fleetwatch.StateOpen && s.Requests >= 88
	})
	if err := first.stop(); err != nil {
		t.Fatalf("first serve: %v", err)
	}

	second := startProc(t, true, args...)
	if !strings.Contains(second.stderr.String(), "replayed") {
		t.Errorf("second serve did not report a replay:\n%s", second.stderr.String())
	}
	_, body := testkit.HTTPGet(t, "http://"+second.HTTPAddr+"/api/decisions")
	var all []fleetwatch.Snapshot
	if err := json.Unmarshal([]byte(body), &all); err != nil || len(all) == 0 {
		t.Fatalf("/api/decisions after restart: %v %s", err, body)
	}
	if d := all[0].Find("dead"); d == nil || d.State != fleetwatch.StateOpen {
		t.Errorf("after restart dead is %+v, want open (the breaker was forgotten)", d)
	}
	// 12 errors and 12 oks alternating: a failure rate of 0.5 over 24
	// requests would trip a window that started empty; with the replayed
	// 88 requests it is 20 of 112 (0.18), below failure_rate.
	testkit.Eventually(t, 20*time.Second, "the client to reconnect", nc.IsConnected)
	for i := 0; i < 24; i++ {
		status := 200
		if i%2 == 0 {
			status = 500
		}
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event("p", "steady", status, 100))
	}
	nc.Flush()
	testkit.Eventually(t, 10*time.Second, "steady to count the new events", func() bool {
		_, body := testkit.HTTPGet(t, "http://"+second.HTTPAddr+"/api/decisions?pool=p")
		var snaps []fleetwatch.Snapshot
		json.Unmarshal([]byte(body), &snaps)
		return len(snaps) == 1 && snaps[0].Find("steady") != nil && snaps[0].Find("steady").Requests >= 112
	})
	_, body = testkit.HTTPGet(t, "http://"+second.HTTPAddr+"/api/decisions?pool=p")
	all = nil
	json.Unmarshal([]byte(body), &all)
	if s := all[0].Find("steady"); s.State != fleetwatch.StateClosed {
		t.Errorf("steady is %s after the restart (%s): it was opened on partial data", s.State, s.Reason)
	}
}

// TestServeWithDebianNATSServer runs serve against a separately started
// nats-server process (Debian's package, 2.9: a compatibility check) and
// uses the real nats CLI as the proxy and the router, exactly as the README
// shows.
func TestServeWithDebianNATSServer(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	natsServer := lookPathOrSkip(t, "nats-server")
	natsCLI := lookPathOrSkip(t, "nats")
	url := startNATSServerProcess(t, natsServer, nil, "-js", "-sd", t.TempDir())
	startProc(t, true, "serve", "--nats", url, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	nats := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(natsCLI, append([]string{"-s", url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The README's proxy example, repeated until a breaker opens.
	testkit.Eventually(t, 20*time.Second, "the KV to show vllm-a open", func() bool {
		nats("pub", "fw.outcomes.edge-1", `{"pool":"llama-3.1-70b","backend":"vllm-a","status":503}`)
		out, err := exec.Command(natsCLI, "-s", url, "kv", "get", "fw_decisions", "llama-3.1-70b", "--raw").CombinedOutput()
		if err != nil {
			return false
		}
		var s fleetwatch.Snapshot
		if json.Unmarshal(out, &s) != nil {
			return false
		}
		b := s.Find("vllm-a")
		return b != nil && b.State == fleetwatch.StateOpen
	})
}

func lookPathOrSkip(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if gobin := filepath.Join(os.Getenv("HOME"), "go", "bin", name); fileExists(gobin) {
		return gobin
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: CI must install it (.ci/run)", name)
	}
	t.Skipf("%s not installed (CI installs it)", name)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestServeSurvivesNATSOutage stops the NATS server under a running serve:
// /healthz reports it, serve keeps retrying, and once a server is back on
// the same address events flow into decisions again. A SIGTERM while NATS
// is down still ends serve.
func TestServeSurvivesNATSOutage(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	store := t.TempDir()
	url, srv := feedtest.NewServer(t, feedtest.WithStoreDir(store))
	port := feedtest.Port(srv)
	p := startProc(t, true, "serve", "--nats", url, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	health := func() int {
		resp, err := http.Get("http://" + p.HTTPAddr + "/healthz")
		if err != nil {
			t.Fatalf("/healthz: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testkit.Eventually(t, 20*time.Second, "healthz 200", func() bool { return health() == 200 })

	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.Eventually(t, 20*time.Second, "healthz to report NATS down", func() bool { return health() == http.StatusServiceUnavailable })

	url2, _ := feedtest.NewServer(t, feedtest.WithPort(port), feedtest.WithStoreDir(store))
	if url2 != url {
		t.Fatalf("restarted server at %s, want %s", url2, url)
	}
	testkit.Eventually(t, 30*time.Second, "serve to reconnect", func() bool { return health() == 200 })
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.Eventually(t, 20*time.Second, "events to reach decisions after the outage", func() bool {
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event("after", "x", 200, 50))
		_, ok := snaps.Backend("after", "x")
		return ok
	})
}

// TestServeStopsWithNATSGone: SIGTERM while the server is unreachable ends
// serve without waiting on drains that cannot happen.
func TestServeStopsWithNATSGone(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	url, srv := feedtest.NewServer(t)
	p := startProc(t, true, "serve", "--nats", url, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.Eventually(t, 20*time.Second, "healthz to report NATS down", func() bool {
		code, _ := testkit.HTTPGet(t, "http://"+p.HTTPAddr+"/healthz")
		return code == http.StatusServiceUnavailable
	})
	if err := p.stop(); err != nil {
		t.Errorf("serve exited with %v", err)
	}
	if !strings.Contains(p.stderr.String(), "no final snapshot") {
		t.Errorf("serve did not say it skipped the final snapshot:\n%s", p.stderr.String())
	}
}
