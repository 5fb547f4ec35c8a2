package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// The partition leases (DECISIONS.md "High availability").
//
// Pools are hashed into n partitions (fleetwatch.PartitionOf). Exactly one
// instance owns a partition at a time, through a lease: the key p.<n> of
// the KV bucket fw_leases, whose TTL is the lease TTL. An instance acquires
// a free partition with Create (which fails while another holds it), renews
// it every third of the TTL with Update at the revision it last wrote (a
// compare-and-set), and loses it when a renewal fails: it stops publishing
// the partition's pools at once and forgets them. When an owner dies its
// keys expire with the bucket's TTL and another instance creates them. Each
// instance also keeps a member key i.<id> alive, so that every instance
// knows how many share the partitions and takes at most its share
// ceil(n/instances) while others are alive. The fence of a partition is the
// revision of the Create that acquired it: higher for every later owner.

// partition states.
const (
	stateRestoring = 1 // leased, being rebuilt: nothing published, events buffered
	stateLive      = 2 // leased and rebuilt: its pools are decided and published here
)

// lease is one held partition.
type lease struct {
	rev        uint64    // revision of the last write (the CAS base of the next)
	dropped    int       // the subscription's drops already counted
	fence      uint64    // revision of the Create that acquired it
	validUntil time.Time // the lease is not trusted past this (sent + 9/10 TTL)
	state      int
	riding     bool // the last renewal failed for a reason that is not a loss (an election, an outage)
	sub        *nats.Subscription
	buffer     []*nats.Msg // partition batches received while restoring
}

// ownership is an immutable view of the partitions held, swapped on every
// change, read without a lock by the collector's sink and the publisher.
type ownership struct {
	held       []bool // leased, live or restoring
	live       []bool
	fence      []uint64
	validUntil []time.Time
}

// ha is the instance's part of a deployment: its leases, the partitions it
// decides, and the subscriptions that bring other collectors' events of
// those partitions to it.
type ha struct {
	s      *Server
	n      int
	ttl    time.Duration
	id     string
	kv     jetstream.KeyValue // nil without JetStream: every partition is live here
	header nats.Header        // sent with this instance's republished batches

	view atomic.Pointer[ownership] // nil: every partition is live, unfenced

	// mu guards leases, instances, lastMember, cooling, restoring, rebuilt
	// and bufferedBytes.
	mu         sync.Mutex
	leases     map[int]*lease
	instances  int
	lastMember time.Time
	cooling    map[int]time.Time // partitions given back: not taken again before then
	restoring  bool              // a takeover runs
	rebuilt    time.Duration     // the last takeover's rebuild
	// bufferedBytes are the partition batches held by restoring leases.
	bufferedBytes int
	// maxFence is the highest fence this instance acquired or restored:
	// the floor of a lease bucket it has to create again.
	maxFence uint64
	// lastLeaseOK is when a lease operation last got an answer from the
	// server (a success or a definite refusal): /healthz.
	lastLeaseOK time.Time

	acquired, lost, released *metrics.Counter
	ridden, retaken          *metrics.Counter
	fromOthers, ownSkipped   *metrics.Counter
	forwarded, unowned       *metrics.Counter
	malformed, buffered      *metrics.Counter
	dropped                  *metrics.Counter
	takeover                 *metrics.Histogram
}

// originHeader names the instance whose collector republished a batch.
const originHeader = "Fw-Origin"

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

