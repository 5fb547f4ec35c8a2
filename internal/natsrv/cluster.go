package natsrv

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"
)

// ErrClusterNotReady is returned by StartCluster when JetStream has no
// meta leader, or a node is not current, in time.
var ErrClusterNotReady = errors.New("natsrv: cluster not ready")

// clusterReadyTimeout bounds how long StartCluster waits for JetStream.
const clusterReadyTimeout = 30 * time.Second

// ClusterSettings configures an in-process cluster of embedded servers on
// loopback: each with its client and route listeners on free ports, routes
// to every other node, and JetStream clustered across them (so that streams
// and KV buckets can have up to Nodes replicas). The zero value starts
// three nodes with temporary stores.
type ClusterSettings struct {
	// Name is the cluster's name. If empty, "fleetwatch".
	Name string
	// Nodes is the number of servers. If zero, 3.
	Nodes int
	// StoreDir holds one JetStream store per node (node-<i>). If empty,
	// each node has a temporary one.
	StoreDir string
	// Logf, when set, receives the servers' notices, warnings and errors.
	Logf func(format string, args ...any)
}

// Cluster is a running in-process cluster.
type Cluster struct {
	// Nodes are the servers, in start order. Shutting one down (as a
	// failure would) leaves the others running.
	Nodes []*Server
}

// StartCluster starts a cluster and waits until every node accepts
// clients and JetStream has a meta leader that every node follows.
func StartCluster(s ClusterSettings) (*Cluster, error) {
	if s.Name == "" {
		s.Name = "fleetwatch"
	}
	if s.Nodes <= 0 {
		s.Nodes = 3
	}
	ports := make([]int, s.Nodes)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	c := &Cluster{}
	for i := range s.Nodes {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
			}
		}
		ns := Settings{
			ServerName: fmt.Sprintf("%s-%d", s.Name, i),
			Logf:       s.Logf,
			Cluster:    &ClusterNode{Name: s.Name, Listen: "127.0.0.1:" + strconv.Itoa(ports[i]), Routes: routes},
		}
		if s.StoreDir != "" {
			ns.StoreDir = filepath.Join(s.StoreDir, fmt.Sprintf("node-%d", i))
		}
		srv, err := Start(ns)
		if err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("natsrv: cluster node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, srv)
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for !c.ready() {
		if time.Now().After(deadline) {
			c.Shutdown()
			return nil, ErrClusterNotReady
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c, nil
}

// ready reports whether some node leads JetStream's meta group and every
// running node is current with it.
func (c *Cluster) ready() bool {
	leader := false
	for _, n := range c.Nodes {
		if !n.srv.JetStreamIsCurrent() {
			return false
		}
		leader = leader || n.srv.JetStreamIsLeader()
	}
	return leader
}

// ClientURLs are the nodes' client URLs, comma-separated, as nats.Connect
// takes them.
func (c *Cluster) ClientURLs() string {
	var out string
	for i, n := range c.Nodes {
		if i > 0 {
			out += ","
		}
		out += n.ClientURL()
	}
	return out
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	for _, n := range c.Nodes {
		n.Shutdown()
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("natsrv: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
