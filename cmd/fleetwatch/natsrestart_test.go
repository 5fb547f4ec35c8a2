package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// The NATS restart tests (DECISIONS.md "NATS restarts and elections"): a
// real nats-server process, stopped with SIGTERM or SIGKILL and started
// again on the same port and store, under a real fleetwatch serve process
// with the default configuration. serve must decide and publish again by
// itself, within the lease TTL and a heartbeat of the server's return.

var (
	natsBinOnce sync.Once
	natsBinPath string
	natsBinErr  error
)

// natsServerBinary builds the nats-server of go.mod (2.15) once, from the
// module the embedded server comes from: a separately running process of
// the current server, beside Debian's older one.
func natsServerBinary(t testing.TB) string {
	t.Helper()
	natsBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fleetwatch-nats-server-")
		if err != nil {
			natsBinErr = err
			return
		}
		natsBinPath = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBinPath, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBinErr != nil {
		t.Fatal(natsBinErr)
	}
	return natsBinPath
}

// debianNATSServerBinary is Debian's nats-server (2.9), or "" where it is
// not installed (it must be in CI).
func debianNATSServerBinary(t testing.TB) string {
	for _, p := range []string{debianNATSServer, "/usr/bin/nats-server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("Debian's nats-server is not installed (.ci/run installs it)")
	}
	return ""
}

// natsProc is a nats-server process that can be stopped and started again
// on the same port with the same arguments (its store among them).
type natsProc struct {
	t    testing.TB
	bin  string
	args []string
	port int
	// monitor is the monitoring listener (host:port) of a cluster node.
	monitor string

	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
}

// startNATSProc starts bin with JetStream in a store of its own on a port
// of its choosing, plus args.
func startNATSProc(t testing.TB, bin string, args ...string) *natsProc {
	t.Helper()
	n := &natsProc{t: t, bin: bin, args: append([]string{"-a", "127.0.0.1", "-js", "-sd", t.TempDir()}, args...)}
	n.start(-1)
	t.Cleanup(func() {
		n.kill(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("nats-server output:\n%s", n.logs.String())
		}
	})
	return n
}

var natsPortLine = regexp.MustCompile(`Listening for client connections on \S+:(\d+)`)

// start starts the server on port: -1 lets it choose and report it, 0
// keeps the port of its configuration file (n.port).
func (n *natsProc) start(port int) {
	n.t.Helper()
	n.launch(port)
	if port != -1 {
		n.waitListening()
		return
	}
	testkit.Eventually(n.t, 10*time.Second, "nats-server to report its port", func() bool {
		if m := natsPortLine.FindStringSubmatch(n.logs.String()); m != nil {
			n.port, _ = strconv.Atoi(m[1])
		}
		return n.port != 0
	})
	n.waitListening()
}

// launch starts the process on port (as start) without waiting for it.
func (n *natsProc) launch(port int) {
	n.t.Helper()
	args := append([]string{}, n.args...)
	if port != 0 {
		args = append(args, "-p", strconv.Itoa(port))
	}
	n.cmd = exec.Command(n.bin, args...)
	if n.logs == nil {
		n.logs = &syncBuffer{}
	}
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	exited := make(chan struct{})
	n.exited = exited
	cmd := n.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
}

