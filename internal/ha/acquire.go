package ha

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The standby's side: the member keys and the share, observing the other
// instances' leases, taking free or abandoned partitions, and giving back
// what is beyond the share.

// memberCount is the number of live instances, by their member keys.
type memberCount struct {
	n     int
	since time.Time // when n last changed
}

// watched is what a standby last read of a partition another instance
// holds, or of a key without an entry.
type watched struct {
	rev    uint64
	absent bool
	// since is when this revision was first read, in a run of reads each
	// within observeGap of the one before and none failed; last is the
	// last read of the run.
	since, last time.Time
}

// putMember writes the member key: the time, which the others read to
// count the live instances.
func (m *Manager) putMember(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, m.opTimeout())
	defer cancel()
	now := m.d.Now()
	_, err := m.d.Store.Put(c, memberPrefix+m.id, now.UTC().Format(time.RFC3339Nano))
	m.mu.Lock()
	m.noteLocked(err, m.d.Now())
	m.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		m.d.Logf("ha: member key: %v", err)
		m.d.Trouble()
	}
}

// countMembers counts the live instances: the member keys written within
// two TTLs (by the writers' clocks, so a skew up to a TTL is tolerated;
// the count only sets the shares, never who may publish).
func (m *Manager) countMembers(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, m.opTimeout())
	defer cancel()
	vals, err := m.d.Store.Members(c, memberPrefix)
	if err != nil {
		return
	}
	now := m.d.Now()
	n := 0
	self := false
	for key, v := range vals {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			continue
		}
		if d := now.Sub(t); d <= 2*m.ttl && d >= -2*m.ttl {
			n++
			self = self || key == memberPrefix+m.id
		}
	}
	if !self {
		n++ // this instance lives, whatever its key says
	}
	m.mu.Lock()
	if n != m.members.n {
		m.members = memberCount{n: n, since: now}
	}
	m.mu.Unlock()
}

// shareLocked is how many partitions the instance may hold while others
// live: ceil(n / instances).
func (m *Manager) shareLocked() int {
	k := max(m.members.n, 1)
	return (m.n + k - 1) / k
}

// read is one partition's key as read by acquire.
type read struct {
	e   Entry
	err error
	at  time.Time // when the answer came
}