func newHA(s *Server) *ha {
	hs := s.cfg.HASettings()
	h := &ha{
		s:       s,
		n:       hs.Partitions,
		ttl:     hs.LeaseTTL.Duration,
		id:      newInstanceID(),
		leases:  map[int]*lease{},
		cooling: map[int]time.Time{},
	}
	h.header = nats.Header{originHeader: []string{h.id}}
	m := s.metrics
	h.acquired = m.NewCounter("fleetwatch_ha_leases_acquired_total")
	h.lost = m.NewCounter("fleetwatch_ha_leases_lost_total")
	h.released = m.NewCounter("fleetwatch_ha_leases_released_total")
	h.ridden = m.NewCounter("fleetwatch_ha_lease_renewals_ridden_total")
	h.retaken = m.NewCounter("fleetwatch_ha_leases_retaken_total")
	h.fromOthers = m.NewCounter("fleetwatch_ha_partition_events_received_total")
	h.ownSkipped = m.NewCounter("fleetwatch_ha_partition_batches_own_total")
	h.forwarded = m.NewCounter("fleetwatch_ha_events_forwarded_total")
	h.unowned = m.NewCounter("fleetwatch_ha_snapshots_unowned_total")
	h.malformed = m.NewCounter("fleetwatch_ha_partition_lines_malformed_total")
	h.buffered = m.NewCounter("fleetwatch_ha_partition_batches_buffered_total")
	h.dropped = m.NewCounter("fleetwatch_ha_partition_batches_dropped_total")
	h.takeover = m.NewHistogram("fleetwatch_ha_takeover_duration_seconds")
	m.NewGauge("fleetwatch_ha_partitions_owned", func() float64 {
		v := h.view.Load()
		if v == nil {
			return float64(h.n)
		}
		k := 0
		for _, l := range v.live {
			if l {
				k++
			}
		}
		return float64(k)
	})
	m.NewGauge("fleetwatch_ha_instances", func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(max(h.instances, 1))
	})
	return h
}

func leaseKey(p int) string { return "p." + strconv.Itoa(p) }

// publishViewLocked rebuilds the lock-free view from the leases.
func (h *ha) publishViewLocked() {
	v := &ownership{held: make([]bool, h.n), live: make([]bool, h.n), fence: make([]uint64, h.n), validUntil: make([]time.Time, h.n)}
	for p, l := range h.leases {
		v.held[p] = true
		v.live[p] = l.state == stateLive
		v.fence[p] = l.fence
		v.validUntil[p] = h.trustedUntil(l)
	}
	h.view.Store(v)
}

// owns reports whether the instance decides pool now (ok), and the fence
// to publish its snapshot with; held is true while the pool's partition is
// leased, even when it is still being rebuilt or its lease is overdue.
func (h *ha) owns(pool string, now time.Time) (fence uint64, ok, held bool) {
	v := h.view.Load()
	if v == nil {
		return 0, true, true
	}
	p := fleetwatch.PartitionOf(pool, h.n)
	if !v.live[p] || now.After(v.validUntil[p]) {
		return 0, false, v.held[p]
	}
	return v.fence[p], true, true
}

// leader reports whether this instance owns partition 0 now: the one
// instance of a deployment that publishes what concerns no pool in
// particular (the drift review digest). Without JetStream, always.
func (h *ha) leader() bool {
	v := h.view.Load()
	return v == nil || v.live[0]
}

// rideFor is how long past its TTL a lease whose renewals get no answer
// is still trusted: long enough to ride out a JetStream leader election
// (4.4-7.5 s measured with nats-server 2.15 at R3) or a short outage of
// the server. Nobody can take the lease meanwhile without the stream
// accepting a write, and whoever does holds a higher fence, which routers
// and the decisions bucket prefer (DECISIONS.md "NATS restarts and
// elections").
func (h *ha) rideFor() time.Duration { return 2 * h.ttl }

// trustedUntil is when lease l stops being trusted: 9/10 of the TTL after
// its last successful renewal was sent, and rideFor more while its
// renewals get no answer.
func (h *ha) trustedUntil(l *lease) time.Time {
	if l.riding {
		return l.validUntil.Add(h.rideFor())
	}
	return l.validUntil
}

// renewEvery and tickEvery are the lease loop's cadences.
func (h *ha) renewEvery() time.Duration { return h.ttl / 3 }
func (h *ha) tickEvery() time.Duration {
	return min(max(h.ttl/10, 50*time.Millisecond), 500*time.Millisecond)
}

// loop keeps the leases until ctx ends: it renews them, keeps the member
// key alive, gives back partitions beyond the instance's share and takes
// free ones up to it, rebuilding them (takeover) before they are published.
func (h *ha) loop(ctx context.Context) {
	tick := time.NewTicker(h.tickEvery())
	defer tick.Stop()
	var takeovers sync.WaitGroup
	defer takeovers.Wait()
	lastRenew := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if h.s.nc.IsClosed() {
			return // the connection is gone for good: the leases expire
		}
		now := time.Now()
		if now.Sub(lastRenew) >= h.renewEvery() {
			lastRenew = now
			h.putMember(ctx) // before the renewals: a dead instance's member key expires before its leases
			h.renew(ctx)
			h.countMembers(ctx)
			h.rebalance(ctx)
		}
		h.expire(time.Now())
		h.countDropped()
		h.mu.Lock()
		busy := h.restoring
		h.mu.Unlock()
		if busy {
			continue
		}
		if got := h.acquire(ctx, false); len(got) > 0 {
			h.mu.Lock()
			h.restoring = true
			h.mu.Unlock()
			takeovers.Go(func() {
				h.takeOver(ctx, got, false)
				h.mu.Lock()
				h.restoring = false
				h.mu.Unlock()
			})
		}
	}
}

