// Package ha shares the pools of a deployment between serve instances:
// partition leases in a key-value store, fencing, hand-back of partitions
// beyond an instance's share, and the takeover of a dead owner's pools.
//
// Pools are hashed into n partitions (fleetwatch.PartitionOf). An instance
// owns a partition while it holds the lease key p.<n>: it writes the key
// with compare-and-set and renews it every third of the lease TTL. The
// fence of a partition is the revision of the write that acquired it: a
// later owner's is higher, and routers and the decisions bucket follow the
// higher fence (DECISIONS.md "High availability").
//
// A lease is not ended by the store: the bucket keeps keys far longer than
// the TTL, so a leader election of the store, however long, expires
// nobody's lease. A standby takes a lease over by observing it: when it
// has read, from the store's leader, the same revision of a key for a
// whole TTL without a failed read in between, the holder has not renewed
// for that long while the store could take its renewals, and the standby
// writes the key at that revision (a compare-and-set: a renewal that lands
// first wins). This is the observed-lease rule of Kubernetes' leader
// election (client-go's leaderelection: observedTime, not the record's
// timestamps) applied to a store that can tell "no leader" from "no
// answer".
//
// The holder trusts its lease until 9/10 of the TTL after its last
// successful renewal was sent. A renewal the store answers with "no
// leader" (an election) extends the trust by rideSlack past the moment it
// was sent, as long as the lease was still trusted then: while the store
// has no leader nobody can write, and a standby's observation, which needs
// the leader's answers, starts again after the election, so the holder
// keeps publishing through an election of any length (bounded by rideMax)
// and renews first after it. A lease no longer trusted is suspended, not
// lost: its pools are not published, but they keep being decided here and
// the lease is resumed without a rebuild when a renewal succeeds again,
// since the key proves nobody held it in between. It is lost only when the
// store shows another holder, or a release marker (someone held it since).
//
// The package holds no *Server: its dependencies are the Store, the clock
// and the functions of Deps, so the lease logic runs in simulated time in
// its tests.
package ha

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
)

// Settings configure a Manager. The zero value works.
type Settings struct {
	// Partitions is the number of partitions. If zero, 16.
	Partitions int
	// TTL is the lease TTL. If zero, 5s.
	TTL time.Duration
	// ID names the instance in the store. If empty, the host name and a
	// random suffix (a new one for every process: a restarted instance
	// never mistakes its predecessor's leases for its own).
	ID string
	// FreshStore says the store was created empty by this process, at its
	// start: Start takes lease keys without an entry at once. Otherwise a
	// key without an entry is taken only once observed so for a TTL: it
	// may have been lost under a live holder (a bucket made again), who
	// takes it back first.
	FreshStore bool
}

// Deps are what a Manager needs from the daemon around it. Store nil
// means no store (no JetStream): the instance is alone and every partition
// is live, unfenced.
type Deps struct {
	Store Store
	// Now reads the clock. If nil, time.Now.
	Now func() time.Time
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Metrics receives the fleetwatch_ha_* metrics. If nil, a set of its
	// own.
	Metrics *metrics.Set
	// Subscribe delivers partition p's event batches as they are
	// republished by the collectors; own is true for the batches of this
	// instance's collector. The server must have the subscription when it
	// returns (the rebuild replays what came before).
	Subscribe func(p int, deliver func(batch []byte, own bool)) (Subscription, error)
	// Rebuild reads the last state of the pools of partitions (their
	// snapshots, their events replayed) apart from the live decisions.
	// first is the instance's start. An error abandons the partitions
	// (except at the start, where Rebuild decides what it can use).
	Rebuild func(ctx context.Context, partitions []int, first bool) (Rebuilt, error)
	// Observe decides on a batch of a partition's events (the other
	// instances' collectors' batches, and this one's while the partition
	// was being rebuilt).
	Observe func(batch []byte)
	// Forget drops every pool for which drop is true from the decisions
	// (a partition lost or given back) and returns how many.
	Forget func(drop func(pool string) bool) int
	// AfterTakeover runs once pools went live after a takeover (pools is
	// what the rebuild adopted).
	AfterTakeover func(ctx context.Context, pools []string, first bool)
	// Trouble tells that a store operation got no answer: the store's
	// resources may need to be made again.
	Trouble func()
	// Closed reports that the connection to the store is closed for good.
	Closed func() bool
}

