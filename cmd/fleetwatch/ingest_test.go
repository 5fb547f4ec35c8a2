package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

var (
	ingestSyslogLine  = regexp.MustCompile(`syslog on udp://(\S+)`)
	ingestMetricsLine = regexp.MustCompile(`metrics on (http://\S+/metrics)`)
)

// TestIngestCommandHAProxy runs `fleetwatch ingest haproxy` as a process
// beside a real `fleetwatch serve`, sends it HAProxy httplog lines over UDP
// syslog (RFC 3164, as HAProxy's log directive sends them), sees the
// failing server's breaker open from them, and checks docs/METRICS.md's
// "fleetwatch ingest" section against its /metrics.
func TestIngestCommandHAProxy(t *testing.T) {
	serveP := startServeProcess(t, "probes: {disabled: true}\n", "--no-probes")
	cfg := filepath.Join(t.TempDir(), "ingest.yaml")
	if err := os.WriteFile(cfg, []byte("ingest:\n  upstreams:\n    - {match: llama/s1, backend: gpu-1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, false, "ingest", "haproxy", "--nats", serveP.natsURL, "--config", cfg,
		"--syslog", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", t.TempDir())
	t.Cleanup(func() { p.stop() })
	syslogAddr := p.waitOutput(ingestSyslogLine, "the syslog address")
	metricsURL := p.waitOutput(ingestMetricsLine, "the metrics address")

	nc := feedtest.Connect(t, serveP.natsURL)
	snaps := testkit.SubscribeSnapshots(t, nc)
	conn, err := net.Dial("udp", syslogAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	line := func(server string, status int) string {
		now := time.Now().UTC()
		return fmt.Sprintf("<134>%s haproxy[4242]: 127.0.0.1:40000 [%s] fe llama/%s 0/0/1/40/52 %d 512 - - ---- 1/1/0/0/0 0/0 \"POST /v1/chat/completions HTTP/1.1\"",
			now.Format(time.Stamp), now.Format("02/Jan/2006:15:04:05.000"), server, status)
	}
	testkit.Eventually(t, 20*time.Second, "gpu-1 to open from the syslog lines", func() bool {
		for range 5 {
			fmt.Fprint(conn, line("s0", 200))
			fmt.Fprint(conn, line("s1", 503))
		}
		b, ok := snaps.Backend("llama", "gpu-1")
		return ok && b.State == fleetwatch.StateOpen
	})
	if b, ok := snaps.Backend("llama", "s0"); !ok || b.State != fleetwatch.StateClosed {
		t.Errorf("s0: %+v", b)
	}
	fmt.Fprint(conn, "<134>Dec  3 06:00:00 haproxy[4242]: 127.0.0.1:40001 [03/Dec/2026:06:00:00.000] fe llama/<NOSRV> -1/-1/-1/-1/0 503 0 - - SC-- 0/0/0/0/0 0/0 \"GET / HTTP/1.1\"")
	fmt.Fprint(conn, "<134>Dec  3 06:00:00 haproxy[4242]: Proxy fe started.")
	testkit.Eventually(t, 10*time.Second, "the skipped and unparsable lines to be counted", func() bool {
		skipped, _ := metricValue(t, metricsURL, `fleetwatch_ingest_adapter_skipped_total{adapter="haproxy",reason="no_upstream"}`)
		bad, _ := metricValue(t, metricsURL, `fleetwatch_ingest_adapter_parse_errors_total{adapter="haproxy"}`)
		return skipped == 1 && bad == 1
	})
	checkMetricsCatalogue(t, "## fleetwatch ingest", metricsURL)
}

const haproxyAdminConf = `global
  stats socket %[1]s level admin
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
backend be_llama
  server gpu-a 127.0.0.1:9
  server s2 127.0.0.1:9
`

// TestHAProxyCommand runs `fleetwatch haproxy` as a process against the
// real HAProxy: scripted decisions put one server in maintenance and weigh
// the other, the pool and server names coming from ingest.upstreams; and
// docs/METRICS.md's "fleetwatch haproxy" section matches its /metrics.
func TestHAProxyCommand(t *testing.T) {
	bin := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(haproxyAdminConf, sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	hp := exec.Command(bin, "-db", "-f", conf)
	if err := hp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hp.Process.Signal(syscall.SIGTERM); hp.Wait() })
	eventually(t, 10*time.Second, "HAProxy's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	cfg := filepath.Join(dir, "fw.yaml")
	if err := os.WriteFile(cfg, []byte("ingest:\n  upstreams:\n    - {match: be_llama/s2, pool: llama, backend: gpu-b}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, false, "haproxy", "--nats", url, "--config", cfg, "--socket", sock, "--interval", "100ms", "--http", "127.0.0.1:0")
	t.Cleanup(func() { p.stop() })
	metricsURL := p.waitOutput(regexp.MustCompile(`haproxy: metrics on (http://\S+/metrics)`), "the metrics address")

	snap := &fleetwatch.Snapshot{
		V: fleetwatch.ProtocolVersion, Pool: "llama", Epoch: "e1", Seq: 1,
		At: fleetwatch.Time{Time: time.Now().UTC().Truncate(time.Millisecond)}, TTLMs: 600_000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
		Backends: []fleetwatch.Backend{
			{Backend: "gpu-a", State: fleetwatch.StateOpen, Drift: fleetwatch.DriftUnknown},
			{Backend: "gpu-b", State: fleetwatch.StateClosed, Weight: 0.5, Drift: fleetwatch.DriftUnknown},
		},
	}
	feedtest.NewScript(t, nc, "").Publish(snap)
	want := "gpu-a maint 1\ns2 ready 128\n"
	eventually(t, 10*time.Second, "HAProxy to follow the decisions", func() bool {
		return haproxyServers(t, sock) == want
	})
	checkMetricsCatalogue(t, "## fleetwatch haproxy", metricsURL)
}

// haproxyServers reads "name state weight" lines of backend be_llama from
// the runtime API.
func haproxyServers(t *testing.T, sock string) string {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return ""
	}
	defer conn.Close()
	fmt.Fprint(conn, "show servers state be_llama\n")
	data, _ := io.ReadAll(conn)
	var b strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || strings.HasPrefix(line, "#") {
			continue
		}
		state := "ready"
		if f[6] == "1" {
			state = "maint"
		}
		fmt.Fprintf(&b, "%s %s %s\n", f[3], state, f[7])
	}
	return b.String()
}

// TestIngestCreatesDataDir: `ingest nginx --file` with a data directory
// that does not exist yet creates it and keeps the offset there (it used to
// exit after the first batch, saving no offset); a data directory that
// cannot be created is an error at start that names it.
func TestIngestCreatesDataDir(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	dir := t.TempDir()
	logFile := filepath.Join(dir, "access.log")
	line := `{"msec":"1764741600.123","status":"200","pool":"llama","upstream_addr":"10.0.0.1:8000","upstream_status":"200","upstream_header_time":"0.040","upstream_response_time":"0.050"}` + "\n"
	if err := os.WriteFile(logFile, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "not", "yet", "data")
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, []string{"ingest", "nginx", "--nats", url, "--file", logFile, "--from-start",
			"--http", "", "--poll", "20ms", "--data", data}, &stdout, &stderr)
	}()
	offset := filepath.Join(data, "ingest-nginx.offset")
	eventually(t, 10*time.Second, "the offset file in the new data directory", func() bool {
		select {
		case c := <-code:
			t.Fatalf("ingest exited with %d:\n%s", c, stderr.String())
		default:
		}
		_, err := os.Stat(offset)
		return err == nil
	})
	cancel()
	if c := <-code; c != 0 {
		t.Errorf("exit code %d:\n%s", c, stderr.String())
	}

	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(notDir, "data")
	stderr = syncBuffer{}
	if c := Run(t.Context(), []string{"ingest", "nginx", "--nats", url, "--file", logFile, "--http", "", "--data", bad}, io.Discard, &stderr); c != 1 {
		t.Errorf("exit code %d with an impossible data directory, want 1", c)
	}
	if !strings.Contains(stderr.String(), bad) {
		t.Errorf("the error does not name %s:\n%s", bad, stderr.String())
	}
}

// TestMetricsPortDefaults: `ingest nginx`, `ingest haproxy` and `haproxy`
// run side by side on one proxy host, so their --http defaults differ
// (the two ingest adapters used to share 9108: the second one exited with
// "address already in use").
func TestMetricsPortDefaults(t *testing.T) {
	defaultRe := regexp.MustCompile(`-http string\n.*\(default "([^"]+)"\)`)
	seen := map[string]string{}
	for _, args := range [][]string{{"ingest", "nginx"}, {"ingest", "haproxy"}, {"haproxy"}} {
		var out strings.Builder
		if code := Run(t.Context(), append(args, "-h"), io.Discard, &out); code != 0 {
			t.Fatalf("%v -h: exit %d", args, code)
		}
		m := defaultRe.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("%v -h shows no --http default:\n%s", args, out.String())
		}
		name := strings.Join(args, " ")
		if other, dup := seen[m[1]]; dup {
			t.Errorf("%s and %s both default --http to %s", other, name, m[1])
		}
		seen[m[1]] = name
	}
	want := map[string]string{"127.0.0.1:9108": "ingest nginx", "127.0.0.1:9110": "ingest haproxy", "127.0.0.1:9109": "haproxy"}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("--http defaults (-want +got), as docs/METRICS.md lists them:\n%s", diff)
	}
}