// start keeps the member key, takes the instance's first share of the
// partitions and rebuilds them, before anything is published (Run).
func (h *ha) start(ctx context.Context) {
	h.putMember(ctx)
	h.countMembers(ctx)
	got := h.acquire(ctx, true)
	// The leases are renewed while a long replay runs.
	stop := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		t := time.NewTicker(h.renewEvery())
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				h.renew(ctx)
			}
		}
	})
	h.takeOver(ctx, got, true)
	close(stop)
	renewing.Wait()
	// Configured pools of partitions others own are not decided here.
	h.s.an.Forget(func(pool string) bool { _, _, held := h.owns(pool, time.Now()); return !held })
}

// putMember writes the member key.
func (h *ha) putMember(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, h.ttl/3)
	defer cancel()
	if _, err := h.kv.Put(c, "i."+h.id, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil && ctx.Err() == nil {
		h.s.logf("ha: member key: %v", err)
		h.kickEnsure()
	}
}

// countMembers counts the live instances by their member keys.
func (h *ha) countMembers(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, h.ttl/3)
	defer cancel()
	keys, err := h.kv.ListKeysFiltered(c, "i.*")
	if err != nil {
		return
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	h.mu.Lock()
	h.instances = max(n, 1)
	h.lastMember = time.Now()
	h.mu.Unlock()
}

// share is how many partitions the instance may hold while others live.
func (h *ha) shareLocked() int {
	k := max(h.instances, 1)
	return (h.n + k - 1) / k
}

// renew renews every held lease, all at once (one slow request must not
// delay the others past their TTL); a failed renewal loses the partition.
func (h *ha) renew(ctx context.Context) {
	h.mu.Lock()
	held := make(map[int]uint64, len(h.leases))
	for p, l := range h.leases {
		held[p] = l.rev
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for p, rev := range held {
		wg.Go(func() { h.renewOne(ctx, p, rev) })
	}
	wg.Wait()
}

func (h *ha) renewOne(ctx context.Context, p int, rev uint64) {
	sent := time.Now()
	c, cancel := context.WithTimeout(ctx, h.ttl/2)
	next, err := h.kv.Update(c, leaseKey(p), []byte(h.id), rev)
	cancel()
	refusal := err
	if err != nil && leaseRefused(err) {
		c, cancel := context.WithTimeout(ctx, h.ttl/2)
		next, err = h.retake(c, p)
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			err = refusal // another instance holds it: the renewal's refusal says why
		}
	}
	retaken := refusal != nil && err == nil
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.leases[p]
	if l == nil || l.rev != rev {
		if retaken { // lost or given back meanwhile: nobody keeps this key alive
			go h.dropKey(p, next)
		}
		return
	}
	if retaken {
		// Nobody holds the key now. The partition stays live here without
		// a rebuild (its events kept coming on its subscription), under
		// the retake's revision: a fence above that of anyone who held
		// the key in between, which routers follow.
		h.retaken.Inc()
		h.s.logf("ha: renewing partition %d: %v; nobody else held it: took it again (fence %d -> %d)", p, refusal, l.fence, next)
		l.fence = next
		h.maxFence = max(h.maxFence, next)
	}
	if err != nil {
		if !leaseRefused(err) {
			// No answer (an election, an outage, a bucket the server
			// lost): ride it out until trustedUntil, and check the bucket.
			if !l.riding {
				l.riding = true
				h.ridden.Inc()
				h.s.logf("ha: renewing partition %d: %v (still publishing it until %s unless a renewal is refused)",
					p, err, h.trustedUntil(l).Format(time.RFC3339Nano))
				h.publishViewLocked()
			}
			h.kickEnsure()
			return
		}
		h.lastLeaseOK = time.Now()
		h.loseLocked(p, fmt.Sprintf("renewal failed: %v", err))
		return
	}
	h.lastLeaseOK = time.Now()
	if l.riding {
		h.s.logf("ha: renewed partition %d again", p)
	}
	l.riding = false
	l.rev = next
	l.validUntil = sent.Add(h.ttl * 9 / 10)
	h.publishViewLocked()
}

