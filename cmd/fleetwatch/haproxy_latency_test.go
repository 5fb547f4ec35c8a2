package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

var s1Maint = regexp.MustCompile(`(?m)^s1 maint`)

const haproxyLoopConf = `global
  log %[1]s local0
  stats socket %[2]s level admin
defaults
  mode http
  log global
  option httplog
  timeout connect 1s
  timeout client 5s
  timeout server 5s
frontend fe
  bind 127.0.0.1:%[3]d
  default_backend be_llama
backend be_llama
  balance roundrobin
  server s0 %[4]s
  server s1 %[5]s
`

// TestHAProxyFailoverLatency measures, with real processes, the time from
// a backend failing behind a real HAProxy to HAProxy sending it nothing
// more: HAProxy logs over syslog to `fleetwatch ingest haproxy`, `fleetwatch
// serve` opens the breaker, `fleetwatch haproxy` puts the server in maint.
// It is opt-in (a measurement, docs/INTEGRATIONS.md):
//
//	FLEETWATCH_HAPROXY_LATENCY=1 go test -run TestHAProxyFailoverLatency -v -count=3 ./cmd/fleetwatch
func TestHAProxyFailoverLatency(t *testing.T) {
	if os.Getenv("FLEETWATCH_HAPROXY_LATENCY") == "" {
		t.Skip("a measurement: set FLEETWATCH_HAPROXY_LATENCY=1 to run it")
	}
	bin := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	s0 := startCountingBackend(t, "s0")
	s1 := startCountingBackend(t, "s1")

	serveP := startServeProcess(t, "probes: {disabled: true}\n", "--no-probes")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fw.yaml")
	if err := os.WriteFile(cfg, []byte("ingest: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ing := startProc(t, false, "ingest", "haproxy", "--nats", serveP.natsURL, "--config", cfg,
		"--syslog", "127.0.0.1:0", "--data", filepath.Join(dir, "ingest"))
	syslogAddr := ing.waitOutput(ingestSyslogLine, "the syslog address")

	sock := filepath.Join(dir, "admin.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	conf := filepath.Join(dir, "haproxy.cfg")
	text := fmt.Sprintf(haproxyLoopConf, syslogAddr, sock, port, s0.url[len("http://"):], s1.url[len("http://"):])
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	hp := exec.Command(bin, "-db", "-f", conf)
	if err := hp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hp.Process.Signal(syscall.SIGTERM); hp.Wait() })
	eventually(t, 10*time.Second, "HAProxy's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	drv := startProc(t, false, "haproxy", "--nats", serveP.natsURL, "--config", cfg, "--socket", sock, "--interval", "1s")
	drv.waitOutput(regexp.MustCompile(`haproxy: following the decisions`), "the driver to start")

	nc := feedtest.Connect(t, serveP.natsURL)
	var openedAt atomic.Int64 // unix ns when a snapshot with s1 open arrived
	snaps := testkit.SubscribeSnapshots(t, nc)

	// Closed-loop load through HAProxy, a request every millisecond at most.
	var failedToClients atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		c := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-stop:
				c.CloseIdleConnections()
				return
			default:
			}
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/models", port))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failedToClients.Add(1)
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })

	testkit.Eventually(t, 20*time.Second, "both servers closed in the decisions", func() bool {
		a, ok0 := snaps.Backend("be_llama", "s0")
		b, ok1 := snaps.Backend("be_llama", "s1")
		return ok0 && ok1 && a.State == fleetwatch.StateClosed && b.State == fleetwatch.StateClosed
	})
	failedToClients.Store(0)
	before := s1.hits.Load()
	failAt := time.Now()
	s1.failing.Store(true)

	pollFine(t, 20*time.Second, "s1 open in the decisions", func() bool {
		b, ok := snaps.Backend("be_llama", "s1")
		if ok && b.State == fleetwatch.StateOpen {
			openedAt.Store(time.Now().UnixNano())
			return true
		}
		return false
	})
	var maintAt time.Time
	pollFine(t, 10*time.Second, "HAProxy to put s1 in maint", func() bool {
		if s1Maint.MatchString(haproxyServers(t, sock)) {
			maintAt = time.Now()
			return true
		}
		return false
	})
	// Whatever HAProxy had in flight ends well within a second.
	time.Sleep(time.Second)
	lastHit := time.Unix(0, s1.last.Load())
	hitsAfter := s1.hits.Load()
	time.Sleep(time.Second)
	if n := s1.hits.Load(); n != hitsAfter {
		t.Fatalf("s1 still gets requests in maint: %d more", n-hitsAfter)
	}
	if s0.hits.Load() == 0 {
		t.Fatal("s0 got no traffic")
	}
	t.Logf("s1 failed at T0; decision open at T0+%v (seen by a subscriber), HAProxy maint seen at T0+%v; "+
		"last request HAProxy sent s1 at T0+%v; s1 served %d requests after T0, %d requests failed to clients",
		time.Unix(0, openedAt.Load()).Sub(failAt).Round(time.Millisecond), maintAt.Sub(failAt).Round(time.Millisecond),
		lastHit.Sub(failAt).Round(time.Millisecond), hitsAfter-before, failedToClients.Load())
}

// pollFine is testkit.Eventually polling every millisecond, for the
// measurement's resolution.
func pollFine(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyEvery(t, timeout, time.Millisecond, what, cond)
}
