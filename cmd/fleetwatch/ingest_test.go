package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

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
