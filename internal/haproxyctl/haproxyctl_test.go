package haproxyctl_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func snapshot(seq uint64, backends ...fleetwatch.Backend) *fleetwatch.Snapshot {
	return &fleetwatch.Snapshot{
		V: fleetwatch.ProtocolVersion, Pool: "llama", Epoch: "e1", Seq: seq,
		At: fleetwatch.Time{Time: time.Now().UTC().Truncate(time.Millisecond)}, TTLMs: 600_000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Backends: backends,
	}
}

func backend(id string, state fleetwatch.State, weight float64) fleetwatch.Backend {
	return fleetwatch.Backend{Backend: id, State: state, Weight: weight, Drift: fleetwatch.DriftUnknown}
}

func TestPlan(t *testing.T) {
	snap := snapshot(1,
		backend("a", fleetwatch.StateOpen, 0),
		backend("b", fleetwatch.StateHalfOpen, 0.001),
		backend("c", fleetwatch.StateClosed, 0.5),
		backend("d", fleetwatch.StateClosed, 1),
		backend("ghost", fleetwatch.StateClosed, 1),
	)
	targets := haproxyctl.Targets(snap, haproxyctl.Settings{Backends: map[string]string{"llama": "be"}, Servers: map[string]string{"llama/d": "srv-d"}})
	current := []haproxyctl.Server{
		{Backend: "be", Name: "a", Weight: 1},
		{Backend: "be", Name: "b", Admin: 1, Weight: 1},
		{Backend: "be", Name: "c", Weight: 128},
		{Backend: "be", Name: "srv-d", Weight: 1},
	}
	cmds, missing := haproxyctl.Plan(targets, current)
	want := []string{
		"set server be/a state maint",
		"set server be/b state ready", // weight 1 already
		"set server be/srv-d weight 256",
	}
	if diff := cmp.Diff(want, cmds); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"be/ghost"}, missing); diff != "" {
		t.Errorf("missing (-want +got):\n%s", diff)
	}
	drain := haproxyctl.Targets(snap, haproxyctl.Settings{Drain: true})
	if drain[0].State != "drain" {
		t.Errorf("open with Drain: %+v", drain[0])
	}
}

