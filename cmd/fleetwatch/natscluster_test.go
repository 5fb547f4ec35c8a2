package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch/internal/bench"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// Three nats-server processes in one cluster, each with a store of its own,
// under a serve whose JetStream assets have three replicas.

// natsCluster is three natsProcs routed to each other.
type natsCluster struct{ nodes []*natsProc }

// The ports are picked by binding port 0 and closing it, so another
// process may take one before the node binds it (seen under a loaded full
// suite: a node that listened for clients exited on its route port). A
// node that exits with "address already in use" makes the cluster start
// again on other ports, up to three times.
func startNATSCluster(t *testing.T, bin string) *natsCluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c := newNATSCluster(t, bin)
		started := true
		for _, n := range c.nodes {
			if started = n.startClustered(); !started {
				break
			}
		}
		if started {
			return c
		}
		for _, n := range c.nodes {
			n.kill(syscall.SIGKILL)
		}
		if attempt == 3 {
			t.Fatal("nats-server: a port of the cluster was taken before the node bound it, three times")
		}
		t.Logf("nats-server: a port of the cluster was taken before the node bound it; starting the cluster again on other ports")
	}
}

// startClustered starts the node on its configured ports and waits until
// it listens for clients and routes. It reports false when the node exited
// because a port was already in use, and fails the test when it exited for
// another reason.
func (n *natsProc) startClustered() bool {
	n.t.Helper()
	n.launch(0)
	listening := false
	testkit.Eventually(n.t, 20*time.Second, "nats-server to listen for clients and routes", func() bool {
		select {
		case <-n.exited:
			if strings.Contains(n.logs.String(), "address already in use") {
				return true
			}
			n.t.Fatalf("nats-server exited:\n%s", n.logs.String())
		default:
		}
		if !strings.Contains(n.logs.String(), "Listening for route connections") {
			return false
		}
		c, err := net.DialTimeout("tcp", n.addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			listening = true
		}
		return err == nil
	})
	return listening
}

// newNATSCluster configures the three nodes without starting them.
func newNATSCluster(t *testing.T, bin string) *natsCluster {
	t.Helper()
	addrs := freeLoopbackAddrs(t, 9)
	clients, routes, monitors := addrs[0:3], addrs[3:6], addrs[6:9]
	c := &natsCluster{}
	for i := range 3 {
		dir := t.TempDir()
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, "nats-route://"+r)
			}
		}
		conf := bench.NATSClusterConfig(i+1, clients[i], monitors[i], routes[i], filepath.Join(dir, "js"), others)
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		n := &natsProc{t: t, bin: bin, args: []string{"-c", path}, monitor: monitors[i]}
		_, port, _ := strings.Cut(clients[i], ":")
		fmt.Sscan(port, &n.port)
		t.Cleanup(func() {
			n.kill(syscall.SIGKILL)
			if t.Failed() {
				t.Logf("nats-server n%d output:\n%s", i+1, n.logs.String())
			}
		})
		c.nodes = append(c.nodes, n)
	}
	return c
}

// startPort starts the node on its configured port (the port is in its
// configuration file; -p would override it).
func (n *natsProc) startPort() {
	n.t.Helper()
	n.start(0)
}

func (c *natsCluster) urls() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, n.url())
	}
	return strings.Join(u, ",")
}

// waitJetStream waits until the cluster's JetStream answers (a meta leader
// is elected).
func (c *natsCluster) waitJetStream(t *testing.T) {
	t.Helper()
	nc, err := nats.Connect(c.urls())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	testkit.Eventually(t, 30*time.Second, "the cluster's JetStream to answer", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
}

const clusterServeConfig = "ha:\n  replicas: 3\n"

// TestServeWaitsForAFormingCluster starts serve (assets with three
// replicas) while two of the cluster's three nodes run, as when a whole
// deployment comes up at once: its lease bucket finds no suitable peers
// until the third node joins. serve must wait for it and then publish, not
// exit.
func TestServeWaitsForAFormingCluster(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	cluster := newNATSCluster(t, natsServerBinary(t))
	cluster.nodes[0].startPort()
	cluster.nodes[1].startPort()
	cluster.waitJetStream(t) // a meta leader with two of three
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fleetwatch.yaml")
	if err := os.WriteFile(cfg, []byte(clusterServeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, false, "serve", "--config", cfg, "--nats", cluster.urls(), "--http", "127.0.0.1:0",
		"--data", filepath.Join(dir, "data"), "--no-probes")
	p.waitOutput(regexp.MustCompile(`creating the lease bucket: .*no suitable peers.*trying again`), "serve to wait for the lease bucket's third peer")
	cluster.nodes[2].startPort()
	p.waitOutput(httpLineRe, "serve to start once the third node joined")
	nc, snaps := watchSnapshots(t, cluster.urls())
	publishEvents(t, nc, "chat", "a", "b")
	testkit.Eventually(t, 30*time.Second, "a snapshot of chat", func() bool {
		_, ok := snaps.since("chat", time.Time{})
		return ok
	})
}

// TestServeRecoversFromAWholeClusterRestart stops every node of the
// cluster (SIGTERM, and SIGKILL), starts them again on their stores, and
// checks that serve publishes again within the lease TTL and a heartbeat of
// the cluster's JetStream answering again.
func TestServeRecoversFromAWholeClusterRestart(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			wholeClusterRestart(t, sig)
		})
	}
}

func wholeClusterRestart(t *testing.T, sig syscall.Signal) {
	cluster := startNATSCluster(t, natsServerBinary(t))
	cluster.waitJetStream(t)
	serve := startServeOn(t, cluster.urls(), clusterServeConfig)
	nc, snaps := watchSnapshots(t, cluster.urls())
	publishEvents(t, nc, "chat", "a", "b")
	testkit.Eventually(t, 30*time.Second, "a snapshot of chat", func() bool {
		_, ok := snaps.since("chat", time.Time{})
		return ok
	})
	before, _ := snaps.since("chat", time.Time{})
	for _, n := range cluster.nodes {
		n.kill(sig)
	}
	time.Sleep(7 * time.Second) // past the lease TTL
	for _, n := range cluster.nodes {
		n.startPort()
	}
	cluster.waitJetStream(t)
	back := time.Now()
	testkit.Eventually(t, 60*time.Second, "a snapshot of chat after the cluster's restart", func() bool {
		_, ok := snaps.since("chat", back)
		return ok
	})
	took := snaps.firstAfter("chat", back).Sub(back)
	after, _ := snaps.since("chat", back)
	t.Logf("first snapshot %v after the cluster's JetStream answered again (fence %d -> %d)", took.Round(10*time.Millisecond), before.Fence, after.Fence)
	if took > 2*time.Second {
		t.Logf("serve's log:\n%s", serve.all.String())
	}
	if limit := 5*time.Second + time.Second + 1250*time.Millisecond; took > limit {
		t.Errorf("snapshot %v after the cluster's return, want within %v", took, limit)
	}
	if after.Fence < before.Fence {
		t.Errorf("fence went back from %d to %d", before.Fence, after.Fence)
	}
	testkit.Eventually(t, 20*time.Second, "/healthz ok again", func() bool {
		code, _ := testkit.HTTPGet(t, "http://"+serve.HTTPAddr+"/healthz")
		return code == 200
	})
}
