package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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

// Elections without silence (DECISIONS.md "Elections without silence"):
// three nats-server processes in a cluster, three serve processes sharing
// 16 partitions (ha.replicas: 3, lease_ttl: 5s), twelve pools with proxy
// traffic published on every node, and a router's view of the decisions
// from every node. Killed in turn: the node that leads both the lease
// stream and the JetStream meta group, the node that leads the lease
// stream alone, a node that carries a serve's connection and leads
// neither; then every node at once, started again. Each time: no pool
// silent for longer than the lease TTL and a second, no router stale
// (none goes longer than a snapshot's ttl_ms without a fresh one), no
// fence going down on any pool's subject as any router receives it; after
// the whole cluster's restart, every pool fresh within the TTL and 5 s of
// JetStream answering again, and the open breaker still open.
//
// The worst gaps go to $FLEETWATCH_ARTIFACTS/ha-elections.txt (DEPLOY.md
// "High availability" quotes them).

const electionTTL = 5 * time.Second

var electionPools = []string{"chat", "code", "embed", "rerank", "hot", "vision", "audio", "summarize", "translate", "search", "tools", "guard"}

func TestElectionsWithoutSilence(t *testing.T) {
	t.Parallel()
	cluster := startNATSCluster(t, natsServerBinary(t))
	cluster.waitJetStream(t)
	cfg := "ha: {replicas: 3, lease_ttl: 5s, partitions: 16}\nanalyzer: {open_base: 600s, open_max: 600s, open_jitter: -1}\n"
	// One serve pinned to each node (it learns the others from the
	// cluster and moves when its node dies).
	var serves []*proc
	for _, n := range cluster.nodes {
		serves = append(serves, startServeOn(t, n.url(), cfg))
	}
	var routers []*routerView
	for i, n := range cluster.nodes {
		routers = append(routers, viewDecisions(t, fmt.Sprintf("router@n%d", i+1), n.url()))
		proxy, err := nats.Connect(n.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		for _, p := range electionPools {
			publishEvents(t, proxy, p, "a", "b")
		}
		if i == 0 {
			publishFailures(t, proxy, "hot", "bad")
		}
	}
	testkit.Eventually(t, 60*time.Second, "every pool published, hot/bad open", func() bool {
		for _, p := range electionPools {
			if _, ok := routers[0].latest(p); !ok {
				return false
			}
		}
		s, _ := routers[0].latest("hot")
		return backendState(s, "bad") == fleetwatch.StateOpen
	})
	time.Sleep(10 * time.Second) // the shares settle
	var report strings.Builder
	check := func(what string, from, to time.Time) {
		t.Helper()
		worst, where := time.Duration(0), ""
		for _, p := range electionPools {
			if g := mergedGap(routers, p, from, to); g > worst {
				worst, where = g, p
			}
		}
		fmt.Fprintf(&report, "%s: longest silence of a pool %v (%s)\n", what, worst.Round(10*time.Millisecond), where)
		t.Logf("%s: longest silence of a pool %v (%s)", what, worst.Round(10*time.Millisecond), where)
		if limit := electionTTL + time.Second; worst > limit {
			t.Errorf("%s: pool %s silent for %v, want at most the lease TTL + 1 s (%v)", what, where, worst, limit)
		}
		for _, r := range routers {
			for _, p := range electionPools {
				if stale := r.staleSpell(p, from, to); stale > 0 {
					t.Errorf("%s: %s had no fresh snapshot of %s for %v past its ttl_ms", what, r.name, p, stale.Round(10*time.Millisecond))
				}
				if down := r.fenceDown(p); down != "" {
					t.Errorf("%s: %s saw %s's fence go down: %s", what, r.name, p, down)
				}
			}
		}
	}
	lost := func() int {
		n := 0
		for _, s := range serves {
			n += strings.Count(s.all.String(), "ha: lost partition")
		}
		return n
	}
	kill := func(what string, victim *natsProc) {
		t.Helper()
		before := lost()
		t.Logf("%s: killing %s", what, victim.url())
		from := time.Now()
		victim.kill(syscall.SIGKILL)
		time.Sleep(25 * time.Second) // past the election, the TTL and a takeover
		check(what, from, time.Now())
		if n := lost() - before; n > 0 {
			t.Errorf("%s: %d leases lost, want none (every serve lives)", what, n)
		}
		victim.startPort()
		cluster.waitCurrent(t)
	}
	js, nc := clusterJS(t, cluster)
	defer nc.Close()

	// 1. The lease stream's leader moved onto the meta leader, then killed.
	meta := cluster.metaLeader(t)
	moveStreamLeader(t, js, nc, "KV_fw_leases", meta)
	kill("lease stream and meta leader "+meta, cluster.node(meta))

	// 2. The lease stream's leader on a node that does not lead the meta group.
	meta = cluster.metaLeader(t)
	other := ""
	for i := range cluster.nodes {
		if name := fmt.Sprintf("n%d", i+1); name != meta {
			other = name
			break
		}
	}
	moveStreamLeader(t, js, nc, "KV_fw_leases", other)
	kill("lease stream leader "+other+" alone", cluster.node(other))

	// 3. A node with a serve's connection, leading neither (the leaders
	// moved off it).
	carrier := ""
	for i := range cluster.nodes {
		if name := fmt.Sprintf("n%d", i+1); cluster.node(name).serveConnections(t) > 0 {
			carrier = name
		}
	}
	if carrier == "" {
		t.Fatal("no node carries a serve connection")
	}
	elsewhere := func(not string) string {
		for i := range cluster.nodes {
			if name := fmt.Sprintf("n%d", i+1); name != not {
				return name
			}
		}
		return ""
	}
	if cluster.metaLeader(t) == carrier {
		cluster.moveMetaLeader(t, elsewhere(carrier))
	}
	if streamLeader(t, js, "KV_fw_leases") == carrier {
		moveStreamLeader(t, js, nc, "KV_fw_leases", elsewhere(carrier))
	}
	kill("node "+carrier+" carrying serve connections, leading neither", cluster.node(carrier))

	// 4. The whole cluster, SIGKILLed and started again.
	hot, _ := routers[0].latest("hot")
	for _, n := range cluster.nodes {
		n.kill(syscall.SIGKILL)
	}
	time.Sleep(7 * time.Second) // past the lease TTL
	for _, n := range cluster.nodes {
		n.launch(0)
	}
	for _, n := range cluster.nodes {
		n.waitListening()
	}
	cluster.waitJetStream(t)
	back := time.Now()
	testkit.Eventually(t, 60*time.Second, "every pool published after the cluster's restart", func() bool {
		for _, p := range electionPools {
			if mergedFirstAfter(routers, p, back).IsZero() {
				return false
			}
		}
		return true
	})
	worst, where := time.Duration(0), ""
	for _, p := range electionPools {
		if d := mergedFirstAfter(routers, p, back).Sub(back); d > worst {
			worst, where = d, p
		}
	}
	fmt.Fprintf(&report, "whole cluster SIGKILLed for 7 s: every pool fresh within %v of JetStream answering (last %s)\n", worst.Round(10*time.Millisecond), where)
	t.Logf("whole cluster: every pool fresh within %v of JetStream answering (last: %s)", worst.Round(10*time.Millisecond), where)
	if limit := electionTTL + 5*time.Second; worst > limit {
		t.Errorf("after the whole cluster's restart pool %s was fresh %v after JetStream answered, want within %v", where, worst, limit)
	}
	after, _ := routers[0].latest("hot")
	if backendState(after, "bad") != fleetwatch.StateOpen || openUntil(after, "bad").Before(openUntil(hot, "bad")) {
		t.Errorf("hot/bad after the restart: %s until %v, want open until %v", backendState(after, "bad"), openUntil(after, "bad"), openUntil(hot, "bad"))
	}
	for _, r := range routers {
		for _, p := range electionPools {
			if down := r.fenceDown(p); down != "" {
				t.Errorf("whole cluster: %s saw %s's fence go down: %s", r.name, p, down)
			}
		}
	}
	if dir := os.Getenv("FLEETWATCH_ARTIFACTS"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "ha-elections.txt"), []byte(report.String()), 0o644)
	}
}