// waitListening waits until the server accepts connections (its JetStream
// may still be recovering its store).
func (n *natsProc) waitListening() {
	n.t.Helper()
	testkit.Eventually(n.t, 20*time.Second, "nats-server to accept connections", func() bool {
		select {
		case <-n.exited:
			n.t.Fatalf("nats-server exited:\n%s", n.logs.String())
		default:
		}
		c, err := net.DialTimeout("tcp", n.addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (n *natsProc) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }
func (n *natsProc) url() string  { return "nats://" + n.addr() }

// kill sends sig and waits for the process to exit.
func (n *natsProc) kill(sig syscall.Signal) {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	select {
	case <-n.exited:
		return
	default:
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// snapshotTimes records when each pool's snapshots arrive on a connection
// of the test's own (which reconnects by itself too).
type snapshotTimes struct {
	nc    *nats.Conn // the recording connection
	mu    sync.Mutex
	last  map[string]time.Time
	snap  map[string]fleetwatch.Snapshot
	times map[string][]time.Time // every arrival, per pool
}

func watchSnapshots(t testing.TB, url string) (*nats.Conn, *snapshotTimes) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	st := &snapshotTimes{nc: nc, last: map[string]time.Time{}, snap: map[string]fleetwatch.Snapshot{}, times: map[string][]time.Time{}}
	if _, err := nc.Subscribe("fw.decisions.>", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if json.Unmarshal(m.Data, &s) != nil {
			return
		}
		st.mu.Lock()
		now := time.Now()
		st.last[s.Pool] = now
		st.snap[s.Pool] = s
		st.times[s.Pool] = append(st.times[s.Pool], now)
		st.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return nc, st
}

// since reports whether a snapshot of pool arrived after t, and the latest.
func (s *snapshotTimes) since(pool string, t time.Time) (fleetwatch.Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap[pool], s.last[pool].After(t)
}

// firstAfter is when the first snapshot of pool after t arrived (zero if
// none did).
func (s *snapshotTimes) firstAfter(pool string, t time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.times[pool] {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// longestGap is the longest time between two snapshots of pool that
// arrived between from and to (the edges count as arrivals).
func (s *snapshotTimes) longestGap(pool string, from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, gap := from, time.Duration(0)
	for _, at := range s.times[pool] {
		if at.Before(from) || at.After(to) {
			continue
		}
		gap = max(gap, at.Sub(prev))
		prev = at
	}
	return max(gap, to.Sub(prev))
}

// publishEvents publishes an ok event for each backend of pool every 50 ms
// until the test ends, through NATS outages (the connection buffers).
func publishEvents(t testing.TB, nc *nats.Conn, pool string, backends ...string) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, b := range backends {
				_ = nc.Publish("fw.outcomes", []byte(testkit.Event(pool, b, 200, 80)))
			}
		}
	}()
}

// serveWithTraffic starts serve with the defaults on ns, ok traffic for
// backends a and b of pool chat, and waits for chat's first snapshot,
// which it returns with the recorder.
func serveWithTraffic(t *testing.T, ns *natsProc) (*serveProcess, *snapshotTimes, fleetwatch.Snapshot) {
	t.Helper()
	serve := startServeProcessEnv(t, "", nil, "--nats", ns.url(), "--no-probes")
	nc, snaps := watchSnapshots(t, ns.url())
	publishEvents(t, nc, "chat", "a", "b")
	testkit.Eventually(t, 20*time.Second, "a first snapshot of chat", func() bool {
		_, ok := snaps.since("chat", time.Time{})
		return ok
	})
	before, _ := snaps.since("chat", time.Time{})
	return serve, snaps, before
}

// TestServeRecoversFromNATSRestart stops the NATS server under a running
// serve for longer than the lease TTL (so that every lease expires),
// starts it again on the same port and store, and checks that serve
// publishes the pool again within the lease TTL and a heartbeat of the
// server's return, says so on /healthz, and reports the publish age; with
// the current server (SIGTERM and SIGKILL) and with Debian's 2.9.
func TestServeRecoversFromNATSRestart(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	cases := []struct {
		name string
		bin  func(testing.TB) string
		sig  syscall.Signal
	}{
		{"2.15-sigterm", natsServerBinary, syscall.SIGTERM},
		{"2.15-sigkill", natsServerBinary, syscall.SIGKILL},
		{"debian-2.9-sigkill", debianNATSServerBinary, syscall.SIGKILL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := tc.bin(t)
			if bin == "" {
				t.Skip("Debian's nats-server is not installed")
			}
			ns := startNATSProc(t, bin)
			serve, snaps, before := serveWithTraffic(t, ns)

			ns.kill(tc.sig)
			testkit.Eventually(t, 20*time.Second, "/healthz to say NATS is down", func() bool {
				code, _ := testkit.HTTPGet(t, serve.httpURL+"/healthz")
				return code == 503
			})
			time.Sleep(7 * time.Second) // past the 5 s lease TTL: every lease key expires
			ns.start(ns.port)
			back := time.Now()

			// Within the lease TTL and a heartbeat of the server's return,
			// plus serve's reconnect wait (at most 1.25 s): a liveness
			// bound of the issue, not a performance figure.
			limit := 5*time.Second + time.Second + 1250*time.Millisecond
			var after fleetwatch.Snapshot
			testkit.Eventually(t, 30*time.Second, "a snapshot of chat after the restart", func() bool {
				var ok bool
				after, ok = snaps.since("chat", back)
				return ok
			})
			took := snaps.firstAfter("chat", back).Sub(back)
			t.Logf("first snapshot %v after the server accepted connections again (fence %d -> %d)", took.Round(10*time.Millisecond), before.Fence, after.Fence)
			if took > limit {
				t.Errorf("snapshot %v after the server's return, want within %v", took, limit)
			}
			if after.Fence < before.Fence {
				t.Errorf("fence went back from %d to %d: routers would drop every new snapshot", before.Fence, after.Fence)
			}
			testkit.Eventually(t, 10*time.Second, "/healthz ok again", func() bool {
				code, _ := testkit.HTTPGet(t, serve.httpURL+"/healthz")
				return code == 200
			})
			age, ok := metricValue(t, serve.httpURL+"/metrics", `fleetwatch_pool_publish_age_seconds{pool="chat"}`)
			if !ok || age > 3 {
				t.Errorf(`fleetwatch_pool_publish_age_seconds{pool="chat"} = %v (present %v), want <= 3`, age, ok)
			}
			// It keeps publishing: no second silence.
			mark := time.Now()
			time.Sleep(3 * time.Second)
			if _, ok := snaps.since("chat", mark.Add(time.Second)); !ok {
				t.Errorf("no snapshot of chat in the last 2 s after recovering")
			}
		})
	}
}

// TestServeRecoversWhenNATSLosesItsStore restarts the server with an empty
// store (a container without its volume): serve must create every stream
// and bucket again, the lease bucket with its first revision above every
// fence used before, so that routers, which drop a snapshot whose fence is
// below the highest they have seen, follow the new snapshots; and events
// published after the restart reach decisions again.
func TestServeRecoversWhenNATSLosesItsStore(t *testing.T) {
	t.Parallel()
	ns := startNATSProc(t, natsServerBinary(t))
	serve, snaps, before := serveWithTraffic(t, ns)
	nc := snaps.nc

	ns.kill(syscall.SIGKILL)
	for i, a := range ns.args {
		if a == "-sd" {
			ns.args[i+1] = t.TempDir() // an empty store
		}
	}
	ns.start(ns.port)
	back := time.Now()
	testkit.Eventually(t, 30*time.Second, "a snapshot of chat with a higher fence after the store was lost", func() bool {
		s, ok := snaps.since("chat", back)
		return ok && s.Fence > before.Fence
	})
	after, _ := snaps.since("chat", back)
	t.Logf("fence %d -> %d, %v after the empty server accepted connections", before.Fence, after.Fence,
		snaps.firstAfter("chat", back).Sub(back).Round(10*time.Millisecond))

	// Every resource is there again.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"KV_fw_leases", "KV_fw_decisions", "KV_fw_feed", "KV_fw_overrides", "FW_OUTCOMES", "FW_CAPTURE", "FW_AUDIT"} {
		testkit.Eventually(t, 20*time.Second, "stream "+name+" created again", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := js.Stream(ctx, name)
			return err == nil
		})
	}
	testkit.Eventually(t, 20*time.Second, "the decisions bucket holding chat again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, "fw_decisions")
		if err != nil {
			return false
		}
		e, err := kv.Get(ctx, "chat")
		return err == nil && len(e.Value()) > 0
	})
	testkit.Eventually(t, 10*time.Second, "/healthz ok again", func() bool {
		code, _ := testkit.HTTPGet(t, serve.httpURL+"/healthz")
		return code == 200
	})
}