// readAll reads the lease keys of partitions ps at once.
func (m *Manager) readAll(ctx context.Context, ps []int) map[int]read {
	out := make(map[int]read, len(ps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, m.opTimeout())
			e, err := m.d.Store.Read(c, leaseKey(p))
			cancel()
			mu.Lock()
			out[p] = read{e: e, err: err, at: m.d.Now()}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// acquire reads the lease keys of the partitions not held here and takes
// those that are free: without an entry (at once at the start of an
// instance that created the store; otherwise once observed so for a TTL,
// so that a holder whose key was lost takes it back first), released (a delete marker: at once), naming this instance (a
// lease it lost track of), or held by an instance that has not renewed
// them while the store could take renewals: the same revision read from
// the store's leader for a whole TTL (see the package comment). It takes
// nothing while it holds more than its share, and at the start no more
// than the share; otherwise a free partition is taken even beyond the
// share: the share counts member keys that may still name a dead instance
// for a moment, and a dead owner's partitions must not wait for that (the
// next rebalance restores the shares). It returns the partitions acquired,
// restoring and subscribed.
func (m *Manager) acquire(ctx context.Context, first bool) []int {
	now := m.d.Now()
	m.mu.Lock()
	if len(m.leases) > m.shareLocked() {
		m.mu.Unlock()
		return nil
	}
	var candidates []int
	for p := range m.n {
		if _, held := m.leases[p]; held {
			delete(m.watched, p)
			continue
		}
		if until, ok := m.cooling[p]; ok {
			if !now.Before(until) {
				delete(m.cooling, p)
			} else if len(m.leases) >= m.shareLocked() {
				continue // given back lately: left to the others unless this instance is below its share
			}
		}
		candidates = append(candidates, p)
	}
	m.mu.Unlock()
	if len(candidates) == 0 {
		return nil
	}
	reads := m.readAll(ctx, candidates)
	for _, r := range reads {
		if released(r.e) && r.err == nil {
			// A lease given back: count the instances again before
			// deciding who takes it (a stopping instance deletes its
			// member key before it gives its leases back).
			m.countMembers(ctx)
			break
		}
	}
	free, abandoned := m.decide(reads, first)
	// Start at a point of the ring of this instance's own, so that
	// instances starting together contend less.
	start := fleetwatch.PartitionOf(m.id, m.n)
	ring := func(a, b int) int { return (a-start+m.n)%m.n - (b-start+m.n)%m.n }
	slices.SortFunc(free, ring)
	slices.SortFunc(abandoned, ring)
	m.mu.Lock()
	budget := m.shareLocked() - len(m.leases)
	m.mu.Unlock()
	var got []int
	for _, p := range abandoned {
		if first && len(got) >= budget {
			break
		}
		if m.takeOne(ctx, p, reads[p].e, reads[p].err) {
			got = append(got, p)
		}
	}
	for _, p := range free {
		if len(got) >= budget {
			break
		}
		if m.takeOne(ctx, p, reads[p].e, reads[p].err) {
			got = append(got, p)
		}
	}
	return got
}

// decide updates the observations with reads and returns the partitions
// that may be taken now: free ones (given back, or without an entry),
// which an instance takes up to its share, and abandoned ones (a holder
// that stopped renewing, a deleted key observed for a TTL, a key naming
// this instance), which it takes whatever its share: a dead owner's
// partitions must not wait for the shares (the next rebalance restores
// them). An instance at or above its share leaves a free partition to
// those below theirs for a TTL, then takes it too.
func (m *Manager) decide(reads map[int]read, first bool) (free, abandoned []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range reads {
		if r.err != nil && !errors.Is(r.err, ErrNotFound) {
			// A failed read may hide an election, in which the holders
			// ride: every observation starts again.
			clear(m.watched)
			m.noteLocked(r.err, r.at)
			m.d.Trouble()
			return nil, nil
		}
	}
	below := len(m.leases) < m.shareLocked()
	for p, r := range reads {
		m.noteLocked(r.err, r.at)
		absent := errors.Is(r.err, ErrNotFound)
		given := !absent && released(r.e)
		switch {
		case absent && first && m.fresh, given && below:
			free = append(free, p)
		case !absent && r.e.Value == m.id && !r.e.Deleted:
			abandoned = append(abandoned, p)
		case m.observedFor(p, r, absent):
			if absent || given {
				free = append(free, p)
			} else {
				abandoned = append(abandoned, p)
			}
		}
	}
	return free, abandoned
}

// observedFor records read r of partition p and reports whether the same
// entry (or the same absence) has now been read for a TTL, in a run of
// reads each within observeGap of the one before.
func (m *Manager) observedFor(p int, r read, absent bool) bool {
	w := m.watched[p]
	if w == nil || w.absent != absent || (!absent && w.rev != r.e.Revision) || r.at.Sub(w.last) > m.observeGap() {
		m.watched[p] = &watched{rev: r.e.Revision, absent: absent, since: r.at, last: r.at}
		return false
	}
	w.last = r.at
	return r.at.Sub(w.since) >= m.ttl
}

// takeOne writes partition p's lease key as read (e, readErr) and
// subscribes to its batches. It reports whether the partition was
// acquired.
func (m *Manager) takeOne(ctx context.Context, p int, e Entry, readErr error) bool {
	sent := m.d.Now()
	c, cancel := context.WithTimeout(ctx, m.opTimeout())
	var rev uint64
	var err error
	how := "took"
	switch {
	case errors.Is(readErr, ErrNotFound):
		rev, err = m.d.Store.Create(c, leaseKey(p), m.id)
	case released(e):
		rev, err = m.d.Store.Update(c, leaseKey(p), m.id, e.Revision)
	case e.Value == m.id && !e.Deleted:
		how = "took back"
		rev, err = m.d.Store.Update(c, leaseKey(p), m.id, e.Revision)
	case e.Deleted:
		how = "took over a deleted key of"
		rev, err = m.d.Store.Update(c, leaseKey(p), m.id, e.Revision)
	default:
		how = "took over from " + e.Value + ","
		rev, err = m.d.Store.Update(c, leaseKey(p), m.id, e.Revision)
	}
	cancel()
	m.mu.Lock()
	m.noteLocked(err, m.d.Now())
	delete(m.watched, p)
	m.mu.Unlock()
	if err != nil {
		if !errors.Is(err, ErrRefused) && ctx.Err() == nil && !m.d.Closed() {
			m.d.Logf("ha: acquiring partition %d: %v", p, err)
			m.d.Trouble()
		}
		return false
	}
	l := &lease{rev: rev, fence: rev, state: stateRestoring, okSent: sent,
		trusted: sent.Add(m.validFor()), nextRenew: sent.Add(m.renewEvery())}
	sub, err := m.d.Subscribe(p, func(b []byte, own bool) { m.onPartition(p, b, own) })
	if err != nil {
		m.d.Logf("ha: subscribe partition %d: %v", p, err)
		m.dropKey(p, rev)
		return false
	}
	l.sub = sub
	m.mu.Lock()
	m.maxFence = max(m.maxFence, rev)
	m.lastAcquired = m.d.Now()
	m.leases[p] = l
	m.publishViewLocked()
	m.mu.Unlock()
	m.m.acquired.Inc()
	if how != "took" {
		m.d.Logf("ha: %s partition %d (fence %d)", how, p, rev)
	}
	return true
}

// rebalance gives back the partitions beyond the instance's share when
// other instances live and the deployment is settled: no trouble with the
// store for settleFor, no partition acquired here and a member count
// unchanged for a renewal period (a count lags a departure by up to that),
// no takeover running, every
// lease live and trusted. Given back by writing the release value, which
// the others take at once; not taken here again for two TTLs unless this
// instance is below its share.
func (m *Manager) rebalance(ctx context.Context) {
	now := m.d.Now()
	m.mu.Lock()
	share, instances := m.shareLocked(), m.members.n
	if len(m.leases) <= share || instances <= 1 || m.restoring || now.Sub(m.lastAcquired) < m.renewEvery() ||
		now.Sub(m.lastTrouble) < m.settleFor() || now.Sub(m.members.since) < m.renewEvery() {
		m.mu.Unlock()
		return
	}
	held := make([]int, 0, len(m.leases))
	for p, l := range m.leases {
		if l.state != stateLive || l.suspended || l.riding || now.After(l.trusted) {
			m.mu.Unlock()
			return
		}
		held = append(held, p)
	}
	slices.Sort(held)
	extra := held[share:]
	revs := map[int]uint64{}
	for _, p := range extra {
		m.cooling[p] = now.Add(2 * m.ttl)
		revs[p] = m.leases[p].rev
		m.dropLocked(p, m.leases[p])
	}
	m.publishViewLocked()
	m.mu.Unlock()
	m.d.Forget(func(pool string) bool { _, ok := revs[fleetwatch.PartitionOf(pool, m.n)]; return ok })
	for p, rev := range revs {
		c, cancel := context.WithTimeout(ctx, m.opTimeout())
		_, err := m.d.Store.Update(c, leaseKey(p), released_, rev)
		cancel()
		m.m.released.Inc()
		if err != nil {
			m.d.Logf("ha: releasing partition %d: %v (another instance takes it once it has observed it for %v)", p, err, m.ttl)
		}
	}
	m.d.Logf("ha: gave back partitions %v to the other instances (share %d of %d instances)", extra, share, instances)
}

// released_ is the value a holder writes to give a lease back: it stopped
// publishing before writing it, so whoever reads it may take the lease at
// once. (A delete marker is not that: it may be an operator's, under a
// holder that still publishes.)
const released_ = ""

// released reports whether e is a lease given back by its holder.
func released(e Entry) bool { return e.Value == released_ && !e.Deleted }
