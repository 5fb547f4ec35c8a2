package ingest_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startProxy runs a proxy binary in the foreground until t's cleanup,
// which stops it with stopSignal; it waits until GET url answers.
func startProxy(t *testing.T, name string, stopSignal os.Signal, url string, args ...string) *exec.Cmd {
	t.Helper()
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	cmd := exec.Command(name, args...)
	out := &testkit.Lines{}
	cmd.Stdout = writerFunc(func(p []byte) { out.Logf("%s", p) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(stopSignal)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out)
		}
	})
	testkit.Eventually(t, 10*time.Second, name+" to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", name, out)
		default:
		}
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return true
	})
	return cmd
}

// nginxUser keeps nginx's worker as the user running the test when that is
// root (nginx would switch to nobody, who cannot open a log file reopened
// in the test's private directory); as another user nginx cannot switch.
func nginxUser() string {
	if os.Geteuid() == 0 {
		return "user root;"
	}
	return ""
}

// docSnippet returns the part of docs/INTEGRATIONS.md that re matches: the
// tests run the proxies with the configuration users copy from there.
func docSnippet(t *testing.T, re string) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/INTEGRATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(re).Find(doc)
	if m == nil {
		t.Fatalf("docs/INTEGRATIONS.md has no %s", re)
	}
	return string(m)
}

// nginxServerOptions returns the parameters docs/INTEGRATIONS.md puts on
// the server lines of its nginx upstream block (" max_fails=0"), after
// checking that every server line there has max_fails=0: with nginx's
// default max_fails=1 fail_timeout=10s, nginx hides a failing server
// itself, sends it a request every 10 s, and fleetwatch sees too few
// failures to open it for tens of seconds.
func nginxServerOptions(t *testing.T) string {
	t.Helper()
	block := docSnippet(t, `(?s)    upstream llama \{\n.*?\n    \}\n`)
	lines := regexp.MustCompile(`(?m)^\s*server (\S+?)((?: [^;]*)?);`).FindAllStringSubmatch(block, -1)
	if len(lines) == 0 {
		t.Fatalf("docs/INTEGRATIONS.md's upstream block has no server lines:\n%s", block)
	}
	for _, l := range lines {
		if !strings.Contains(l[2], " max_fails=0") {
			t.Errorf("docs/INTEGRATIONS.md: %q lacks max_fails=0", strings.TrimSpace(l[0]))
		}
	}
	return lines[0][2]
}

// TestNginxDocUpstream checks the nginx upstream block users copy.
func TestNginxDocUpstream(t *testing.T) { nginxServerOptions(t) }

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// chat sends n chat completions through base and fails on a non-200.
func chat(t *testing.T, base string, n int) {
	t.Helper()
	c := testkit.NewChatClient(base)
	for i := range n {
		if _, err := c.Chat("", fmt.Sprintf("hello %d", i), false); err != nil {
			t.Fatalf("request %d through the proxy: %v", i, err)
		}
	}
}

// counts tallies events by "pool backend outcome".
func counts(evs []fleetwatch.Event) map[string]int {
	m := map[string]int{}
	for _, ev := range evs {
		m[ev.Pool+" "+ev.Backend+" "+ev.Outcome.String()]++
	}
	return m
}

// logRun runs ingest.RunLog until stop is called.
type logRun struct {
	cancel context.CancelFunc
	done   chan error
}

func startLogRun(t *testing.T, s ingest.LogRunSettings) *logRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &logRun{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- ingest.RunLog(ctx, s) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *logRun) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		t.Errorf("RunLog: %v", err)
	}
}

const nginxConf = `%[5]s
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  %[6]s
  access_log %[1]s/access.log fleetwatch;
  %[7]s
  upstream llama {
    server %[2]s%[8]s;
    server %[3]s%[8]s;
  }
  server {
    listen 127.0.0.1:%[4]d;
    location /v1/ {
      proxy_pass http://llama;
      proxy_next_upstream error timeout http_500 non_idempotent;
    }
    location = /local { return 200 "nginx itself\n"; }
  }
}
`

