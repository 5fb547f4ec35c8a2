package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// haYAML configures an instance of a test deployment on the NATS at url:
// short leases (3 s: a renewal slower than a third of the TTL loses the
// lease, and the suite shares two cores), few partitions, consecutive
// failures open a breaker for a long time.
func haYAML(url string, replicas int) string {
	return fmt.Sprintf(`nats: {url: %q}
probes: {disabled: true}
ha: {partitions: 8, lease_ttl: 3s, replicas: %d}
analyzer:
  window: 30s
  bucket: 1s
  open_base: 60s
  open_jitter: -1
`, url, replicas)
}

// instance is a serve instance of a test deployment; kill ends it as a
// crash would: its connection closes, it releases nothing.
type instance struct {
	*Server
	name   string
	cancel context.CancelFunc
	done   chan error
	killed bool
}

func startInstance(t *testing.T, name, yaml string) *instance {
	t.Helper()
	r := newServer(t, yaml, filepath.Join(t.TempDir(), name), Options{Logf: func(f string, a ...any) { t.Logf(name+": "+f, a...) }})
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{Server: r.Server, name: name, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan struct{})
	in.opts.OnReady = func() { close(ready) }
	go func() { in.done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-in.done; err != nil && !in.killed {
			t.Errorf("%s: Run: %v", name, err)
		}
	})
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready", name)
	}
	return in
}

func (in *instance) kill() {
	in.killed = true
	in.nc.Close()
}

// published records every snapshot seen on the decisions subjects: which
// epoch (instance) published each pool, with which fence, and when.
type published struct {
	mu    sync.Mutex
	snaps []seenSnapshot
}

type seenSnapshot struct {
	at   time.Time
	snap fleetwatch.Snapshot
}

func recordPublished(t *testing.T, nc *nats.Conn) *published {
	t.Helper()
	p := &published{}
	sub, err := nc.Subscribe("fw.decisions.>", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(m.Data, &s); err != nil {
			t.Errorf("snapshot does not parse: %v", err)
			return
		}
		p.mu.Lock()
		p.snaps = append(p.snaps, seenSnapshot{time.Now(), s})
		p.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = nc.Flush()
	return p
}

// epochsSince returns, per pool, the epochs that published it since from.
func (p *published) epochsSince(from time.Time) map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]string{}
	for _, s := range p.snaps {
		if s.at.Before(from) {
			continue
		}
		if !slices.Contains(out[s.snap.Pool], s.snap.Epoch) {
			out[s.snap.Pool] = append(out[s.snap.Pool], s.snap.Epoch)
		}
	}
	return out
}

// first returns the first snapshot of pool seen after from that cond accepts.
func (p *published) first(pool string, from time.Time, cond func(*fleetwatch.Snapshot) bool) (seenSnapshot, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.snaps {
		if s.snap.Pool == pool && !s.at.Before(from) && cond(&s.snap) {
			return s, true
		}
	}
	return seenSnapshot{}, false
}

// storedSnapshot reads pool's snapshot from fw_decisions.
func storedSnapshot(t *testing.T, nc *nats.Conn, pool string) (fleetwatch.Snapshot, bool) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), "fw_decisions")
	if err != nil {
		return fleetwatch.Snapshot{}, false
	}
	e, err := kv.Get(t.Context(), pool)
	if err != nil {
		return fleetwatch.Snapshot{}, false
	}
	var s fleetwatch.Snapshot
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		t.Fatal(err)
	}
	return s, true
}