// routerView is what a router connected to one node receives: every
// snapshot of every pool, in arrival order.
type routerView struct {
	name string
	mu   sync.Mutex
	got  map[string][]arrival
}

type arrival struct {
	at   time.Time
	snap fleetwatch.Snapshot
}

func viewDecisions(t *testing.T, name, url string) *routerView {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	l := &routerView{name: name, got: map[string][]arrival{}}
	if _, err := nc.Subscribe("fw.decisions.>", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if json.Unmarshal(m.Data, &s) != nil {
			return
		}
		l.mu.Lock()
		l.got[s.Pool] = append(l.got[s.Pool], arrival{time.Now(), s})
		l.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *routerView) latest(pool string) (fleetwatch.Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.got[pool]
	if len(a) == 0 {
		return fleetwatch.Snapshot{}, false
	}
	return a[len(a)-1].snap, true
}

func (l *routerView) times(pool string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for _, a := range l.got[pool] {
		out = append(out, a.at)
	}
	return out
}

// staleSpell is how long, between from and to, this router held no
// snapshot of pool fresher than at + ttl_ms: a router that would have
// failed static.
func (l *routerView) staleSpell(pool string, from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var spell time.Duration
	a := l.got[pool]
	for i, cur := range a {
		next := to
		if i+1 < len(a) {
			next = a[i+1].at
		}
		if next.Before(from) || cur.at.After(to) {
			continue
		}
		expires := cur.snap.At.Add(time.Duration(cur.snap.TTLMs) * time.Millisecond)
		if d := next.Sub(expires); d > spell {
			spell = d
		}
	}
	return spell
}

// fenceDown describes the first snapshot of pool whose fence was below an
// earlier one's, as this router received them ("" if none).
func (l *routerView) fenceDown(pool string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var high uint64
	for _, a := range l.got[pool] {
		if a.snap.Fence < high {
			return fmt.Sprintf("%d after %d at %s (epoch %s seq %d)", a.snap.Fence, high, a.at.Format("15:04:05.000"), a.snap.Epoch, a.snap.Seq)
		}
		high = max(high, a.snap.Fence)
	}
	return ""
}

// mergedGap is the longest time between from and to in which no router
// received a snapshot of pool: the pool's own silence, apart from any one
// router's reconnect.
func mergedGap(routers []*routerView, pool string, from, to time.Time) time.Duration {
	var all []time.Time
	for _, r := range routers {
		all = append(all, r.times(pool)...)
	}
	slices.SortFunc(all, time.Time.Compare)
	prev, gap := from, time.Duration(0)
	for _, at := range all {
		if at.Before(from) || at.After(to) {
			continue
		}
		gap = max(gap, at.Sub(prev))
		prev = at
	}
	return max(gap, to.Sub(prev))
}

func mergedFirstAfter(routers []*routerView, pool string, t time.Time) time.Time {
	var first time.Time
	for _, r := range routers {
		for _, at := range r.times(pool) {
			if at.After(t) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	return first
}

func backendState(s fleetwatch.Snapshot, backend string) fleetwatch.State {
	for _, b := range s.Backends {
		if b.Backend == backend {
			return b.State
		}
	}
	return ""
}

func openUntil(s fleetwatch.Snapshot, backend string) time.Time {
	for _, b := range s.Backends {
		if b.Backend == backend && b.OpenUntil != nil {
			return b.OpenUntil.Time
		}
	}
	return time.Time{}
}

// publishFailures publishes a failure of backend every 100 ms until the
// test ends.
func publishFailures(t testing.TB, nc *nats.Conn, pool, backend string) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_ = nc.Publish("fw.outcomes", []byte(testkit.Event(pool, backend, 500, 0)))
		}
	}()
}