// Rebuilt is a rebuild's result: the pools it read, ready to be decided
// here.
type Rebuilt interface {
	// Adopt moves the pools for which keep is true into the live
	// decisions and returns them.
	Adopt(keep func(pool string) bool) []string
	// Summary says what was read, for the log.
	Summary() string
}

// Manager holds this instance's leases.
//
// Lifecycle: Start takes the first share and rebuilds it, Run keeps the
// leases until its context ends, Release gives every lease back.
type Manager struct {
	n     int
	ttl   time.Duration
	id    string
	fresh bool
	d     Deps

	view atomic.Pointer[Ownership] // nil without a store: every partition live, unfenced

	// mu guards everything below.
	mu      sync.Mutex
	leases  map[int]*lease
	watched map[int]*watched  // partitions others hold, as last read
	cooling map[int]time.Time // partitions given back: not taken again before then
	members memberCount
	// restoring is true while a takeover rebuilds partitions.
	restoring bool
	// rebuilt is the last takeover's duration.
	rebuilt time.Duration
	// bufferedBytes are the batches held by restoring leases.
	bufferedBytes int
	// maxFence is the highest fence acquired here: the floor of a lease
	// bucket that has to be made again.
	maxFence uint64
	// lastAnswer is when the store last answered a lease operation;
	// lastTrouble when one last failed (no answer, or no leader).
	lastAnswer, lastTrouble time.Time
	// lastBeat is when the member key was last written and counted (beat);
	// beating while that runs; lastAcquired is when a partition was last
	// acquired here.
	lastBeat, lastAcquired time.Time
	beating                bool
	beats                  sync.WaitGroup // the running beat

	m managerMetrics
}

// Ownership is an immutable view of the partitions held, swapped on every
// change and read without a lock (the collector's sink, the publisher).
type Ownership struct {
	held       []bool // leased: live, suspended or restoring
	live       []bool // rebuilt: its pools are decided here
	fence      []uint64
	validUntil []time.Time // published only before this
}

// Live reports whether partition p's pools are decided here (rebuilt;
// its lease may be suspended).
func (o *Ownership) Live(p int) bool { return o == nil || o.live[p] }

// Publishes reports whether partition p's pools are published here at
// now (live and trusted), and the fence to publish them with.
func (o *Ownership) Publishes(p int, now time.Time) (fence uint64, ok bool) {
	if o == nil {
		return 0, true
	}
	if !o.live[p] || now.After(o.validUntil[p]) {
		return 0, false
	}
	return o.fence[p], true
}

// New returns the Manager of one instance.
func New(s Settings, d Deps) *Manager {
	if s.Partitions <= 0 {
		s.Partitions = 16
	}
	if s.TTL <= 0 {
		s.TTL = 5 * time.Second
	}
	if s.ID == "" {
		s.ID = newInstanceID()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logf == nil {
		d.Logf = func(string, ...any) {}
	}
	if d.Metrics == nil {
		d.Metrics = metrics.NewSet()
	}
	if d.Trouble == nil {
		d.Trouble = func() {}
	}
	if d.Closed == nil {
		d.Closed = func() bool { return false }
	}
	m := &Manager{
		n:       s.Partitions,
		ttl:     s.TTL,
		id:      s.ID,
		fresh:   s.FreshStore,
		d:       d,
		leases:  map[int]*lease{},
		watched: map[int]*watched{},
		cooling: map[int]time.Time{},
	}
	m.m = newManagerMetrics(m, d.Metrics)
	if d.Store != nil {
		m.view.Store(m.newOwnership())
	}
	return m
}

func newInstanceID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "serve"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, host)
	return host + "-" + hex.EncodeToString(b[:])
}

// ID is the instance's id in the store.
func (m *Manager) ID() string { return m.id }

// Partitions is the number of partitions.
func (m *Manager) Partitions() int { return m.n }

// TTL is the lease TTL.
func (m *Manager) TTL() time.Duration { return m.ttl }

// Standalone reports whether the manager runs without a store.
func (m *Manager) Standalone() bool { return m.d.Store == nil }

func leaseKey(p int) string { return "p." + strconv.Itoa(p) }

// memberPrefix starts the member keys.
const memberPrefix = "i."

func (m *Manager) newOwnership() *Ownership {
	return &Ownership{held: make([]bool, m.n), live: make([]bool, m.n), fence: make([]uint64, m.n), validUntil: make([]time.Time, m.n)}
}