func TestParseServersState(t *testing.T) {
	answer := "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight\n3 llama 1 gpu-a 127.0.0.1 2 0 256 1\n3 llama 2 gpu-b 127.0.0.1 0 1 1 1\n"
	got, err := haproxyctl.ParseServersState(answer)
	if err != nil {
		t.Fatal(err)
	}
	want := []haproxyctl.Server{{Backend: "llama", Name: "gpu-a", Weight: 256}, {Backend: "llama", Name: "gpu-b", Admin: 1, Weight: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := haproxyctl.ParseServersState("Can't find backend.\n"); err == nil {
		t.Errorf("an error answer parsed")
	}
}

const haproxyConf = `global
  stats socket %[1]s level admin
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
frontend local
  bind 127.0.0.1:%[2]d
  http-request return status 200 content-type text/plain string ok
backend llama
  server gpu-a 127.0.0.1:9
  server gpu-b 127.0.0.1:9
  server gpu-c 127.0.0.1:9
`

// startHAProxy runs the real HAProxy with an admin stats socket until
// the returned stop (or t's cleanup).
func startHAProxy(t *testing.T, dir string) (stop func()) {
	t.Helper()
	bin := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	port := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}()
	conf := filepath.Join(dir, "haproxy.cfg")
	sock := filepath.Join(dir, "admin.sock")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(haproxyConf, sock, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", conf)
	out := &testkit.Lines{}
	cmd.Stdout = writer{out}
	cmd.Stderr = writer{out}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(stop)
	rt := &haproxyctl.Runtime{Network: "unix", Addr: sock}
	testkit.Eventually(t, 10*time.Second, "HAProxy's runtime API", func() bool {
		_, err := rt.Command(context.Background(), "show info")
		return err == nil
	})
	return stop
}

type writer struct{ l *testkit.Lines }

func (w writer) Write(p []byte) (int, error) { w.l.Logf("%s", p); return len(p), nil }

// servers reads HAProxy's state of backend llama as "name state weight".
func servers(t *testing.T, rt *haproxyctl.Runtime) map[string]string {
	t.Helper()
	answer, err := rt.Command(context.Background(), "show servers state llama")
	if err != nil {
		return nil
	}
	list, err := haproxyctl.ParseServersState(answer)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list {
		out[s.Name] = fmt.Sprintf("%s %d", s.State(), s.Weight)
	}
	return out
}

// TestControllerDrivesHAProxy: a real HAProxy follows scripted decision
// snapshots on real NATS through its runtime API: open -> maint,
// half-open -> a small weight, closed -> weight scaled to 256; an
// unchanged decision sends no command; a change made behind its back (or
// a HAProxy restart) is repaired by the next pass.
func TestControllerDrivesHAProxy(t *testing.T) {
	dir := t.TempDir()
	stopHAProxy := startHAProxy(t, dir)
	rt := &haproxyctl.Runtime{Network: "unix", Addr: filepath.Join(dir, "admin.sock")}

	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	script := feedtest.NewScript(t, nc, "")
	script.Publish(snapshot(1,
		backend("gpu-a", fleetwatch.StateOpen, 0),
		backend("gpu-b", fleetwatch.StateHalfOpen, 0.05),
		backend("gpu-c", fleetwatch.StateClosed, 1),
	))
	set := metrics.NewSet()
	c, err := haproxyctl.NewController(nc, haproxyctl.ControllerSettings{Runtime: rt, Interval: 50 * time.Millisecond, Metrics: set, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	want := map[string]string{"gpu-a": "maint 1", "gpu-b": "ready 13", "gpu-c": "ready 256"}
	testkit.Eventually(t, 10*time.Second, "HAProxy to follow the first snapshot", func() bool { return cmp.Equal(want, servers(t, rt)) })
	commands := set.GetOrCreateCounter("fleetwatch_haproxy_commands_total")
	sent := commands.Get()
	if sent != 3 {
		t.Errorf("%d commands for three changes", sent)
	}
	passes := set.GetOrCreateCounter("fleetwatch_haproxy_reconciles_total")
	p0 := passes.Get()
	testkit.Eventually(t, 10*time.Second, "more passes", func() bool { return passes.Get() >= p0+3 })
	if commands.Get() != sent {
		t.Errorf("passes over an unchanged fleet sent %d commands", commands.Get()-sent)
	}

	// Behind the controller's back.
	if _, err := rt.Command(context.Background(), "set server llama/gpu-c weight 7"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the weight to be repaired", func() bool { return cmp.Equal(want, servers(t, rt)) })

	// gpu-a recovers, gpu-b is fully closed.
	script.Publish(snapshot(2,
		backend("gpu-a", fleetwatch.StateHalfOpen, 0.05),
		backend("gpu-b", fleetwatch.StateClosed, 0.5),
		backend("gpu-c", fleetwatch.StateClosed, 1),
	))
	want = map[string]string{"gpu-a": "ready 13", "gpu-b": "ready 128", "gpu-c": "ready 256"}
	testkit.Eventually(t, 10*time.Second, "HAProxy to follow the second snapshot", func() bool { return cmp.Equal(want, servers(t, rt)) })

	// HAProxy restarts with its configured state: the next pass
	// reconciles it again.
	stopHAProxy()
	testkit.Eventually(t, 10*time.Second, "the controller to see HAProxy gone", func() bool {
		return set.GetOrCreateGauge("fleetwatch_haproxy_reachable", nil).Get() == 0
	})
	os.Remove(filepath.Join(dir, "admin.sock"))
	startHAProxy(t, dir)
	testkit.Eventually(t, 10*time.Second, "the restarted HAProxy to be reconciled", func() bool { return cmp.Equal(want, servers(t, rt)) })
}