// countDropped counts the partition batches nats.go dropped because a
// partition subscription fell behind its pending limits.
func (h *ha) countDropped() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.leases {
		if l.sub == nil {
			continue
		}
		if n, err := l.sub.Dropped(); err == nil && n > l.dropped {
			h.dropped.Add(n - l.dropped)
			l.dropped = n
		}
	}
}

// expire loses the leases not renewed in time (a renewal that hangs).
func (h *ha) expire(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, l := range h.leases {
		if now.After(h.trustedUntil(l)) {
			if l.riding {
				h.loseLocked(p, fmt.Sprintf("no renewal answered within the lease TTL and %v more", h.rideFor()))
			} else {
				h.loseLocked(p, "not renewed within the lease TTL")
			}
		}
	}
}

// loseLocked gives up partition p at once: its pools are no longer
// published nor decided here.
func (h *ha) loseLocked(p int, why string) {
	l := h.leases[p]
	if l == nil {
		return
	}
	if l.sub != nil {
		_ = l.sub.Unsubscribe()
	}
	for _, m := range l.buffer {
		h.bufferedBytes -= len(m.Data)
	}
	delete(h.leases, p)
	h.publishViewLocked()
	h.lost.Inc()
	forgotten := h.s.an.Forget(func(pool string) bool { return fleetwatch.PartitionOf(pool, h.n) == p })
	h.s.logf("ha: lost partition %d (%s): %d pools forgotten", p, why, len(forgotten))
}

// rebalance gives back the partitions beyond the instance's share when
// other instances live, so that they can take them.
func (h *ha) rebalance(ctx context.Context) {
	h.mu.Lock()
	share := h.shareLocked()
	var extra []int
	if len(h.leases) > share && h.instances > 1 && !h.restoring {
		held := make([]int, 0, len(h.leases))
		for p := range h.leases {
			held = append(held, p)
		}
		slices.Sort(held)
		extra = held[share:]
	}
	revs := map[int]uint64{}
	for _, p := range extra {
		h.cooling[p] = time.Now().Add(2 * h.ttl)
		revs[p] = h.leases[p].rev
		l := h.leases[p]
		if l.sub != nil {
			_ = l.sub.Unsubscribe()
		}
		delete(h.leases, p)
	}
	if len(extra) > 0 {
		h.publishViewLocked()
	}
	h.mu.Unlock()
	if len(extra) == 0 {
		return
	}
	h.s.an.Forget(func(pool string) bool { _, ok := revs[fleetwatch.PartitionOf(pool, h.n)]; return ok })
	for p, rev := range revs {
		c, cancel := context.WithTimeout(ctx, h.ttl/3)
		err := h.kv.Delete(c, leaseKey(p), jetstream.LastRevision(rev))
		cancel()
		h.released.Inc()
		if err != nil {
			h.s.logf("ha: releasing partition %d: %v (it expires within %v)", p, err, h.ttl)
		}
	}
	h.s.logf("ha: gave back partitions %v to the other instances (share %d)", extra, share)
}

// releaseAll gives back every lease on the way out, so that another
// instance takes over without waiting for the TTL.
func (h *ha) releaseAll() {
	if h.kv == nil {
		return
	}
	h.mu.Lock()
	revs := map[int]uint64{}
	for p, l := range h.leases {
		revs[p] = l.rev
		if l.sub != nil {
			_ = l.sub.Unsubscribe()
		}
	}
	h.leases = map[int]*lease{}
	h.publishViewLocked()
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for p, rev := range revs {
		if h.kv.Delete(ctx, leaseKey(p), jetstream.LastRevision(rev)) == nil {
			h.released.Inc()
		}
	}
	_ = h.kv.Delete(ctx, "i."+h.id)
}

