package main

import (
	"fmt"
	"net"
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

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestNginxSteeredByPick runs docs/INTEGRATIONS.md's "nginx steered by
// fleetwatch" configuration, as the document writes it, with real
// processes: nginx 1.22 asking `fleetwatch epp`'s /v1/pick through
// auth_request for every request, `fleetwatch ingest nginx` following
// nginx's access log, `fleetwatch serve` deciding from those events, a
// NATS server, and three fake backends. It checks, in this order:
//
//   - the picks steer (every answer names the backend picked) and the
//     access log's outcome events finish them (the pick service's matched
//     count grows; at the end none is outstanding and none expired);
//   - b1 failing fast: every failure is retried on another pick (no client
//     error), serve opens b1 from the log's events, and once the pick
//     service applied that, b1 gets no attempt;
//   - the pick service killed (SIGKILL): nginx keeps answering 200 through
//     its unsteered group (fail open, no request steered);
//   - the pick service started again: nginx steers again, still never to b1;
//   - every backend failing until serve opened them all (all_open: shed):
//     a request is answered 503 with Retry-After and X-Fleetwatch-Shed,
//     and no backend sees it.
//
// No wall-clock time is asserted; the waits are liveness bounds.
func TestNginxSteeredByPick(t *testing.T) {
	t.Parallel() // its own servers and processes
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs real nginx for about 20 s")
	}
	nginxBin := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	bin := fleetwatchBinary(t)
	natsURL, _ := feedtest.NewServer(t)
	decisions := watchDecisions(t, feedtest.Connect(t, natsURL), "llama")
	backends := testkit.StartFakeBackends(t, 3)
	healthy := fakeai.Behavior{TTFT: 10 * time.Millisecond, TokenTime: 500 * time.Microsecond}
	for _, b := range backends {
		b.SetBehavior(healthy)
	}
	// Breakers stay open longer than the test; all three may open (the
	// shed); slowness is not under test.
	cfg := routeConfig(t, natsURL, backends, "    analyzer: {open_base: 2m, max_open_fraction: 1, slow_factor: 50}\n")
	startServe(t, bin, cfg, natsURL)
	pickAddr := freeLoopbackAddr(t)
	pick := startPickService(t, cfg, pickAddr)
	dir := t.TempDir()
	base := startSteeredNginx(t, nginxBin, dir, backends, pickAddr, "")
	ingest := startProc(t, false, "ingest", "nginx", "--config", cfg, "--file", filepath.Join(dir, "access.log"),
		"--from-start", "--http", "", "--data", t.TempDir(), "--poll", "50ms")
	ingest.waitOutput(regexp.MustCompile(`following (\S+)`), "ingest nginx to follow the access log")
	pickMetrics := "http://" + pickAddr + "/metrics"

	load := startLoad(t, base, 4)
	eventually(t, 30*time.Second, "picks of every backend finished by the log's outcome events", func() bool {
		_, _, by := load.count(0)
		matched, _ := metricValue(t, pickMetrics, "fleetwatch_pick_outcomes_matched_total")
		return by["b0"] > 0 && by["b1"] > 0 && by["b2"] > 0 && matched >= 30
	})
	checkBrokenBackendAvoided(t, load, backends[1], decisions, pickAddr)
	checkFailOpen(t, load, pick)
	startPickService(t, cfg, pickAddr)
	checkSteeredAgain(t, load, backends[1], pickAddr)
	load.halt()
	for p := range 7 {
		n, f, by := load.count(p)
		t.Logf("phase %d: %d requests, %d failed, 200s by X-Fleetwatch-Backend %v", p, n, f, by)
	}
	eventually(t, 30*time.Second, "every pick of the restarted pick service finished by its outcome", func() bool {
		outstanding, _ := metricValue(t, pickMetrics, "fleetwatch_pick_outstanding")
		return outstanding == 0
	})
	if expired, _ := metricValue(t, pickMetrics, "fleetwatch_pick_expired_total"); expired != 0 {
		t.Errorf("%v picks expired without an outcome event", expired)
	}
	checkShed(t, base, backends, decisions)
}

