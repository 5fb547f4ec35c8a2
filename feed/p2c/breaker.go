package p2c

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The local breaker is the router's own circuit breaker per backend, for
// when the feed is down. With a stale snapshot (or before the first one)
// the picker routes on its own signals, and its strongest one, the
// in-flight count, is exactly wrong for a backend that fails at once: it
// has nothing in flight and wins every comparison, the fast-failure trap
// fleetwatch exists to close. So every outcome also drives a small breaker
// per backend, the analyzer's rule in miniature: LocalFailures failures in
// a row (error, timeout or throttled) open it for LocalOpen x the trips in a
// row, capped at LocalOpenMax; then it is half-open, a trickle of
// LocalTrickle weight, until LocalSuccesses successes in a row close it, or
// a failure opens it again for longer. The breaker tracks every outcome but
// is consulted only on the stale path: while the feed is fresh, the
// analyzer's breakers, which see every router's traffic, decide.
//
// The state is four atomics per backend (carried across snapshots with the
// in-flight count), so Pick and Done stay lock-free; concurrent outcomes
// may race on the edges (two failures both tripping), which costs at most
// one trip's growth.

// Defaults of the local breaker's Settings.
const (
	DefaultLocalFailures  = 5
	DefaultLocalOpen      = 10 * time.Second
	DefaultLocalOpenMax   = time.Minute
	DefaultLocalTrickle   = 0.05
	DefaultLocalSuccesses = 3
)

// localBreakerFailure reports whether an outcome counts as a failure for
// the local breaker.
func localBreakerFailure(o fleetwatch.Outcome) bool {
	return o.IsFailure() || o == fleetwatch.OutcomeThrottled
}

// localOutcome feeds one outcome to l's breaker.
func (p *Picker) localOutcome(l *local, outcome fleetwatch.Outcome) {
	switch {
	case outcome == fleetwatch.OutcomeOK:
		if l.fails.Load() != 0 { // a load, not a store, on the common path
			l.fails.Store(0)
		}
		if l.openUntil.Load() != 0 && l.oks.Add(1) >= p.localSuccesses {
			p.closeLocal(l)
		}
	case localBreakerFailure(outcome):
		l.oks.Store(0)
		f := l.fails.Add(1)
		switch until := l.openUntil.Load(); {
		case until == 0:
			if f >= p.localFailures {
				p.tripLocal(l, 0)
			}
		case p.now().UnixNano() >= until: // a half-open probe failed
			p.tripLocal(l, until)
		}
	}
}

// tripLocal opens l's breaker (old is the openUntil it replaces: 0 when it
// was closed) for localOpen x its trips in a row, capped.
func (p *Picker) tripLocal(l *local, old int64) {
	trips := l.trips.Add(1)
	d := min(p.localOpen*time.Duration(trips), p.localOpenMax)
	until := p.now().Add(d).UnixNano()
	if !l.openUntil.CompareAndSwap(old, until) {
		l.trips.Add(-1) // another outcome tripped it first
		return
	}
	l.fails.Store(0)
	if old == 0 {
		p.tripped.Add(1)
	}
}

// closeLocal closes l's breaker.
func (p *Picker) closeLocal(l *local) {
	if until := l.openUntil.Load(); until != 0 && l.openUntil.CompareAndSwap(until, 0) {
		p.tripped.Add(-1)
		l.trips.Store(0)
		l.oks.Store(0)
	}
}

// localWeight is entry i's weight by its local breaker at now: 1 closed
// (or the breaker disabled), 0 open, localTrickle half-open.
func (p *Picker) localWeight(st *state, i int, now int64) float64 {
	until := st.entries[i].local.openUntil.Load()
	switch {
	case until == 0:
		return 1
	case now < until:
		return 0
	default:
		return p.localTrickle
	}
}

// LocalState returns backend's local breaker state at the picker's clock:
// StateClosed, StateOpen or StateHalfOpen ("" for a backend the picker does
// not know). It is for metrics and tests; the picker consults it only while
// the snapshot is stale.
func (p *Picker) LocalState(backend string) fleetwatch.State {
	l := p.lookup(backend)
	if l == nil {
		return ""
	}
	switch until := l.openUntil.Load(); {
	case until == 0:
		return fleetwatch.StateClosed
	case p.now().UnixNano() < until:
		return fleetwatch.StateOpen
	default:
		return fleetwatch.StateHalfOpen
	}
}
