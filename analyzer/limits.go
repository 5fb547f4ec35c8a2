package analyzer

import (
	"fmt"

	"github.com/fleetwatch/fleetwatch"
)

// Defaults of Limits. They bound what a publisher inventing pool and backend
// ids can make fleetwatch hold, and sit far above a large real fleet: a pool
// is usually one model name (hundreds at most), a backend one inference
// server (a big pool has tens to a few hundred replicas, a big fleet a few
// thousand). A tracked backend costs about 5.4 KiB of analyzer state with a
// full 30 s window (BenchmarkMemory10kBackends), and in serve about 20 KiB
// more for the status page's ten minutes of history
// (TestHistoryMemoryPerBackend): about 25 KiB of live heap in all, so the
// 20,000 of MaxBackends are about 500 MiB once the history is full. The
// limit is per instance: 20,000 lets the survivor of a failover hold a
// fleet of 10,000 backends with room (it was 5,000, under which such a
// survivor refused events; docs/DECISIONS.md "Bounded under abuse"). A pool
// of 1,000 backends encodes to about 450 KB of snapshot JSON, under NATS's
// default max_payload of 1 MiB.
const (
	DefaultMaxPools           = 1000
	DefaultMaxBackendsPerPool = 1000
	DefaultMaxBackends        = 20000
)

// Limits bound how many pools and backends the analyzer tracks. The zero
// value works: every zero field takes its default. Configured pools and
// backends always fit (New rejects a configuration that exceeds a limit, and
// they count toward it); an event that would create a pool or a backend
// beyond a limit is not counted, and ObserveRefusing reports it.
type Limits struct {
	// MaxPools bounds the pools, configured ones included. If zero, 1,000
	// is used.
	MaxPools int
	// MaxBackendsPerPool bounds the backends of one pool, configured ones
	// included. If zero, 1,000 is used.
	MaxBackendsPerPool int
	// MaxBackends bounds the backends of all pools together. If zero,
	// 20,000 is used.
	MaxBackends int
}

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxPools == 0 {
		l.MaxPools = DefaultMaxPools
	}
	if l.MaxBackendsPerPool == 0 {
		l.MaxBackendsPerPool = DefaultMaxBackendsPerPool
	}
	if l.MaxBackends == 0 {
		l.MaxBackends = DefaultMaxBackends
	}
	return l
}

// validate checks limits whose defaults are applied against the configured
// pools: a configuration the limits cannot hold is an error naming the
// limit's key ("limits.max_pools").
func (l Limits) validate(pools []PoolConfig) error {
	for _, c := range []struct {
		key string
		v   int
	}{{"max_pools", l.MaxPools}, {"max_backends_per_pool", l.MaxBackendsPerPool}, {"max_backends", l.MaxBackends}} {
		if c.v < 0 {
			return configErr("limits."+c.key, fmt.Sprint(c.v), "must be > 0 (0 means the default)")
		}
	}
	if len(pools) > l.MaxPools {
		return configErr("limits.max_pools", fmt.Sprint(l.MaxPools), fmt.Sprintf("must be >= the %d configured pools", len(pools)))
	}
	total := 0
	for i, p := range pools {
		total += len(p.Backends)
		if len(p.Backends) > l.MaxBackendsPerPool {
			return configErr("limits.max_backends_per_pool", fmt.Sprint(l.MaxBackendsPerPool),
				fmt.Sprintf("must be >= the %d backends configured in pools[%d] (%s)", len(p.Backends), i, p.ID))
		}
	}
	if total > l.MaxBackends {
		return configErr("limits.max_backends", fmt.Sprint(l.MaxBackends), fmt.Sprintf("must be >= the %d configured backends", total))
	}
	return nil
}

// ObserveRefusing is Observe that also appends to refused every event it did
// not count because of Limits (with fleetwatch.ReasonTooManyPools or
// fleetwatch.ReasonTooManyBackends), and returns the grown slice: a caller that
// passes the previous call's slice back (truncated to zero length) observes
// without allocating. The collector uses it to reject those events with a
// reason, counted and described on fw.rejects.
func (a *Analyzer) ObserveRefusing(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (urgent bool, _ []fleetwatch.Refusal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.observe(batch, refused)
}

// Tracked returns the number of pools and backends the analyzer holds.
func (a *Analyzer) Tracked() (pools, backends int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pools), a.backendCount
}

// RefusedCounts are the events Observe did not count because of Limits,
// since New.
type RefusedCounts struct {
	Pools    uint64 // refused with fleetwatch.ReasonTooManyPools
	Backends uint64 // refused with fleetwatch.ReasonTooManyBackends
}

// Refused returns the events refused because of Limits since New.
func (a *Analyzer) Refused() RefusedCounts {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}

// retire remembers the last seq of a pool that is dropped, so that the pool
// continues its seq if it comes back within the epoch. The memory is bounded
// by MaxPools entries: beyond that an arbitrary entry is forgotten and its
// seq raises retiredFloor, the seq every pool not remembered starts from, so
// a returning pool's seq still never goes backwards.
func (a *Analyzer) retire(id string, seq uint64) {
	if len(a.retiredSeq) >= a.limits.MaxPools {
		for old, s := range a.retiredSeq {
			a.retiredFloor = max(a.retiredFloor, s)
			delete(a.retiredSeq, old)
			break
		}
	}
	a.retiredSeq[id] = seq
}

// startSeq is the seq a pool created now starts from.
func (a *Analyzer) startSeq(id string) uint64 {
	seq, ok := a.retiredSeq[id]
	if !ok {
		return a.retiredFloor
	}
	delete(a.retiredSeq, id)
	return max(seq, a.retiredFloor)
}