// checkBrokenBackendAvoided makes broken fail fast: no client sees its
// failures (each is retried on another pick), serve opens it, and once the
// pick service applied that (a pick restricted to broken is shed) it gets
// no attempt over 150 requests. Load phases 1 and 2.
func checkBrokenBackendAvoided(t *testing.T, load *loadGen, broken *fakeai.Server, decisions *decisionLog, pickAddr string) {
	t.Helper()
	load.phase.Store(1)
	broken.SetBehavior(fakeai.Behavior{InstantError: true})
	testkit.EventuallyShowing(t, 30*time.Second, broken.Name()+"'s breaker to open from nginx's log", decisions.describe, func() bool {
		return decisions.state(broken.Name()) == fleetwatch.StateOpen
	})
	eventually(t, 30*time.Second, "the pick service to apply it", func() bool {
		return pickStatus(t, pickAddr, broken.Name()) == http.StatusServiceUnavailable
	})
	load.phase.Store(2)
	eventually(t, 30*time.Second, "every worker done with a request of phase 2", func() bool { return load.allWorkersIn(2, 4) })
	before := broken.Stats().Requests
	eventually(t, 30*time.Second, "150 requests with "+broken.Name()+" open", func() bool { n, _, _ := load.count(2); return n >= 150 })
	if got := broken.Stats().Requests - before; got != 0 {
		t.Errorf("%s got %d attempts while open", broken.Name(), got)
	}
	for _, phase := range []int{0, 1, 2} {
		if n, failed, _ := load.count(phase); failed != 0 {
			t.Errorf("phase %d: %d of %d requests failed, want none (%s's failures are retried on another pick)",
				phase, failed, n, broken.Name())
		}
	}
	if _, _, by := load.count(2); by[broken.Name()] != 0 {
		t.Errorf("%d answers of phase 2 came from %s, open", by[broken.Name()], broken.Name())
	}
}

// checkFailOpen kills the pick service (SIGKILL) and checks that nginx
// keeps answering every request through its unsteered group (none names a
// picked backend). Load phases 3 (the kill) and 4.
func checkFailOpen(t *testing.T, load *loadGen, pick *proc) {
	t.Helper()
	load.phase.Store(3)
	pick.cmd.Process.Kill()
	<-pick.done
	load.phase.Store(4)
	eventually(t, 30*time.Second, "100 requests with the pick service killed", func() bool { n, _, _ := load.count(4); return n >= 100 })
	for _, phase := range []int{3, 4} {
		if n, failed, _ := load.count(phase); failed != 0 {
			t.Errorf("phase %d (pick service killed): %d of %d requests failed, want none (fail open)", phase, failed, n)
		}
	}
	if n, _, by := load.count(4); by[""] != n {
		t.Errorf("with the pick service down, %d of %d answers were unsteered (%v): want all", by[""], n, by)
	}
}

// checkSteeredAgain checks that once the restarted pick service is ready,
// nginx steers every request again, never to broken (still failing, still
// open). Load phases 5 (the restart) and 6.
func checkSteeredAgain(t *testing.T, load *loadGen, broken *fakeai.Server, pickAddr string) {
	t.Helper()
	load.phase.Store(5)
	eventually(t, 30*time.Second, "the restarted pick service to be ready", func() bool {
		status, _ := testkit.HTTPGet(t, "http://"+pickAddr+"/healthz")
		return status == http.StatusOK
	})
	load.phase.Store(6)
	eventually(t, 30*time.Second, "every worker done with a request of phase 6", func() bool { return load.allWorkersIn(6, 4) })
	before := broken.Stats().Requests
	eventually(t, 30*time.Second, "100 requests after the restart", func() bool { n, _, _ := load.count(6); return n >= 100 })
	if got := broken.Stats().Requests - before; got != 0 {
		t.Errorf("%s got %d attempts after the restart, while open", broken.Name(), got)
	}
	n, failed, by := load.count(6)
	if failed != 0 || by[""] != 0 || by[broken.Name()] != 0 {
		t.Errorf("after the restart: %d of %d failed, answers by picked backend %v: want every one steered, none to %s",
			failed, n, by, broken.Name())
	}
	for _, phase := range []int{5, 6} {
		if n, failed, _ := load.count(phase); failed != 0 {
			t.Errorf("phase %d: %d of %d requests failed", phase, failed, n)
		}
	}
}

// checkShed makes every backend fail fast until serve opened them all
// (the pool sheds: all_open is shed by default), then checks that nginx
// answers 503 with the pick's Retry-After and reason, sending nothing to
// any backend.
func checkShed(t *testing.T, base string, backends []*fakeai.Server, decisions *decisionLog) {
	t.Helper()
	for _, b := range backends {
		b.SetBehavior(fakeai.Behavior{InstantError: true})
	}
	c := testkit.NewChatClient(base)
	allOpen := func() bool {
		for _, b := range backends {
			if decisions.state(b.Name()) != fleetwatch.StateOpen {
				return false
			}
		}
		return true
	}
	var shed testkit.ChatReply
	testkit.EventuallyShowing(t, 30*time.Second, "a 503 once every backend is open", decisions.describe, func() bool {
		r, err := c.Chat("", "anyone there?", false)
		if err == nil && r.Status == http.StatusServiceUnavailable && allOpen() {
			shed = r
			return true
		}
		return false
	})
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
		shed = r
	}
	if got := attempts() - before; got != 0 {
		t.Errorf("the backends got %d attempts of 10 shed requests", got)
	}
	retry, err := strconv.Atoi(shed.Header.Get("Retry-After"))
	if err != nil || retry < 1 || shed.Header.Get("X-Fleetwatch-Shed") != "all_open" || !strings.Contains(string(shed.Body), "fleetwatch_shed") {
		t.Errorf("shed answer: Retry-After %q, X-Fleetwatch-Shed %q, body %q: want a Retry-After in seconds, all_open and the JSON error",
			shed.Header.Get("Retry-After"), shed.Header.Get("X-Fleetwatch-Shed"), shed.Body)
	}
}