// TestServeStartedBeforeNATS starts serve while nothing listens on its NATS
// address, as when a deployment's serve comes up before its NATS server,
// and starts nats-server (with JetStream) there once serve has waited
// past one JetStream question (5 s). serve must then run with JetStream
// (capture, KV, leases); it used to decide, for its whole life, that the
// server had none.
func TestServeStartedBeforeNATS(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	addr := freeLoopbackAddr(t)
	_, portText, _ := strings.Cut(addr, ":")
	port, _ := strconv.Atoi(portText)
	p := startProc(t, false, "serve", "--nats", "nats://"+addr, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	p.waitOutput(regexp.MustCompile(`asking nats://\S+ for JetStream: .*trying again`), "serve to wait for NATS's answer")
	ns := &natsProc{t: t, bin: natsServerBinary(t), args: []string{"-a", "127.0.0.1", "-js", "-sd", t.TempDir()}, port: port}
	ns.start(port)
	t.Cleanup(func() { ns.kill(syscall.SIGKILL) })
	httpAddr := p.waitOutput(httpLineRe, "serve to start once NATS runs")
	code, body := testkit.HTTPGet(t, "http://"+httpAddr+"/healthz")
	if code != 200 || !strings.Contains(body, `"jetstream":true`) {
		t.Errorf("/healthz = %d %s, want 200 with jetstream true", code, body)
	}
}

// TestServeGivesUpWithoutNATS: when no NATS server answers for 30 s, serve
// exits non-zero and says what to do, instead of running without the
// JetStream the server may well have.
func TestServeGivesUpWithoutNATS(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	addr := freeLoopbackAddr(t)
	p := startProc(t, false, "serve", "--nats", "nats://"+addr, "--http", "127.0.0.1:0", "--data", t.TempDir(), "--no-probes")
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("serve still runs 2 minutes after its start without NATS")
	}
	if p.err == nil {
		t.Errorf("serve exited 0 without NATS")
	}
	for _, want := range []string{"gave no JetStream answer for 30s", "nats.no_jetstream: true"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("serve's error lacks %q:\n%s", want, p.stderr.String())
		}
	}
	if strings.Contains(p.stdout.String(), "HTTP on") {
		t.Errorf("serve listened without NATS:\n%s", p.stdout.String())
	}
}