func clusterJS(t *testing.T, c *natsCluster) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, nc
}

func streamLeader(t *testing.T, js jetstream.JetStream, name string) string {
	t.Helper()
	var leader string
	testkit.Eventually(t, 30*time.Second, "stream "+name+"'s leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil || s.CachedInfo().Cluster == nil {
			return false
		}
		leader = s.CachedInfo().Cluster.Leader
		return leader != ""
	})
	return leader
}

// moveStreamLeader asks the stream's leader to step down in favour of
// node to (nats-server 2.11+), until to leads it.
func moveStreamLeader(t *testing.T, js jetstream.JetStream, nc *nats.Conn, stream, to string) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "stream "+stream+" led by "+to, func() bool {
		if streamLeader(t, js, stream) == to {
			return true
		}
		req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, to)
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), 2*time.Second)
		time.Sleep(time.Second)
		return false
	})
}

// metaLeader is the JetStream meta group's leader, from a node's /jsz.
func (c *natsCluster) metaLeader(t *testing.T) string {
	t.Helper()
	var leader string
	testkit.Eventually(t, 30*time.Second, "the meta leader", func() bool {
		for _, n := range c.nodes {
			var jsz struct {
				Meta struct {
					Leader string `json:"leader"`
				} `json:"meta_cluster"`
			}
			if n.monitorJSON("/jsz", &jsz) == nil && jsz.Meta.Leader != "" {
				leader = jsz.Meta.Leader
				return true
			}
		}
		return false
	})
	return leader
}

