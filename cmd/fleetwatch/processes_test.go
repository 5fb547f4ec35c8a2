package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// freeLoopbackAddr returns a loopback address with a port that was free a
// moment ago. Only for VictoriaMetrics (which logs the address it was given,
// not the port it bound) and for a URL that must refuse connections; a
// nats-server is started on port -1 and reports its port
// (startNATSServerProcess).
func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	return freeLoopbackAddrs(t, 1)[0]
}

// freeLoopbackAddrs are n distinct free loopback addresses, all bound at
// once and then closed: ports bound and closed one after the other can
// come back twice (bench scale's cluster once got the same port for a
// node's client and monitoring listeners). The ports are below the
// kernel's ephemeral range when it leaves room (stablePorts), so that a
// process killed by a test can start again on its ports: a port of the
// ephemeral range can be handed to any other test's listener on port 0
// or outgoing connection meanwhile (a CI run's nats-server node, killed
// and restarted, found its monitoring port taken).
func freeLoopbackAddrs(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l := stablePorts.listen(t)
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// stablePorts hands out loopback ports from below the ephemeral range
// (ip_local_port_range), each once per test process, chosen at random so
// that the packages' test processes running side by side rarely try the
// same; from port 0 when the range leaves no room below it.
var stablePorts = &portPool{given: map[int]bool{}}

type portPool struct {
	mu     sync.Mutex
	once   sync.Once
	lo, hi int // candidate ports [lo, hi); hi == 0: none
	given  map[int]bool
	rnd    *rand.Rand
}

// listen binds a loopback port of the pool (port 0 failing that).
func (p *portPool) listen(t testing.TB) net.Listener {
	t.Helper()
	p.once.Do(func() {
		p.rnd = rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		var first, last int
		if err == nil {
			_, err = fmt.Sscan(string(b), &first, &last)
		}
		if err == nil && first > 12000 {
			p.lo, p.hi = 10000, first
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	for range 100 {
		if p.hi == 0 {
			break
		}
		port := p.lo + p.rnd.IntN(p.hi-p.lo)
		if p.given[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		p.given[port] = true
		return l
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// serveProcess is a running `fleetwatch serve` subprocess with its embedded
// NATS server.
type serveProcess struct {
	natsURL, httpURL string
	logs             *syncBuffer // stdout and stderr
}

// startServeProcess runs `fleetwatch serve` with config (YAML), an embedded
// NATS server and an HTTP listener on random loopback ports, and stops it
// (SIGTERM, then kill) in t.Cleanup.
func startServeProcess(t *testing.T, config string, extraArgs ...string) *serveProcess {
	t.Helper()
	return startServeProcessEnv(t, config, nil, extraArgs...)
}

// startServeProcessEnv is startServeProcess with extra environment
// variables. With --nats among extraArgs it uses that server instead of an
// embedded one.
func startServeProcessEnv(t *testing.T, config string, env []string, extraArgs ...string) *serveProcess {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fleetwatch.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--config", cfgPath, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1",
		"--data", filepath.Join(dir, "data")}, extraArgs...)
	p := startProcEnv(t, env, true, args...)
	sp := &serveProcess{natsURL: p.NATSURL, httpURL: "http://" + p.HTTPAddr, logs: &p.all}
	for i, a := range extraArgs {
		if a == "--nats" && i+1 < len(extraArgs) {
			sp.natsURL = extraArgs[i+1]
		}
	}
	return sp
}

var routeListenLine = regexp.MustCompile(`route: listening on (http://\S+)`)

// startRouteProcess runs `fleetwatch route` on a random loopback port and
// returns its base URL; it stops it in t.Cleanup, and fails the test when
// route reports a permission problem.
func startRouteProcess(t *testing.T, env []string, args ...string) string {
	t.Helper()
	p := startProcEnv(t, env, false, append([]string{"route", "--listen", "127.0.0.1:0"}, args...)...)
	t.Cleanup(func() {
		p.stop()
		if out := p.all.String(); strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("fleetwatch route reports a permission problem:\n%s", out)
		}
	})
	return p.waitOutput(routeListenLine, "route to report its address")
}

// metricValue returns the value of one series (name with labels, exactly as
// exposed) of a /metrics page, and false when it is absent.
func metricValue(t *testing.T, url, series string) (float64, bool) {
	t.Helper()
	_, body := testkit.HTTPGet(t, url)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f, true
			}
		}
	}
	return 0, false
}

var natsListening = regexp.MustCompile(`Listening for client connections on (\S+:\d+)`)

// startNATSServerProcess runs the nats-server binary bin on 127.0.0.1 with
// a port of its own choosing (-p -1), plus args, and returns the client URL
// it reports. It is killed in t.Cleanup; its output is logged when the test
// failed.
func startNATSServerProcess(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", "-1"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // reaps the process
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("nats-server output:\n%s", logs.String())
		}
	})
	var addr string
	testkit.Eventually(t, 10*time.Second, "nats-server to report its port", func() bool {
		select {
		case <-exited:
			t.Fatalf("nats-server exited:\n%s", logs.String())
		default:
		}
		if m := natsListening.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return "nats://" + addr
}

// runEmbeddedNATS starts the embedded nats-server with opts (a port of its
// own choosing when opts.Port is -1), stops it in t.Cleanup, and returns its
// client URL.
func runEmbeddedNATS(t *testing.T, opts *server.Options) string {
	t.Helper()
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded nats-server not ready")
	}
	return ns.ClientURL()
}