// pickStatus asks the pick service for a pick restricted to backend: 200
// while it may be picked, 503 once its breaker is open there. (A 200 pick
// counts in flight until the hold: the test asks only until it is open.)
func pickStatus(t *testing.T, pickAddr, backend string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+pickAddr+"/v1/pick?pool=llama", nil)
	req.Header.Set("X-Fleetwatch-Among", backend)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// startPickService runs `fleetwatch epp` as a process serving /v1/pick on
// httpAddr (the address nginx's configuration names, the same after a
// restart) and waits until it listens.
func startPickService(t testing.TB, configPath, httpAddr string) *proc {
	t.Helper()
	p := startProc(t, false, "epp", "--config", configPath, "--grpc", "127.0.0.1:0", "--http", httpAddr,
		"--source", "test-epp", "--drain-timeout", "1s")
	p.waitOutput(regexp.MustCompile(`http on (http://\S+)`), "epp to listen")
	return p
}

// docSteeredNginx returns the http block of docs/INTEGRATIONS.md's "nginx
// steered by fleetwatch" with the test's backends, pick service, port and
// log: each placeholder must be found as the test expects, or the document
// changed under the test.
func docSteeredNginx(t testing.TB, dir string, port int, backends []*fakeai.Server, pickAddr string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "INTEGRATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n## nginx steered by fleetwatch\n.*?```nginx\n(http \\{\n.*?\n\\}\n)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/INTEGRATIONS.md: no nginx http block under \"## nginx steered by fleetwatch\"")
	}
	conf := string(m[1])
	replace := []struct{ old, new string }{
		{"http {\n", fmt.Sprintf("http {\n    client_body_temp_path %[1]s/body;\n    proxy_temp_path %[1]s/proxy;\n"+
			"    fastcgi_temp_path %[1]s/fastcgi;\n    uwsgi_temp_path %[1]s/uwsgi;\n    scgi_temp_path %[1]s/scgi;\n", dir)},
		{"server 127.0.0.1:9090;", "server " + pickAddr + ";"},
		{"listen 8080;", fmt.Sprintf("listen 127.0.0.1:%d;", port)},
		{"/var/log/nginx/fleetwatch.log", filepath.Join(dir, "access.log")},
	}
	for i, b := range backends {
		replace = append(replace, struct{ old, new string }{fmt.Sprintf("server 10.0.0.%d:8000;", 5+i), "server " + b.Addr() + ";"})
	}
	for _, r := range replace {
		if strings.Count(conf, r.old) != 1 {
			t.Fatalf("docs/INTEGRATIONS.md's steered nginx configuration has %d %q, want 1", strings.Count(conf, r.old), r.old)
		}
		conf = strings.Replace(conf, r.old, r.new, 1)
	}
	if strings.Contains(conf, "10.0.0.") {
		t.Fatalf("docs/INTEGRATIONS.md's steered nginx configuration names more backends than the test has:\n%s", conf)
	}
	return conf
}

// startSteeredNginx runs nginx with the documented configuration in dir
// (its access log is dir/access.log), extra added at the end of its http
// block, and returns its base URL; nginx stops in t.Cleanup.
func startSteeredNginx(t testing.TB, nginxBin, dir string, backends []*fakeai.Server, pickAddr, extra string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	user := "" // as root, nginx's worker would switch to nobody, who cannot write the test's directory
	if os.Geteuid() == 0 {
		user = "user root;\n"
	}
	conf := fmt.Sprintf("%sdaemon off;\nworker_processes 1;\npid %[2]s/nginx.pid;\nerror_log %[2]s/error.log;\nevents { worker_connections 256; }\n%s",
		user, dir, strings.TrimSuffix(docSteeredNginx(t, dir, port, backends, pickAddr), "}\n")+extra+"}\n")
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginxBin, "-p", dir, "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // reaps nginx
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s\nnginx.conf:\n%s", out.String(), errLog, conf)
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	eventually(t, 10*time.Second, "nginx to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("nginx exited:\n%s", out.String())
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
