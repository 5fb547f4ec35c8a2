package analyzer

import (
	"time"
	"unsafe"

	"github.com/fleetwatch/fleetwatch"
)

// This file keeps each backend's most recent load report and counts the
// routers of each pool (docs/DECISIONS.md "Backend load").
//
// A report comes from an outcome event that carries load fields (a router
// copied them from the backend's ORCA header; source "event") or from
// ObserveLoad (serve read the backend's Prometheus metrics; source
// "metrics"). The newest report wins whatever its source: each field keeps
// the time of the newest report that carried it, so a report that lacks a
// field (vLLM's ORCA header has no running count) leaves the value an
// earlier report gave, which is published only while it is itself within
// LoadMaxAge. The snapshot's load is nil once every field is older than
// LoadMaxAge: a picker must not rank by a queue that emptied seconds ago.

// MaxRouters is the most routers Snapshot.Routers counts per pool: beyond
// it the count saturates. A fleet of 1,000 routers is counted exactly (128,
// before 2026-12-06, undercounted it eightfold, and the picker's fleet-load
// term with it).
const MaxRouters = 4096

// LoadReport is one load report for ObserveLoad. A field whose Has flag is
// false was not reported; the one reported earlier is kept while fresh.
type LoadReport struct {
	Running    float64 // requests the backend is running, >= 0
	HasRunning bool
	Waiting    float64 // requests waiting in its queue, >= 0
	HasWaiting bool
	// KVCacheUsage is the fraction of the KV cache in use, in [0, 1].
	KVCacheUsage float64
	HasKVCache   bool
}

// loadSource indexes the Load* source names.
type loadSource uint8

const (
	sourceEvent loadSource = iota
	sourceMetrics
)

var loadSourceNames = [...]string{sourceEvent: fleetwatch.LoadSourceEvent, sourceMetrics: fleetwatch.LoadSourceMetrics}

// loadState is a backend's latest load report, field by field. Times are
// Unix nanoseconds (0: never reported), which keeps the state small and
// the hot path free of time.Time arithmetic.
type loadState struct {
	running, waiting, kv       float64
	runningAt, waitingAt, kvAt int64
	at                         int64      // the newest report's time
	source                     loadSource // the newest report's source
}

// update records the fields a report carries, each only when the report is
// at least as new as the value held (reports may arrive out of order).
func (l *loadState) update(at int64, src loadSource, running float64, hasRunning bool,
	waiting float64, hasWaiting bool, kv float64, hasKV bool) {
	if !hasRunning && !hasWaiting && !hasKV {
		return
	}
	if hasRunning && at >= l.runningAt {
		l.running, l.runningAt = running, at
	}
	if hasWaiting && at >= l.waitingAt {
		l.waiting, l.waitingAt = waiting, at
	}
	if hasKV && at >= l.kvAt {
		l.kv, l.kvAt = kv, at
	}
	if at >= l.at {
		l.at, l.source = at, src
	}
}

// observeEventLoad records the load fields of an event counted at tsNs
// (Unix nanoseconds). It
// runs on the hot path: no allocation, a few stores.
func (b *backend) observeEventLoad(ev *fleetwatch.Event, tsNs int64) {
	kv := ev.KVCacheUsage
	hasKV := ev.KVCacheKnown() && kv >= 0 && kv <= 1 // NaN fails both
	b.load.update(tsNs, sourceEvent,
		float64(ev.Running), ev.RunningKnown() && ev.Running >= 0,
		float64(ev.Waiting), ev.WaitingKnown() && ev.Waiting >= 0,
		kv, hasKV)
}

// publish returns the snapshot's load at now, or false when no field is
// fresher than maxAge. AgeMs is the age of the newest report.
func (l *loadState) publish(now time.Time, maxAge time.Duration) (fleetwatch.Load, float64, bool, bool) {
	if l.at == 0 {
		return fleetwatch.Load{}, 0, false, false
	}
	nowNs := now.UnixNano()
	fresh := func(at int64) bool { return at != 0 && nowNs-at <= int64(maxAge) }
	if !fresh(l.at) {
		return fleetwatch.Load{}, 0, false, false // every field is at most as new
	}
	var out fleetwatch.Load
	if fresh(l.runningAt) {
		out.Running = l.running
	}
	if fresh(l.waitingAt) {
		out.Waiting = l.waiting
	}
	out.AgeMs = max(0, (nowNs-l.at)/int64(time.Millisecond))
	out.Source = loadSourceNames[l.source]
	return out, l.kv, fresh(l.kvAt), true
}