// moveMetaLeader asks the meta leader to step down in favour of node to
// (nats-server 2.11+, as the system account's user), until to leads.
func (c *natsCluster) moveMetaLeader(t *testing.T, to string) {
	t.Helper()
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, "nats://sys:sys@"+n.addr())
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testkit.Eventually(t, 60*time.Second, "the meta group led by "+to, func() bool {
		if c.metaLeader(t) == to {
			return true
		}
		req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, to)
		_, _ = nc.Request("$JS.API.META.LEADER.STEPDOWN", []byte(req), 2*time.Second)
		time.Sleep(2 * time.Second)
		return false
	})
}

// waitCurrent waits until every node is back in the meta group and the
// lease stream has all its replicas current.
func (c *natsCluster) waitCurrent(t *testing.T) {
	t.Helper()
	js, nc := clusterJS(t, c)
	defer nc.Close()
	testkit.Eventually(t, 60*time.Second, "the lease stream's three replicas current", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "KV_fw_leases")
		if err != nil || s.CachedInfo().Cluster == nil {
			return false
		}
		ci := s.CachedInfo().Cluster
		current := 0
		for _, r := range ci.Replicas {
			if r.Current {
				current++
			}
		}
		return ci.Leader != "" && current == 2
	})
	time.Sleep(5 * time.Second) // the other streams catch up too
}

func (c *natsCluster) node(name string) *natsProc {
	for i, n := range c.nodes {
		if fmt.Sprintf("n%d", i+1) == name {
			return n
		}
	}
	return nil
}

// serveConnections counts the node's client connections named "fleetwatch
// serve", from its /connz.
func (n *natsProc) serveConnections(t *testing.T) int {
	var connz struct {
		Conns []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if err := n.monitorJSON("/connz", &connz); err != nil {
		t.Logf("connz: %v", err)
		return 0
	}
	k := 0
	for _, c := range connz.Conns {
		if c.Name == "fleetwatch serve" {
			k++
		}
	}
	return k
}

func (n *natsProc) monitorJSON(path string, v any) error {
	if n.monitor == "" {
		return fmt.Errorf("no monitoring port")
	}
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + n.monitor + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