// publishViewLocked rebuilds the lock-free view from the leases.
func (m *Manager) publishViewLocked() {
	v := m.newOwnership()
	for p, l := range m.leases {
		v.held[p] = true
		v.live[p] = l.state == stateLive
		v.fence[p] = l.fence
		v.validUntil[p] = l.trusted
	}
	m.view.Store(v)
}

// View is the current ownership (nil without a store: every partition
// live).
func (m *Manager) View() *Ownership { return m.view.Load() }

// Owns reports whether the instance publishes pool now (ok), and the fence
// to publish its snapshot with; held is true while the pool's partition is
// leased here, even while it is rebuilt or its lease is suspended.
func (m *Manager) Owns(pool string, now time.Time) (fence uint64, ok, held bool) {
	v := m.view.Load()
	if v == nil {
		return 0, true, true
	}
	p := fleetwatch.PartitionOf(pool, m.n)
	fence, ok = v.Publishes(p, now)
	return fence, ok, v.held[p]
}

// Leader reports whether this instance owns partition 0: the one instance
// of a deployment that publishes what concerns no pool in particular (the
// drift review digest). Without a store, always.
func (m *Manager) Leader() bool {
	v := m.view.Load()
	return v == nil || v.live[0]
}

// OwnedPartitions returns the partitions whose pools are decided here,
// sorted (every partition without a store).
func (m *Manager) OwnedPartitions() []int {
	v := m.view.Load()
	var out []int
	for p := range m.n {
		if v == nil || v.live[p] {
			out = append(out, p)
		}
	}
	return out
}

// Fence is partition p's fence here (0 when not held).
func (m *Manager) Fence(p int) uint64 {
	v := m.view.Load()
	if v == nil {
		return 0
	}
	return v.fence[p]
}

// MaxFence is the highest fence this instance acquired.
func (m *Manager) MaxFence() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxFence
}

// Summary is the lease state /healthz reports: partitions live here, the
// instances counted, and when the store last answered a lease operation.
func (m *Manager) Summary() (live, instances int, lastAnswer time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.leases {
		if l.state == stateLive {
			live++
		}
	}
	return live, max(m.members.n, 1), m.lastAnswer
}

// Stats are the manager's counts since it started.
type Stats struct {
	Acquired, Lost, Released, Ridden, Retaken, Suspended uint64
}

// Stats returns the manager's counts.
func (m *Manager) Stats() Stats {
	return Stats{
		Acquired: m.m.acquired.Get(), Lost: m.m.lost.Get(), Released: m.m.released.Get(),
		Ridden: m.m.ridden.Get(), Retaken: m.m.retaken.Get(), Suspended: m.m.suspended.Get(),
	}
}

// EnsureStore makes the store's resources again if the server lost them
// (nil without a store).
func (m *Manager) EnsureStore(ctx context.Context) error {
	if m.d.Store == nil {
		return nil
	}
	return m.d.Store.Ensure(ctx)
}

// LastRebuild is how long the last takeover took.
func (m *Manager) LastRebuild() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rebuilt
}

// Timing of the lease loop, all from the TTL. A lease is renewed every
// fifth of the TTL and a renewal gets a fifth of the TTL to be answered:
// a holder whose server dies has at least 0.9 - 0.2 = 0.7 TTL (3.5 s by
// default) to reconnect and renew, or ride an election, before its trust
// runs out (a renewal every third of the TTL, answered within half of it,
// left it 0.57 TTL, and a holder whose reconnect took 2 s under an
// election was silenced: TestElectionsWithoutSilence).
func (m *Manager) renewEvery() time.Duration { return m.ttl / 5 }
func (m *Manager) renewTimeout() time.Duration {
	return max(m.ttl/5, 100*time.Millisecond)
}
func (m *Manager) tickEvery() time.Duration {
	return min(max(m.ttl/10, 50*time.Millisecond), 500*time.Millisecond)
}

// validFor is how long after a successful renewal was sent the lease is
// trusted: 9/10 of the TTL, so that the holder stops before a standby that
// observed the renewal's revision for a whole TTL may take it.
func (m *Manager) validFor() time.Duration { return m.ttl * 9 / 10 }

// rideSlack is how long past the sending of a renewal that the store
// answered "no leader" the lease stays trusted: the renewals are tried
// again every tick meanwhile, each answered at once, so the trust is
// extended as long as the election lasts.
func (m *Manager) rideSlack() time.Duration { return m.ttl / 2 }