// ObserveLoad records a load report of a backend read at at (from its
// metrics, published with source "metrics"). A pool or backend the
// analyzer does not know is ignored (the scraper reads configured
// backends, which exist from New), and so are out-of-range values; it
// reports whether the report was recorded.
func (a *Analyzer) ObserveLoad(poolID, backendID string, r LoadReport, at time.Time) bool {
	valid := func(v float64) bool { return v >= 0 && v <= 1e12 } // NaN fails
	hasRunning := r.HasRunning && valid(r.Running)
	hasWaiting := r.HasWaiting && valid(r.Waiting)
	hasKV := r.HasKVCache && r.KVCacheUsage >= 0 && r.KVCacheUsage <= 1
	if at.IsZero() || (!hasRunning && !hasWaiting && !hasKV) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil {
		return false
	}
	b := p.backends[backendID]
	if b == nil {
		return false
	}
	b.load.update(at.UnixNano(), sourceMetrics, r.Running, hasRunning, r.Waiting, hasWaiting, r.KVCacheUsage, hasKV)
	return true
}

// routerSet counts the distinct event sources of a pool over its window:
// (source, last seen) slots, grown as sources appear, up to MaxRouters.
// Sources are interned by the decoder, so the address of a source's bytes
// identifies it: a batch comes from one router, so the previous event's
// slot is checked first, then a small direct-mapped index from that
// address to a slot; a miss (another string in the index's entry, or a
// source not interned) falls back to a map of the sources.
type routerSet struct {
	sources []string
	seen    []int64                 // Unix nanoseconds of the newest event
	last    int                     // the previous event's slot
	index   [routerIndexSize]uint16 // slot+1 by address hash; 0: none
	slots   map[string]int          // every source's slot
}

const routerIndexSize = 1024 // a power of two

// routerIndex hashes the address of s's bytes (MurmurHash3's 64-bit
// finalizer: allocations sit at small strides, which a plain
// multiplicative hash maps to few entries).
func routerIndex(s string) int {
	p := uint64(uintptr(unsafe.Pointer(unsafe.StringData(s))))
	p ^= p >> 33
	p *= 0xff51afd7ed558ccd
	p ^= p >> 33
	return int(p & (routerIndexSize - 1))
}

// observe records an event of source at ts (Unix nanoseconds). A new
// source takes a new slot, or, at MaxRouters, the slot of the source seen
// longest ago when that is older than window; when every slot was seen
// within the window it is not counted (the count saturates).
func (r *routerSet) observe(source string, ts, window int64) {
	if source == "" {
		return // an anonymous publisher is no router we can count
	}
	if r.last < len(r.sources) {
		if last := r.sources[r.last]; len(last) == len(source) && unsafe.StringData(last) == unsafe.StringData(source) {
			if ts > r.seen[r.last] {
				r.seen[r.last] = ts
			}
			return
		}
	}
	h := routerIndex(source)
	slot := int(r.index[h]) - 1
	if slot < 0 || r.sources[slot] != source {
		var ok bool
		slot, ok = r.slots[source]
		switch {
		case ok:
		case len(r.sources) < MaxRouters:
			if r.slots == nil {
				r.slots = map[string]int{}
			}
			slot = len(r.sources)
			r.sources, r.seen = append(r.sources, source), append(r.seen, ts)
			r.slots[source] = slot
		default:
			slot = r.oldest()
			if ts-r.seen[slot] <= window {
				return
			}
			delete(r.slots, r.sources[slot])
			r.sources[slot], r.seen[slot] = source, ts
			r.slots[source] = slot
		}
		r.index[h] = uint16(slot + 1)
	}
	r.last = slot
	if ts > r.seen[slot] {
		r.seen[slot] = ts
	}
}

// oldest returns the slot seen longest ago.
func (r *routerSet) oldest() int {
	oldest := 0
	for i := 1; i < len(r.sources); i++ {
		if r.seen[i] < r.seen[oldest] {
			oldest = i
		}
	}
	return oldest
}

// count returns the sources seen within window of now.
func (r *routerSet) count(now, window int64) int {
	n := 0
	for i := range r.seen {
		if now-r.seen[i] <= window {
			n++
		}
	}
	return n
}

// retryBudget is the pool's fleet-wide retry budget (PROTOCOL.md "Retry
// budget (extension)"), from the backends' published load and the
// window's attempt rate; nil while no backend's load tells how busy the
// pool is. Without load the routers keep their own budgets: a fleet-wide
// budget that can never be free was not what the simulator measured
// (docs/EVALUATION.md "Retry budgets").
func retryBudget(backends []fleetwatch.Backend, window time.Duration) *fleetwatch.RetryBudget {
	var requests int64
	for i := range backends {
		requests += backends[i].Requests
	}
	b := ComputeRetryBudget(backends, nil, float64(requests)/window.Seconds(), RetryBudgetSettings{})
	if b.Spare == nil {
		return nil
	}
	return b
}
