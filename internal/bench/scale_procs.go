package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The processes of the scale benchmark: three nats-server nodes in one
// cluster with JetStream, each with a monitoring port (/varz, /routez,
// /jsz), and one or three `fleetwatch serve` processes. Their CPU and
// memory are read from /proc.

// scaleProc is one child process: started with Pdeathsig so that it never
// outlives the benchmark, stopped with SIGTERM then SIGKILL.
type scaleProc struct {
	name   string
	bin    string
	args   []string
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
}

// start starts the process; a process that exits within the first moments
// is an error naming its output.
func (p *scaleProc) start(ctx context.Context) error {
	p.cmd = exec.Command(p.bin, p.args...)
	if p.out == nil {
		p.out = &syncBuffer{}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("bench scale: %s: %w", p.name, err)
	}
	exited := make(chan error, 1)
	p.exited = exited
	cmd := p.cmd
	go func() { exited <- cmd.Wait() }() // ends when the process exits
	select {
	case err := <-exited:
		exited <- err
		return fmt.Errorf("bench scale: %s exited at start (%v): %s", p.name, err, tail(p.out.String(), 2000))
	case <-time.After(200 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// running reports whether the process has not exited.
func (p *scaleProc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// stop sends sig and waits up to 10 s before SIGKILL.
func (p *scaleProc) stop(sig syscall.Signal) {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.exited
		p.exited <- err
	}
}

func (p *scaleProc) pid() int { return p.cmd.Process.Pid }

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// procStat is a process's CPU time and resident memory from /proc.
type procStat struct {
	CPU time.Duration // user + system
	RSS int64         // bytes
}

// readProcStat reads /proc/<pid>/stat (utime and stime, in clock ticks of
// 1/100 s, the kernel's USER_HZ on Linux) and /proc/<pid>/status (VmRSS).
func readProcStat(pid int) (procStat, error) {
	var st procStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis (state is field 3, utime 14, stime 15).
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return st, fmt.Errorf("bench scale: /proc/%d/stat: %d fields", pid, len(fields))
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	st.CPU = time.Duration(utime+stime) * 10 * time.Millisecond
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			st.RSS = kb << 10
		}
	}
	return st, nil
}

// natsNode is one node of the cluster.
type natsNode struct {
	scaleProc
	index            int
	client, monitor  string // host:port
	route            string
	storeDir, config string
}

func (n *natsNode) url() string { return "nats://" + n.client }

// natsCluster is the three nodes.
type natsCluster struct {
	nodes []*natsNode
}

// freeAddrs are n distinct free loopback addresses: all bound at once and
// then closed, since ports bound and closed one after the other can come
// back twice (a full test run once gave a node's client and monitoring
// ports the same one). Another process may still take one before its node
// binds it, which the start then reports.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// newNATSCluster writes the three nodes' configurations under dir: a
// cluster "fw", JetStream in a store of each node's own, a monitoring
// port, and the system account (for its users only; the benchmark reads
// the monitoring endpoints over HTTP).
func newNATSCluster(bin, dir string) (*natsCluster, error) {
	c := &natsCluster{}
	addrs, err := freeAddrs(9)
	if err != nil {
		return nil, err
	}
	for i := range 3 {
		n := &natsNode{index: i, storeDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		n.name, n.bin = fmt.Sprintf("nats-server n%d", i+1), bin
		n.client, n.monitor, n.route = addrs[3*i], addrs[3*i+1], addrs[3*i+2]
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		var others []string
		for _, o := range c.nodes {
			if o != n {
				others = append(others, "nats-route://"+o.route)
			}
		}
		conf := NATSClusterConfig(n.index+1, n.client, n.monitor, n.route, filepath.Join(n.storeDir, "js"), others)
		if err := os.MkdirAll(n.storeDir, 0o755); err != nil {
			return nil, err
		}
		n.config = filepath.Join(n.storeDir, "nats.conf")
		if err := os.WriteFile(n.config, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		n.args = []string{"-c", n.config}
	}
	return c, nil
}

// NATSClusterConfig is the configuration of node n (1-3) of the 3-node
// cluster "fw" that bench scale and the end-to-end tests run: clients,
// monitoring and the route on the given addresses, the others' routes
// (nats-route:// URLs), JetStream in store; clients without credentials
// are app, an account with JetStream, and sys is the system account's
// user (the meta leader's stepdown, the monitoring of accounts).
func NATSClusterConfig(n int, client, monitor, route, store string, others []string) string {
	return fmt.Sprintf(`server_name: n%d
listen: %s
http: %s
accounts {
  SYS: { users: [ { user: sys, password: sys } ] }
  APP: { jetstream: enabled, users: [ { user: app, password: app } ] }
}
system_account: SYS
no_auth_user: app
jetstream { store_dir: %q }
cluster {
  name: fw
  listen: %s
  routes: [%s]
}
`, n, client, monitor, store, route, strings.Join(others, ", "))
}

// start starts every node and waits until each accepts clients.
func (c *natsCluster) start(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := n.start(ctx); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		if err := waitDial(ctx, n.client, 20*time.Second); err != nil {
			return fmt.Errorf("bench scale: %s: %w: %s", n.name, err, tail(n.out.String(), 2000))
		}
	}
	return nil
}

func (c *natsCluster) stop() {
	for _, n := range c.nodes {
		n.stop(syscall.SIGTERM)
	}
}

// urls lists every node's URL, starting at node first (a client connects
// to the first it can reach and knows the others for its reconnects).
func (c *natsCluster) urls(first int) string {
	var u []string
	for i := range c.nodes {
		u = append(u, c.nodes[(first+i)%len(c.nodes)].url())
	}
	return strings.Join(u, ",")
}

func waitDial(ctx context.Context, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after %v", addr, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// getJSON reads a monitoring endpoint into v.
func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// varz is what the benchmark reads of a node's /varz.
type varz struct {
	InMsgs        int64 `json:"in_msgs"`
	OutMsgs       int64 `json:"out_msgs"`
	InBytes       int64 `json:"in_bytes"`
	OutBytes      int64 `json:"out_bytes"`
	SlowConsumers int64 `json:"slow_consumers"`
	Connections   int   `json:"connections"`
}

// routez is a node's /routez: one entry per route connection (a pair of
// nodes has a pool of several, plus pinned ones).
type routez struct {
	Routes []struct {
		RemoteName string `json:"remote_name"`
		InMsgs     int64  `json:"in_msgs"`
		OutMsgs    int64  `json:"out_msgs"`
		InBytes    int64  `json:"in_bytes"`
		OutBytes   int64  `json:"out_bytes"`
	} `json:"routes"`
}

// jsz is what the benchmark reads of a node's /jsz.
type jsz struct {
	Streams   int `json:"streams"`
	Consumers int `json:"consumers"`
}

// nodeSample is one reading of a node's counters.
type nodeSample struct {
	varz  varz
	links map[string]linkCount // by remote node name: out of this node towards it
	stat  procStat
}

type linkCount struct{ Msgs, Bytes int64 }

// sample reads a node's /varz, /routez and /proc; a node that is down
// gives a zero sample and false.
func (n *natsNode) sample(ctx context.Context) (nodeSample, bool) {
	s := nodeSample{links: map[string]linkCount{}}
	if !n.running() {
		return s, false
	}
	if getJSON(ctx, "http://"+n.monitor+"/varz", &s.varz) != nil {
		return s, false
	}
	var r routez
	if getJSON(ctx, "http://"+n.monitor+"/routez", &r) != nil {
		return s, false
	}
	for _, rt := range r.Routes {
		l := s.links[rt.RemoteName]
		l.Msgs += rt.OutMsgs
		l.Bytes += rt.OutBytes
		s.links[rt.RemoteName] = l
	}
	s.stat, _ = readProcStat(n.pid())
	return s, true
}

// consumers is the number of JetStream consumers every node reports
// (each counts the consumers it hosts a replica of).
func (c *natsCluster) consumers(ctx context.Context) (int, error) {
	total := 0
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		var j jsz
		if err := getJSON(ctx, "http://"+n.monitor+"/jsz", &j); err != nil {
			return 0, err
		}
		total += j.Consumers
	}
	return total, nil
}

// connz is what the benchmark reads of a node's /connz.
type connz struct {
	Connections []struct {
		Name string `json:"name"`
	} `json:"connections"`
}

// serveNodes lists the node each serve process is connected to: the
// nodes whose /connz has a connection named "fleetwatch serve", one entry
// per such connection, in node order (which serve is which is not told
// apart: they publish equal shares).
func (c *natsCluster) serveNodes(ctx context.Context) ([]int, error) {
	var out []int
	for i, n := range c.nodes {
		var z connz
		if err := getJSON(ctx, "http://"+n.monitor+"/connz?limit=100000", &z); err != nil {
			return nil, err
		}
		for _, conn := range z.Connections {
			if conn.Name == "fleetwatch serve" {
				out = append(out, i)
			}
		}
	}
	return out, nil
}