// acquire tries to create the leases of the free partitions, unless the
// instance holds more than its share already (it is giving some back), and
// except those it gave back lately. A free partition is taken even beyond
// the share: the share is counted from member keys that may still name a
// dead instance for a moment, and a dead owner's partitions must not wait
// for that (correctness first; the share is restored by the next
// rebalance). It returns the partitions acquired, in restoring state and
// subscribed.
func (h *ha) acquire(ctx context.Context, first bool) []int {
	now := time.Now()
	h.mu.Lock()
	if len(h.leases) > h.shareLocked() {
		h.mu.Unlock()
		return nil
	}
	skip := make(map[int]bool, len(h.leases)+len(h.cooling))
	for p := range h.leases {
		skip[p] = true
	}
	for p, until := range h.cooling {
		if now.Before(until) {
			skip[p] = true
		} else {
			delete(h.cooling, p)
		}
	}
	want := h.n
	if first {
		want = h.shareLocked() // at start, the share: others may be starting too
	}
	h.mu.Unlock()
	// Start at a point of the ring of this instance's own, so that
	// instances starting together contend less.
	start := fleetwatch.PartitionOf(h.id, h.n)
	var got []int
	failures := 0
	for i := 0; i < h.n && len(got) < want; i++ {
		p := (start + i) % h.n
		if skip[p] {
			continue
		}
		sent := time.Now()
		c, cancel := context.WithTimeout(ctx, h.ttl/3)
		rev, err := h.kv.Create(c, leaseKey(p), []byte(h.id))
		if errors.Is(err, jetstream.ErrKeyExists) {
			if rev, err = h.retake(c, p); err == nil {
				h.s.logf("ha: took back partition %d (its lease still named this instance, or had just expired)", p)
			}
		}
		cancel()
		if err != nil {
			if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil && !h.s.nc.IsClosed() {
				if failures++; failures == 1 {
					h.s.logf("ha: acquiring partition %d: %v", p, err)
				}
				h.kickEnsure()
				if !leaseRefused(err) {
					break // no answer: the next tick tries again, after the bucket is checked
				}
			}
			continue
		}
		l := &lease{rev: rev, fence: rev, validUntil: sent.Add(h.ttl * 9 / 10), state: stateRestoring}
		sub, err := h.s.nc.Subscribe(h.s.subj.Partition(p), func(m *nats.Msg) { h.onPartition(p, m) })
		if err != nil {
			h.s.logf("ha: subscribe partition %d: %v", p, err)
			_ = h.kv.Delete(ctx, leaseKey(p), jetstream.LastRevision(rev))
			continue
		}
		l.sub = sub
		h.mu.Lock()
		h.maxFence = max(h.maxFence, rev)
		h.lastLeaseOK = time.Now()
		h.leases[p] = l
		h.publishViewLocked()
		h.mu.Unlock()
		h.acquired.Inc()
		got = append(got, p)
	}
	if len(got) > 0 {
		_ = h.s.nc.Flush() // the subscriptions are in place before the replay
	}
	return got
}

// retake takes partition p's lease again after the server refused a
// renewal or a Create, when nobody else holds it: a key that still names
// this instance (lost while its renewals got no answer for the TTL and the
// ride, or a renewal that got no answer and landed after all) is updated at
// its current revision, and a key that is gone (it outlived the bucket's
// max age, the TTL, while an election left renewals unanswered) is created
// again. Either way the new revision is a fence above every earlier one.
// A key naming another instance: ErrKeyExists.
func (h *ha) retake(ctx context.Context, p int) (uint64, error) {
	e, err := h.kv.Get(ctx, leaseKey(p))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return h.kv.Create(ctx, leaseKey(p), []byte(h.id))
	case err != nil:
		return 0, err
	case string(e.Value()) != h.id:
		return 0, jetstream.ErrKeyExists
	}
	return h.kv.Update(ctx, leaseKey(p), []byte(h.id), e.Revision())
}

// dropKey deletes partition p's lease key at revision rev: a retake whose
// lease was lost or given back while it ran.
func (h *ha) dropKey(p int, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), h.ttl/3)
	defer cancel()
	_ = h.kv.Delete(ctx, leaseKey(p), jetstream.LastRevision(rev))
}

// ownedPartitions returns the partitions whose pools this instance decides now,
// sorted (every partition without JetStream).
func (s *Server) ownedPartitions() []int {
	v := s.ha.view.Load()
	var out []int
	for p := range s.ha.n {
		if v == nil || v.live[p] {
			out = append(out, p)
		}
	}
	return out
}

// epoch is the analyzer's epoch: the epoch of every snapshot this instance
// publishes ("" before the first evaluation).
func (s *Server) epoch() string { return s.an.Epoch() }