// startWatcher runs a router-side watcher on nc until the test ends.
func startRouterWatcher(t *testing.T, nc *nats.Conn) *feed.Watcher {
	t.Helper()
	w, err := feed.NewWatcher(nc, feed.WatcherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-w.Synced()
	return w
}

// exclusive checks that the live partitions of the instances are disjoint
// and, when all is set, that they cover every partition.
func exclusive(ins []*instance, n int) (ok bool, all bool, desc string) {
	owner := make([]string, n)
	ok, all = true, true
	var b strings.Builder
	for _, in := range ins {
		if in.killed {
			continue
		}
		ps := in.ownedPartitions()
		fmt.Fprintf(&b, "%s:%v ", in.name, ps)
		for _, p := range ps {
			if owner[p] != "" {
				ok = false
			}
			owner[p] = in.name
		}
	}
	for _, o := range owner {
		if o == "" {
			all = false
		}
	}
	return ok, all, b.String()
}

// poolsPerPartition returns one pool id of each of n partitions.
func poolsPerPartition(n int) []string {
	pools := make([]string, n)
	for i, found := 0, 0; found < n; i++ {
		id := fmt.Sprintf("pool-%d", i)
		if p := fleetwatch.PartitionOf(id, n); pools[p] == "" {
			pools[p] = id
			found++
		}
	}
	return pools
}

// trafficFor publishes ok events of backend good in every pool and, for
// the pools in failing, five errors in a row of backend bad.
func trafficFor(t *testing.T, nc *nats.Conn, pools []string, failing ...string) {
	t.Helper()
	var b strings.Builder
	for _, pool := range pools {
		for range 3 {
			b.WriteString(testkit.Event(pool, "good", 200, 100) + "\n")
		}
		if slices.Contains(failing, pool) {
			for range 5 {
				b.WriteString(testkit.Event(pool, "bad", 500, 0) + "\n")
			}
		}
	}
	testkit.Publish(t, nc, "fw.outcomes.test", b.String())
}

// TestHAPartitionsAndTakeover runs three instances on one JetStream server:
// the partitions are spread between them without overlap, every pool is
// published by exactly one instance whichever collector took its events,
// and when the owner of a pool with an open breaker dies another instance
// takes its partitions over within the lease TTL plus a second, with the
// breaker still open until the same open_until and no breaker opened on
// partial data.
func TestHAPartitionsAndTakeover(t *testing.T) {
	t.Parallel() // waits on leases and timers mostly: overlaps the rest of the package
	url, _ := feedtest.NewServer(t)
	yaml := haYAML(url, 1)
	a := startInstance(t, "a", yaml)
	if got := a.ownedPartitions(); len(got) != 8 {
		t.Fatalf("a single instance holds partitions %v, want all 8", got)
	}
	b := startInstance(t, "b", yaml)
	c := startInstance(t, "c", yaml)
	ins := []*instance{a, b, c}
	testkit.Eventually(t, 20*time.Second, "the partitions spread over three instances", func() bool {
		ok, all, _ := exclusive(ins, 8)
		for _, in := range ins {
			if n := len(in.ownedPartitions()); n == 0 || n > 3 {
				return false
			}
		}
		return ok && all
	})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub := recordPublished(t, nc)
	w := startRouterWatcher(t, nc)
	pools := poolsPerPartition(8)
	target := pools[3]
	testkit.Eventually(t, 20*time.Second, "a breaker open in "+target, func() bool {
		trafficFor(t, nc, pools, target)
		v, ok := w.View(target)
		if !ok {
			return false
		}
		bad := v.Snapshot.Find("bad")
		return bad != nil && bad.State == fleetwatch.StateOpen
	})
	before, _ := w.View(target)
	openUntil := before.Snapshot.Find("bad").OpenUntil.Time

	// Every pool is published by exactly one instance: its partition's
	// owner, with that lease's fence.
	steady := time.Now()
	testkit.Eventually(t, 20*time.Second, "every pool published", func() bool {
		trafficFor(t, nc, pools)
		return len(pub.epochsSince(steady)) == len(pools)
	})
	epochOf := map[string]*instance{}
	for _, in := range ins {
		epochOf[in.epoch()] = in
	}
	for pool, epochs := range pub.epochsSince(steady) {
		if len(epochs) != 1 {
			t.Errorf("pool %s published by %d instances: %v", pool, len(epochs), epochs)
			continue
		}
		in := epochOf[epochs[0]]
		if in == nil || !slices.Contains(in.ownedPartitions(), fleetwatch.PartitionOf(pool, 8)) {
			t.Errorf("pool %s published by epoch %s, which does not own partition %d", pool, epochs[0], fleetwatch.PartitionOf(pool, 8))
		}
	}
	if ok, all, desc := exclusive(ins, 8); !ok || !all {
		t.Errorf("ownership not exclusive and complete: %s", desc)
	}

	testkit.Eventually(t, 20*time.Second, "the open breaker stored in fw_decisions", func() bool {
		s, ok := storedSnapshot(t, nc, target)
		return ok && s.Find("bad") != nil && s.Find("bad").OpenUntil != nil && s.Find("bad").OpenUntil.Equal(openUntil)
	})
	// Kill the owner of target.
	owner := epochOf[before.Snapshot.Epoch]
	if owner == nil {
		t.Fatalf("no instance has epoch %s", before.Snapshot.Epoch)
	}
	owned := owner.ownedPartitions()
	killed := time.Now()
	owner.kill()
	var survivors []*instance
	for _, in := range ins {
		if in != owner {
			survivors = append(survivors, in)
		}
	}
	var after seenSnapshot
	testkit.Eventually(t, 20*time.Second, "another instance to publish "+target, func() bool {
		var ok bool
		after, ok = pub.first(target, killed, func(s *fleetwatch.Snapshot) bool {
			return s.Epoch != before.Snapshot.Epoch && s.Fence > before.Snapshot.Fence
		})
		return ok
	})
	takeover := after.at.Sub(killed)
	t.Logf("takeover of partition %d: first snapshot of the new owner %v after the kill (lease TTL 3s)",
		fleetwatch.PartitionOf(target, 8), takeover.Round(time.Millisecond))
	artifact := filepath.Join(testkit.ArtifactDir(t), "ha-takeover.txt")
	_ = os.WriteFile(artifact, fmt.Appendf(nil, "takeover %v (lease_ttl 3s, 8 partitions, 3 instances, owner killed)\n", takeover), 0o644)

	bad := after.snap.Find("bad")
	if bad == nil || bad.State != fleetwatch.StateOpen || bad.OpenUntil == nil || !bad.OpenUntil.Equal(openUntil) {
		t.Errorf("bad in the new owner's first snapshot: %+v, want open until %v", bad, openUntil)
	}
	testkit.Eventually(t, 20*time.Second, "the killed instance's partitions taken over", func() bool {
		ok, all, _ := exclusive(survivors, 8)
		return ok && all
	})
	for _, p := range owned {
		pool := pools[p]
		// A pool of the dead owner: its first snapshot by the new owner
		// has no breaker open but the one that was.
		testkit.Eventually(t, 20*time.Second, "a snapshot of "+pool+" by a new owner", func() bool {
			trafficFor(t, nc, pools)
			_, ok := pub.first(pool, killed, func(s *fleetwatch.Snapshot) bool { return s.Epoch != before.Snapshot.Epoch })
			return ok
		})
	}
	pub.mu.Lock()
	for _, s := range pub.snaps {
		for _, be := range s.snap.Backends {
			if be.Backend == "good" && be.State != fleetwatch.StateClosed {
				t.Errorf("%s/good is %s in a snapshot of epoch %s: opened on partial data", s.snap.Pool, be.State, s.snap.Epoch)
			}
		}
	}
	pub.mu.Unlock()
	// The router's own subscription may apply the new owner's snapshot a
	// moment after this test's subscriber saw it.
	testkit.Eventually(t, 20*time.Second, "the router to follow the new owner's epoch for "+target, func() bool {
		v, _ := w.View(target)
		return v.Snapshot.Epoch != before.Snapshot.Epoch
	})
}

// TestSecondInstanceWithoutJetStreamRefused: without JetStream, a second
// serve on the same prefix refuses to start; on another prefix it starts.
func TestSecondInstanceWithoutJetStreamRefused(t *testing.T) {
	t.Parallel() // waits on leases and timers mostly: overlaps the rest of the package
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	yaml := fmt.Sprintf("nats: {url: %q, no_jetstream: true}\nprobes: {disabled: true}\n", url)
	first := startInstance(t, "first", yaml)
	if first.JetStream() {
		t.Fatal("JetStream on")
	}
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = t.TempDir()
	s, err := New(cfg, Options{Logf: t.Logf})
	if err == nil {
		s.Close()
		t.Fatal("a second instance without JetStream started")
	}
	if !strings.Contains(err.Error(), "another fleetwatch serve") {
		t.Errorf("error %q does not say why", err)
	}
	cfg.Prefix = "other"
	s, err = New(cfg, Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("on another prefix: %v", err)
	}
	s.Close()
}

// TestHAStreamKeepsEveryAcceptedEvent: two instances share the outcome
// events; every event their collectors accepted is stored once in
// FW_OUTCOMES under fw.partition.<n> (the subject the owners receive), so
// the stream's count of stored events equals the collectors' accepted
// count, and every pool's events are decided by its partition's owner.
func TestHAStreamKeepsEveryAcceptedEvent(t *testing.T) {
	t.Parallel() // waits on leases and timers mostly: overlaps the rest of the package
	url, _ := feedtest.NewServer(t)
	yaml := haYAML(url, 1)
	a := startInstance(t, "a", yaml)
	b := startInstance(t, "b", yaml)
	ins := []*instance{a, b}
	testkit.Eventually(t, 20*time.Second, "the partitions spread over two instances", func() bool {
		ok, all, _ := exclusive(ins, 8)
		return ok && all && len(a.ownedPartitions()) == 4 && len(b.ownedPartitions()) == 4
	})
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const batches, perBatch = 200, 25
	for i := range batches {
		var sb strings.Builder
		for j := range perBatch {
			sb.WriteString(testkit.Event(fmt.Sprintf("pool-%d", (i*perBatch+j)%40), "b", 200, 100) + "\n")
		}
		testkit.Publish(t, nc, "fw.outcomes.edge", sb.String())
	}
	const want = batches * perBatch
	accepted := func() int { return int(a.IngestStats().AcceptedTotal() + b.IngestStats().AcceptedTotal()) }
	testkit.Eventually(t, 20*time.Second, "the collectors to accept every event", func() bool { return accepted() == want })
	if a.IngestStats().AcceptedTotal() == 0 || b.IngestStats().AcceptedTotal() == 0 {
		t.Errorf("one collector took every event (a %d, b %d): the queue group is not shared",
			a.IngestStats().AcceptedTotal(), b.IngestStats().AcceptedTotal())
	}
	var stored int
	testkit.Eventually(t, 20*time.Second, "FW_OUTCOMES to store every accepted event", func() bool {
		n, err := a.col.ReplaySubjects(t.Context(), time.Now().Add(-time.Hour), []string{"fw.partition.>"}, func([]fleetwatch.Event) {})
		stored = n
		return err == nil && n >= want
	})
	if stored != want {
		t.Errorf("FW_OUTCOMES stores %d events, the collectors accepted %d", stored, want)
	}
	// Every pool reached its owner: the two analyzers hold 40 pools
	// between them, each in the instance that owns its partition.
	testkit.Eventually(t, 20*time.Second, "every pool decided by its owner", func() bool {
		n := 0
		for _, in := range ins {
			for _, s := range in.Snapshots() {
				if !slices.Contains(in.ownedPartitions(), fleetwatch.PartitionOf(s.Pool, 8)) {
					return false
				}
				n++
			}
		}
		return n == 40
	})
	var requests int64
	for _, in := range ins {
		for _, s := range in.Snapshots() {
			for _, be := range s.Backends {
				requests += be.Requests
			}
		}
	}
	// Exact unless a lease moved meanwhile (a renewal slower than a third
	// of the TTL on a saturated machine): a takeover may count the events
	// in flight twice (DECISIONS.md "High availability").
	if lost := a.leases.Stats().Lost + b.leases.Stats().Lost; lost > 0 {
		t.Logf("%d leases lost during the test: the owners counted %d requests for %d events", lost, requests, want)
	} else if requests != want {
		t.Errorf("the owners counted %d requests in their windows, want %d", requests, want)
	}
}