// TestNginx: the real nginx, in front of a healthy and a failing fake
// backend and retrying on 500, writes its JSON access log; every upstream
// attempt (the failed first tries included) becomes one event on real
// NATS. Then, while the adapter is stopped, more requests are served and
// the log is rotated (rename and USR1): on restart the adapter finishes
// the rotated file from its saved offset and follows the new one, so the
// events still match the attempts one for one.
func TestNginx(t *testing.T) {
	nginx := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	backends := testkit.StartFakeBackends(t, 2)
	good, bad := backends[0], backends[1]
	bad.SetBehavior(fakeai.Behavior{ErrorRate: 1, InstantError: true})

	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, dir, good.Addr(), bad.Addr(), port, nginxUser(), docSnippet(t, `(?s)    log_format fleetwatch escape=json.*?';\n`), "", nginxServerOptions(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd := startProxy(t, nginx, syscall.SIGQUIT, base+"/local", "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")

	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	events := testkit.CollectEvents(t, nc)
	set := metrics.NewSet()
	m := ingest.NewMetrics(set, ingest.AdapterNginx)
	in, err := ingest.NewLogIngester(ingest.LogSettings{
		Format:  ingest.AdapterNginx,
		Mapping: ingest.NewMapping([]ingest.Upstream{{Match: bad.Addr(), Backend: "bad"}}, false, ""),
		Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{Source: "nginx-test"}),
		Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "access.log")
	settings := ingest.LogRunSettings{Ingester: in, File: logFile,
		Tail: ingest.TailSettings{OffsetFile: filepath.Join(dir, "offset"), FromStart: true, Poll: 20 * time.Millisecond}}
	run := startLogRun(t, settings)

	want := func() map[string]int {
		return map[string]int{
			"llama " + good.Addr() + " ok": int(good.Stats().OK),
			"llama bad error":              int(bad.Stats().Errors),
		}
	}
	chat(t, base, 20)
	if res, err := http.Get(base + "/local"); err == nil {
		res.Body.Close()
	}
	testkit.Eventually(t, 10*time.Second, "an event per attempt", func() bool { return len(events.Events()) >= 20+int(bad.Stats().Errors) })
	if good.Stats().OK != 20 || bad.Stats().Errors == 0 {
		t.Fatalf("nginx did not retry as configured: good %+v bad %+v", good.Stats(), bad.Stats())
	}
	if diff := cmp.Diff(want(), counts(events.Events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for _, ev := range events.Events() {
		if ev.Outcome == fleetwatch.OutcomeOK && (!ev.HasTTFT || !ev.HasDuration || ev.TTFTMs > ev.DurationMs || ev.Source != "nginx-test" || ev.TS.IsZero()) {
			t.Errorf("ok event %+v", ev)
		}
	}
	if m.Skipped(ingest.SkipNoUpstream) < 1 {
		t.Errorf("the line of /local was not skipped as having no upstream")
	}

	// Stopped: more requests, then a rotation, then more.
	run.stop(t)
	chat(t, base, 6)
	if err := os.Rename(logFile, logFile+".1"); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGUSR1) // nginx reopens its logs
	testkit.Eventually(t, 10*time.Second, "nginx's worker to write to the new log", func() bool {
		if res, err := http.Get(base + "/local"); err == nil {
			res.Body.Close()
		}
		fi, err := os.Stat(logFile)
		return err == nil && fi.Size() > 0
	})
	chat(t, base, 4)
	startLogRun(t, settings)
	total := func() int { return int(good.Stats().OK + bad.Stats().Errors) }
	testkit.Eventually(t, 10*time.Second, "the events of the stopped time", func() bool { return len(events.Events()) >= total() })
	time.Sleep(300 * time.Millisecond) // a duplicate would show up by now
	if diff := cmp.Diff(want(), counts(events.Events())); diff != "" {
		t.Errorf("after restart and rotation, events (-want +got):\n%s", diff)
	}
	if n := set.GetOrCreateCounter(`fleetwatch_ingest_tail_rotations_total{adapter="nginx"}`).Get(); n != 1 {
		t.Errorf("rotations counted: %d, want 1", n)
	}
}

const haproxyConf = `global
  log %[1]s local0
defaults
  mode http
  log global
  timeout connect 2s
  timeout client 10s
  timeout server 10s
frontend fe_httplog
  bind 127.0.0.1:%[2]d
  option httplog
  default_backend llama
frontend fe_json
  bind 127.0.0.1:%[3]d
  %[7]s
  default_backend llama
frontend fe_local
  bind 127.0.0.1:%[4]d
  option httplog
  http-request return status 200 content-type text/plain string ok
backend llama
  balance roundrobin
  server s0 %[5]s
  server s1 %[6]s
`

// TestHAProxy: the real HAProxy, in front of a healthy and a failing fake
// backend, logs over UDP syslog in the httplog format (one frontend) and
// the JSON log-format (another); every request becomes one event of pool
// llama (the HAProxy backend) and backend s0 or s1 (the server), matching
// what the fake backends served; a request HAProxy answered itself is
// skipped.
func TestHAProxy(t *testing.T) {
	haproxy := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	backends := testkit.StartFakeBackends(t, 2)
	good, bad := backends[0], backends[1]
	bad.SetBehavior(fakeai.Behavior{ErrorRate: 1, InstantError: true})

	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	events := testkit.CollectEvents(t, nc)
	set := metrics.NewSet()
	m := ingest.NewMetrics(set, ingest.AdapterHAProxy)
	in, err := ingest.NewLogIngester(ingest.LogSettings{
		Format:  ingest.AdapterHAProxy,
		Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{Source: "haproxy-test"}),
		Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ingest.ListenSyslog("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startLogRun(t, ingest.LogRunSettings{Ingester: in, Syslog: conn})

	dir := t.TempDir()
	httplogPort, jsonPort, localPort := freePort(t), freePort(t), freePort(t)
	conf := filepath.Join(dir, "haproxy.cfg")
	text := fmt.Sprintf(haproxyConf, conn.LocalAddr(), httplogPort, jsonPort, localPort, good.Addr(), bad.Addr(),
		docSnippet(t, `    log-format '\{"msec".*'\n`))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	startProxy(t, haproxy, syscall.SIGUSR1, fmt.Sprintf("http://127.0.0.1:%d/", localPort), "-db", "-f", conf)

	c := testkit.NewChatClient(fmt.Sprintf("http://127.0.0.1:%d", httplogPort))
	cj := testkit.NewChatClient(fmt.Sprintf("http://127.0.0.1:%d", jsonPort))
	for i := range 10 {
		c.Chat("", fmt.Sprintf("hello %d", i), false)
		cj.Chat("", fmt.Sprintf("hello %d", i), false)
	}
	testkit.Eventually(t, 10*time.Second, "20 events", func() bool { return len(events.Events()) >= 20 })
	time.Sleep(200 * time.Millisecond) // a stray event would show up by now
	want := map[string]int{"llama s0 ok": int(good.Stats().OK), "llama s1 error": int(bad.Stats().Errors)}
	if diff := cmp.Diff(want, counts(events.Events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if want["llama s0 ok"] != 10 || want["llama s1 error"] != 10 {
		t.Errorf("HAProxy did not balance round robin: %v", want)
	}
	for _, ev := range events.Events() {
		if ev.Outcome == fleetwatch.OutcomeOK && (!ev.HasTTFT || !ev.HasDuration || ev.TTFTMs > ev.DurationMs || ev.Source != "haproxy-test" || ev.TS.IsZero()) {
			t.Errorf("ok event %+v", ev)
		}
	}
	if m.Skipped(ingest.SkipNoUpstream) < 1 {
		t.Errorf("the requests HAProxy answered itself were not skipped")
	}
	if n := m.ParseErrors.Get(); n != 0 {
		t.Errorf("%d parse errors (HAProxy's own notices?)", n)
	}
}

// TestNginxSyslog: nginx's access_log to syslog (as docs/INTEGRATIONS.md
// shows) reaches the adapter's UDP receiver, one event per request.
func TestNginxSyslog(t *testing.T) {
	nginx := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	backends := testkit.StartFakeBackends(t, 2)
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	events := testkit.CollectEvents(t, nc)
	in, err := ingest.NewLogIngester(ingest.LogSettings{
		Format: ingest.AdapterNginx, Pool: "chat",
		Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{}),
		Metrics: ingest.NewMetrics(nil, ingest.AdapterNginx),
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ingest.ListenSyslog("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startLogRun(t, ingest.LogRunSettings{Ingester: in, Syslog: conn})

	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "nginx.conf")
	syslog := fmt.Sprintf("access_log syslog:server=%s,tag=nginx fleetwatch;", conn.LocalAddr())
	text := fmt.Sprintf(nginxConf, dir, backends[0].Addr(), backends[1].Addr(), port, nginxUser(),
		docSnippet(t, `(?s)    log_format fleetwatch escape=json.*?';\n`), syslog, nginxServerOptions(t))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	startProxy(t, nginx, syscall.SIGQUIT, base+"/local", "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	chat(t, base, 6)
	testkit.Eventually(t, 10*time.Second, "6 events over syslog", func() bool { return len(events.Events()) >= 6 })
	want := map[string]int{"chat " + backends[0].Addr() + " ok": 3, "chat " + backends[1].Addr() + " ok": 3}
	if diff := cmp.Diff(want, counts(events.Events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
