package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// snapshotLog records every snapshot seen on fw.decisions.> by a plain
// nats.go subscriber.
type snapshotLog struct {
	mu    sync.Mutex
	last  map[string]fleetwatch.Snapshot
	count int
}

func subscribeSnapshots(t *testing.T, nc *nats.Conn) *snapshotLog {
	t.Helper()
	l := &snapshotLog{last: map[string]fleetwatch.Snapshot{}}
	_, err := nc.Subscribe("fw.decisions.>", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(m.Data, &s); err != nil {
			t.Errorf("snapshot on %s does not parse: %v", m.Subject, err)
			return
		}
		if m.Subject != "fw.decisions."+s.Pool {
			t.Errorf("snapshot of pool %q on subject %q", s.Pool, m.Subject)
		}
		l.mu.Lock()
		l.last[s.Pool] = s
		l.count++
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return l
}

func (l *snapshotLog) backend(pool, backend string) (fleetwatch.Backend, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.last[pool]
	if !ok {
		return fleetwatch.Backend{}, false
	}
	if b := s.Find(backend); b != nil {
		return *b, true
	}
	return fleetwatch.Backend{}, false
}

// waitConsuming publishes ok events for pool/backend until one shows up in
// a snapshot: the collector subscribes after serve prints its HTTP line.
func waitConsuming(t *testing.T, nc *nats.Conn, snaps *snapshotLog, pool, backend string) {
	t.Helper()
	eventually(t, 20*time.Second, "serve to consume events", func() bool {
		publish(t, nc, "fw.outcomes", event(pool, backend, 200, 100))
		_, ok := snaps.backend(pool, backend)
		return ok
	})
}

func publish(t *testing.T, nc *nats.Conn, subject, payload string) {
	t.Helper()
	if err := nc.Publish(subject, []byte(payload)); err != nil {
		t.Fatal(err)
	}
}

func event(pool, backend string, status int, ttft float64) string {
	return fmt.Sprintf(`{"v":1,"pool":%q,"backend":%q,"status":%d,"ttft_ms":%g,"source":"test"}`, pool, backend, status, ttft)
}

func TestServeEndToEnd(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	p := startProc(t, true, "serve", "--nats", url, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := subscribeSnapshots(t, nc)
	var rejMu sync.Mutex
	rejects := map[string]fleetwatch.Reject{}
	_, err = nc.Subscribe("fw.rejects", func(m *nats.Msg) {
		var r fleetwatch.Reject
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("reject notice does not parse: %v: %s", err, m.Data)
			return
		}
		rejMu.Lock()
		rejects[string(r.Code)] = r
		rejMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	waitConsuming(t, nc, snaps, "warmup", "w")

	// Single events: five failures in a row open a breaker at any volume.
	for i := 0; i < 5; i++ {
		publish(t, nc, "fw.outcomes.edge-1", event("p1", "bad", 500, 3))
	}
	publish(t, nc, "fw.outcomes.edge-1", event("p1", "good", 200, 120))

	// An NDJSON batch mixing good lines and every kind of malformed event:
	// the bad lines are rejected alone, the good ones count.
	long := strings.Repeat("b", 300)
	batch := strings.Join([]string{
		event("p1", "good", 200, 110),
		`{"pool":"p1","backend":"good",`, // bad JSON
		`{"backend":"good","status":200}`,
		`{"pool":"a..b","backend":"good","status":200}`,
		`{"pool":"p1","backend":"good","status":"200"}`,
		`{"pool":"p1","backend":"good","status":200,"ttft_ms":-1}`,
		`{"pool":"p1","backend":"good","status":200,"ttft_ms":1e400}`,
		`{"pool":"p1","backend":"` + long + `","status":200}`,
		`{"v":2,"pool":"p1","backend":"good","status":200}`,
		event("p1", "good", 200, 130),
	}, "\n")
	publish(t, nc, "fw.outcomes.edge-2", batch)

	eventually(t, 10*time.Second, "the breaker of p1/bad to open in a snapshot", func() bool {
		b, ok := snaps.backend("p1", "bad")
		return ok && b.State == fleetwatch.StateOpen
	})
	b, _ := snaps.backend("p1", "bad")
	if b.Weight != 0 || b.OpenUntil == nil || !strings.Contains(b.Reason, "5 consecutive failures") {
		t.Errorf("open backend: weight %v, open_until %v, reason %q", b.Weight, b.OpenUntil, b.Reason)
	}
	eventually(t, 10*time.Second, "p1/good to count its 3 good events", func() bool {
		g, ok := snaps.backend("p1", "good")
		return ok && g.Requests == 3
	})

	wantRejects := map[string]fleetwatch.Reason{
		"bad json":        fleetwatch.ReasonBadJSON,
		"missing pool":    fleetwatch.ReasonMissingField,
		"invalid pool":    fleetwatch.ReasonInvalidPool,
		"string status":   fleetwatch.ReasonWrongType,
		"negative ttft":   fleetwatch.ReasonOutOfRange,
		"300-byte id":     fleetwatch.ReasonInvalidBackend,
		"unknown version": fleetwatch.ReasonBadVersion,
	}
	eventually(t, 10*time.Second, "reject notices for every malformed kind", func() bool {
		rejMu.Lock()
		defer rejMu.Unlock()
		for _, code := range wantRejects {
			if _, ok := rejects[string(code)]; !ok {
				return false
			}
		}
		return true
	})
	rejMu.Lock()
	for what, code := range wantRejects {
		r := rejects[string(code)]
		if r.Reason == "" || r.Sample == "" || !strings.HasPrefix(r.Subject, "fw.outcomes") {
			t.Errorf("%s: reject notice %+v lacks reason, sample or subject", what, r)
		}
	}
	rejMu.Unlock()

	// The last snapshot is in the KV for late joiners.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the KV to hold p1 with bad open", func() bool {
		e, err := kv.Get(ctx, "p1")
		if err != nil {
			return false
		}
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			t.Fatalf("KV value does not parse: %v", err)
		}
		bad := s.Find("bad")
		return bad != nil && bad.State == fleetwatch.StateOpen
	})

	// HTTP: /healthz, /metrics and /api/decisions on real sockets.
	if code, body := httpGet(t, "http://"+p.HTTPAddr+"/healthz"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("/healthz = %d %s", code, body)
	}
	_, metricsText := httpGet(t, "http://"+p.HTTPAddr+"/metrics")
	for _, want := range []string{
		`fleetwatch_ingest_rejects_total{reason="out_of_range"} 2`,
		`fleetwatch_backend_state{pool="p1",backend="bad"} 2`,
		`fleetwatch_ingest_events_total{outcome="error"} 5`,
		`fleetwatch_decisions_published_total`,
		`fleetwatch_decision_latency_seconds_count`,
	} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	_, body := httpGet(t, "http://"+p.HTTPAddr+"/api/decisions")
	var all []fleetwatch.Snapshot
	if err := json.Unmarshal([]byte(body), &all); err != nil {
		t.Fatalf("/api/decisions: %v", err)
	}
	found := false
	for _, s := range all {
		if s.Pool == "p1" && s.Find("bad") != nil && s.Find("bad").State == fleetwatch.StateOpen {
			found = true
		}
	}
	if !found {
		t.Errorf("/api/decisions lacks p1 with bad open: %s", body)
	}

	// Graceful shutdown: SIGTERM drains, publishes a final snapshot, exits 0.
	before := snaps.countNow()
	if err := p.stop(); err != nil {
		t.Errorf("serve exited with %v after SIGTERM", err)
	}
	if !strings.Contains(p.stderr.String(), "final snapshot") {
		t.Errorf("serve did not report a final snapshot:\n%s", p.stderr.String())
	}
	nc.Flush()
	if snaps.countNow() <= before {
		t.Errorf("no snapshot published during shutdown")
	}
}