// rideMax bounds the trust past the last successful renewal, however long
// the store answers "no leader" (elections measured 4-8 s with
// nats-server 2.15 at R3; longer than the TTL with 2.9). Past it the lease
// is suspended.
func (m *Manager) rideMax() time.Duration { return 4 * m.ttl }

// observeGap is the longest pause between two reads of a standby's
// observation: a longer one (a stalled loop) starts the observation again,
// since an election may have hidden in it.
func (m *Manager) observeGap() time.Duration { return m.ttl / 4 }

// settleFor is how long the instance must have seen no trouble and a
// stable member count before it gives partitions back.
func (m *Manager) settleFor() time.Duration { return 2 * m.ttl }

// opTimeout bounds one store operation.
func (m *Manager) opTimeout() time.Duration { return m.ttl / 3 }

// Run keeps the leases until ctx ends: it renews them, keeps the member
// key alive and counts the instances, gives back partitions beyond the
// instance's share once the deployment is settled, observes the others'
// leases and takes free or abandoned ones, rebuilding them (takeover)
// before their pools are published. Without a store it returns at once.
func (m *Manager) Run(ctx context.Context) {
	if m.d.Store == nil {
		return
	}
	tick := time.NewTicker(m.tickEvery())
	defer tick.Stop()
	var takeovers sync.WaitGroup
	defer takeovers.Wait()
	defer m.beats.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if m.d.Closed() {
			return // the connection is gone for good
		}
		if got := m.step(ctx); len(got) > 0 {
			takeovers.Go(func() {
				m.takeOver(ctx, got, false)
				m.mu.Lock()
				m.restoring = false
				m.mu.Unlock()
			})
		}
	}
}

// step is one tick of the lease loop. It returns the partitions acquired,
// marked restoring (the caller rebuilds them).
func (m *Manager) step(ctx context.Context) []int {
	now := m.d.Now()
	m.beat(ctx, now)
	m.renew(ctx)
	m.suspendOverdue(m.d.Now())
	m.rebalance(ctx)
	m.countDropped()
	m.mu.Lock()
	busy := m.restoring
	m.mu.Unlock()
	if busy {
		return nil
	}
	got := m.acquire(ctx, false)
	if len(got) > 0 {
		m.mu.Lock()
		m.restoring = true
		m.mu.Unlock()
	}
	return got
}

// beat writes the member key and counts the instances every renewal
// period, in a goroutine of its own: in an election the member write
// waits for "no leader" and the count (a stream info request) for its
// timeout, and the renewals, which ride the election, must not wait
// behind them.
func (m *Manager) beat(ctx context.Context, now time.Time) {
	m.mu.Lock()
	if m.beating || now.Sub(m.lastBeat) < m.renewEvery() {
		m.mu.Unlock()
		return
	}
	m.beating, m.lastBeat = true, now
	m.mu.Unlock()
	m.beats.Go(func() {
		m.putMember(ctx)
		m.countMembers(ctx)
		m.mu.Lock()
		m.beating = false
		m.mu.Unlock()
	})
}

// Start keeps the member key, takes the instance's first share of the
// partitions and rebuilds it, before anything is published; the leases are
// renewed while the rebuild runs.
func (m *Manager) Start(ctx context.Context) {
	if m.d.Store == nil {
		return
	}
	m.mu.Lock()
	m.lastBeat = m.d.Now()
	m.mu.Unlock()
	m.putMember(ctx)
	m.countMembers(ctx)
	got := m.acquire(ctx, true)
	stop := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		t := time.NewTicker(m.tickEvery())
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				m.renew(ctx)
			}
		}
	})
	m.takeOver(ctx, got, true)
	close(stop)
	renewing.Wait()
	// Configured pools of partitions others own are not decided here.
	m.d.Forget(func(pool string) bool { _, _, held := m.Owns(pool, m.d.Now()); return !held })
}

// noteLocked records the store's answer to a lease operation made at
// now: an answer (a success, a refusal, "no leader") or none; "no leader"
// and no answer are trouble, which holds rebalancing back.
func (m *Manager) noteLocked(err error, now time.Time) {
	if err == nil || answered(err) {
		m.lastAnswer = now
	}
	if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrNotFound) {
		m.lastTrouble = now
	}
}
