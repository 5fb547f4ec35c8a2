package ha

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The holder's side of a lease: renewals, the trust they give, the ride
// through an election, suspension, and loss.

// lease states.
const (
	stateRestoring = 1 // leased, being rebuilt: nothing published, batches buffered
	stateLive      = 2 // leased and rebuilt: its pools are decided here
)

// lease is one held partition.
type lease struct {
	rev   uint64 // revision of the last write (the compare-and-set base of the next)
	fence uint64 // revision of the write that acquired it
	state int
	// okSent is when the last successful renewal (or the acquisition) was
	// sent; trusted is until when the lease is published.
	okSent, trusted time.Time
	// riding: the last renewal was answered "no leader"; failing: it got
	// no answer.
	riding, failing bool
	// suspended: the trust ran out; published again once a renewal
	// succeeds.
	suspended bool
	// nextRenew is when the next renewal is due; renewing is true while
	// one runs.
	nextRenew time.Time
	renewing  bool
	dropped   int // the subscription's drops already counted
	sub       Subscription
	buffer    [][]byte // batches received while restoring
}

// renew renews every lease that is due, all at once (one slow request
// must not delay the others), and waits for them.
func (m *Manager) renew(ctx context.Context) {
	now := m.d.Now()
	m.mu.Lock()
	due := map[int]uint64{}
	for p, l := range m.leases {
		if !l.renewing && !now.Before(l.nextRenew) {
			l.renewing = true
			due[p] = l.rev
		}
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for p, rev := range due {
		wg.Go(func() { m.renewOne(ctx, p, rev) })
	}
	wg.Wait()
}

func (m *Manager) renewOne(ctx context.Context, p int, rev uint64) {
	sent := m.d.Now()
	c, cancel := context.WithTimeout(ctx, m.renewTimeout())
	next, err := m.d.Store.Update(c, leaseKey(p), m.id, rev)
	cancel()
	refusal := err
	retaken := false
	if errors.Is(err, ErrRefused) {
		c, cancel := context.WithTimeout(ctx, m.renewTimeout())
		next, err = m.retake(c, p)
		cancel()
		retaken = err == nil
	}
	now := m.d.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[p]
	if l == nil || l.rev != rev {
		if retaken { // lost or given back meanwhile: nobody keeps this key alive
			go m.dropKey(p, next)
		}
		if l != nil {
			l.renewing = false
		}
		return
	}
	l.renewing = false
	m.noteLocked(err, now)
	switch {
	case err == nil:
		m.renewedLocked(p, l, sent, next, retaken, refusal)
	case errors.Is(err, ErrNoLeader):
		// Nobody can write while the store has no leader, and no standby
		// observes the key meanwhile: keep publishing, and try every tick.
		if !sent.After(l.trusted) {
			l.trusted = later(l.trusted, earlier(sent.Add(m.rideSlack()), l.okSent.Add(m.rideMax())))
		}
		if !l.riding {
			l.riding = true
			m.m.ridden.Inc()
			m.d.Logf("ha: renewing partition %d: %v (publishing it while the store answers so, until %s at most)",
				p, err, l.okSent.Add(m.rideMax()).UTC().Format(time.RFC3339Nano))
		}
		l.nextRenew = now
		m.d.Trouble()
		m.publishViewLocked()
	case errors.Is(err, ErrRefused):
		m.loseLocked(p, fmt.Sprintf("renewal refused: %v", err))
	default:
		// No answer: nothing is known of the others, so the trust is not
		// extended; tried again every tick.
		if !l.failing {
			l.failing = true
			m.d.Logf("ha: renewing partition %d: %v (published until %s unless a renewal succeeds)", p, err, l.trusted.UTC().Format(time.RFC3339Nano))
		}
		l.nextRenew = now
		m.d.Trouble()
	}
}

// renewedLocked records a successful renewal of partition p sent at sent.
func (m *Manager) renewedLocked(p int, l *lease, sent time.Time, next uint64, retaken bool, refusal error) {
	if retaken {
		// The key named this instance at another revision (a renewal that
		// got no answer landed after all), or had no entry (the bucket
		// was made again): nobody held it in between. The partition stays
		// live without a rebuild, under the new revision: a fence above
		// every earlier one.
		m.m.retaken.Inc()
		m.d.Logf("ha: renewing partition %d: %v; nobody else held it: took it again (fence %d -> %d)", p, refusal, l.fence, next)
		l.fence = next
		m.maxFence = max(m.maxFence, next)
	}
	if l.suspended {
		m.d.Logf("ha: renewed partition %d: publishing it again (nobody held it meanwhile)", p)
	} else if l.riding {
		m.d.Logf("ha: renewed partition %d again", p)
	}
	l.riding, l.suspended, l.failing = false, false, false
	l.rev = next
	l.okSent = sent
	l.trusted = sent.Add(m.validFor())
	l.nextRenew = sent.Add(m.renewEvery())
	m.publishViewLocked()
}

// retake takes partition p's lease again after the store refused a
// renewal, when nobody else held it since: a key that still names this
// instance is updated at its revision, a key without any entry (the
// bucket was made again, or the key aged out of it) is created. A release
// marker or another holder's name means someone held it meanwhile:
// ErrRefused, and the lease is lost.
func (m *Manager) retake(ctx context.Context, p int) (uint64, error) {
	e, err := m.d.Store.Read(ctx, leaseKey(p))
	switch {
	case errors.Is(err, ErrNotFound):
		return m.d.Store.Create(ctx, leaseKey(p), m.id)
	case err != nil:
		return 0, err
	case e.Deleted:
		return 0, fmt.Errorf("%w: the key was deleted (by an operator?)", ErrRefused)
	case released(e):
		return 0, fmt.Errorf("%w: another instance held it and gave it back", ErrRefused)
	case e.Value != m.id:
		return 0, fmt.Errorf("%w: %s holds it", ErrRefused, e.Value)
	}
	return m.d.Store.Update(ctx, leaseKey(p), m.id, e.Revision)
}

// suspendOverdue marks the leases whose trust ran out: their pools are no
// longer published (Owns says so already), until a renewal succeeds.
func (m *Manager) suspendOverdue(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, l := range m.leases {
		if !l.suspended && now.After(l.trusted) {
			l.suspended = true
			m.m.suspended.Inc()
			m.d.Logf("ha: partition %d suspended: no renewal succeeded since %s (not published until one does; kept unless the store shows another holder)",
				p, l.okSent.UTC().Format(time.RFC3339Nano))
		}
	}
}

// loseLocked gives up partition p at once: its pools are no longer
// published nor decided here.
func (m *Manager) loseLocked(p int, why string) {
	l := m.leases[p]
	if l == nil {
		return
	}
	m.dropLocked(p, l)
	m.publishViewLocked()
	m.m.lost.Inc()
	forgotten := m.d.Forget(func(pool string) bool { return fleetwatch.PartitionOf(pool, m.n) == p })
	m.d.Logf("ha: lost partition %d (%s): %d pools forgotten", p, why, forgotten)
}

// dropLocked removes lease l of partition p: its subscription and
// buffered batches.
func (m *Manager) dropLocked(p int, l *lease) {
	if l.sub != nil {
		_ = l.sub.Unsubscribe()
	}
	for _, b := range l.buffer {
		m.bufferedBytes -= len(b)
	}
	delete(m.leases, p)
}

// Release gives back every lease on the way out (a graceful stop), so
// that another instance takes over at once instead of after the TTL.
func (m *Manager) Release() {
	if m.d.Store == nil {
		return
	}
	m.mu.Lock()
	revs := map[int]uint64{}
	for p, l := range m.leases {
		revs[p] = l.rev
		m.dropLocked(p, l)
	}
	m.publishViewLocked()
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// The member key first: the others count one instance less before
	// they see the leases given back, and take them at once.
	_ = m.d.Store.Delete(ctx, memberPrefix+m.id, 0)
	for p, rev := range revs {
		if _, err := m.d.Store.Update(ctx, leaseKey(p), released_, rev); err == nil {
			m.m.released.Inc()
		}
	}
}

// dropKey gives partition p's lease back at revision rev: a write whose
// lease was lost or given back while it ran.
func (m *Manager) dropKey(p int, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opTimeout())
	defer cancel()
	_, _ = m.d.Store.Update(ctx, leaseKey(p), released_, rev)
}

// countDropped counts the partition batches the subscriptions dropped
// because they fell behind.
func (m *Manager) countDropped() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.leases {
		if l.sub == nil {
			continue
		}
		if n, err := l.sub.Dropped(); err == nil && n > l.dropped {
			m.m.dropped.Add(n - l.dropped)
			l.dropped = n
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