func (l *snapshotLog) countNow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeRestartWithoutAmnesia restarts serve on the same data directory
// (its own embedded NATS server, so the outcome stream survives): an open
// breaker is still open afterwards, and a backend whose failures were a
// small share of the window before the restart is not opened by a burst
// that would be a majority of a window without the replayed history.
func TestServeRestartWithoutAmnesia(t *testing.T) {
	data := t.TempDir()
	port := freePort(t)
	listen := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"serve", "--nats-listen", listen, "--http", "127.0.0.1:0", "--data", data, "--no-probes"}
	first := startProc(t, true, args...)
	url := first.NATSURL
	if url == "" {
		t.Fatalf("serve did not print its embedded NATS URL:\n%s", first.stdout.String())
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := subscribeSnapshots(t, nc)
	waitConsuming(t, nc, snaps, "p", "steady")
	for i := 0; i < 5; i++ {
		publish(t, nc, "fw.outcomes", event("p", "dead", 0, 0))
	}
	// steady: 80 ok and 8 errors, never two in a row (failure rate 0.09).
	for i := 0; i < 88; i++ {
		status := 200
		if i%11 == 5 {
			status = 500
		}
		publish(t, nc, "fw.outcomes", event("p", "steady", status, 100))
	}
	eventually(t, 10*time.Second, "dead to open and steady to count its events", func() bool {
		d, _ := snaps.backend("p", "dead")
		s, _ := snaps.backend("p", "steady")
		return d.State == fleetwatch.StateOpen && s.Requests >= 88
	})
	if err := first.stop(); err != nil {
		t.Fatalf("first serve: %v", err)
	}

	second := startProc(t, true, args...)
	if !strings.Contains(second.stderr.String(), "replayed") {
		t.Errorf("second serve did not report a replay:\n%s", second.stderr.String())
	}
	_, body := httpGet(t, "http://"+second.HTTPAddr+"/api/decisions")
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
	eventually(t, 20*time.Second, "the client to reconnect", nc.IsConnected)
	for i := 0; i < 24; i++ {
		status := 200
		if i%2 == 0 {
			status = 500
		}
		publish(t, nc, "fw.outcomes", event("p", "steady", status, 100))
	}
	nc.Flush()
	eventually(t, 10*time.Second, "steady to count the new events", func() bool {
		_, body := httpGet(t, "http://"+second.HTTPAddr+"/api/decisions?pool=p")
		var snaps []fleetwatch.Snapshot
		json.Unmarshal([]byte(body), &snaps)
		return len(snaps) == 1 && snaps[0].Find("steady") != nil && snaps[0].Find("steady").Requests >= 112
	})
	_, body = httpGet(t, "http://"+second.HTTPAddr+"/api/decisions?pool=p")
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
	natsServer := lookPathOrSkip(t, "nats-server")
	natsCLI := lookPathOrSkip(t, "nats")
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	srv := exec.Command(natsServer, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	var srvOut syncBuffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	eventually(t, 10*time.Second, "nats-server to accept clients", func() bool {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})

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
	eventually(t, 20*time.Second, "the KV to show vllm-a open", func() bool {
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
	eventually(t, 20*time.Second, "healthz 200", func() bool { return health() == 200 })

	srv.Shutdown()
	srv.WaitForShutdown()
	eventually(t, 20*time.Second, "healthz to report NATS down", func() bool { return health() == http.StatusServiceUnavailable })

	url2, _ := feedtest.NewServer(t, feedtest.WithPort(port), feedtest.WithStoreDir(store))
	if url2 != url {
		t.Fatalf("restarted server at %s, want %s", url2, url)
	}
	eventually(t, 30*time.Second, "serve to reconnect", func() bool { return health() == 200 })
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := subscribeSnapshots(t, nc)
	eventually(t, 20*time.Second, "events to reach decisions after the outage", func() bool {
		publish(t, nc, "fw.outcomes", event("after", "x", 200, 50))
		_, ok := snaps.backend("after", "x")
		return ok
	})
}

// TestServeStopsWithNATSGone: SIGTERM while the server is unreachable ends
// serve without waiting on drains that cannot happen.
func TestServeStopsWithNATSGone(t *testing.T) {
	url, srv := feedtest.NewServer(t)
	p := startProc(t, true, "serve", "--nats", url, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	srv.Shutdown()
	srv.WaitForShutdown()
	eventually(t, 20*time.Second, "healthz to report NATS down", func() bool {
		code, _ := httpGet(t, "http://"+p.HTTPAddr+"/healthz")
		return code == http.StatusServiceUnavailable
	})
	if err := p.stop(); err != nil {
		t.Errorf("serve exited with %v", err)
	}
	if !strings.Contains(p.stderr.String(), "no final snapshot") {
		t.Errorf("serve did not say it skipped the final snapshot:\n%s", p.stderr.String())
	}
}
