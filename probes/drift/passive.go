package drift

import (
	"sort"
	"sync"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// Kinds of FingerprintEvent.
const (
	// FingerprintChanged: the backend's system_fingerprint in traffic is
	// not the one it had.
	FingerprintChanged = "changed"
	// FingerprintDisagrees: the backend's fingerprint differs from the one
	// a majority (at least two) of its pool's other backends report.
	FingerprintDisagrees = "disagrees"
)

// FingerprintEvent is a metadata event from traffic: never a verdict by
// itself (it is counted, logged, shown in the status and runs a probe
// cycle at once), but evidence that, with the probe's own fingerprint
// differing from the baseline's, makes the backend suspect.
type FingerprintEvent struct {
	Pool    string    `json:"pool"`
	Backend string    `json:"backend"`
	Kind    string    `json:"kind"`   // FingerprintChanged or FingerprintDisagrees
	Before  string    `json:"before"` // changed: the previous fingerprint; disagrees: the pool's majority
	After   string    `json:"after"`  // the backend's fingerprint now
	At      time.Time `json:"at"`     // the event time of the outcome that showed it
	// Changes counts the fingerprint changes of the backend seen so far
	// (events are rate-limited, changes are not).
	Changes int `json:"changes"`
}

// FingerprintSettings configure a Fingerprints tracker. The zero value
// works.
type FingerprintSettings struct {
	// MinInterval is the least time between two events of one backend
	// (by event time): a backend flapping between two fingerprints (two
	// artefacts behind one address) gives one event per interval, not one
	// per request; every change is still counted. If zero, 1m; negative:
	// none.
	MinInterval time.Duration
}

// fpBackend is one backend's fingerprint state.
type fpBackend struct {
	pool, backend string
	fp            string
	changes       int
	lastEvent     time.Time // event time of the last event returned
	disagreeing   bool
}

// Fingerprints follows the system_fingerprint of outcome events per
// backend: a backend whose fingerprint changes, or disagrees with its
// pool's majority, gives a FingerprintEvent. It is pure (no I/O, no
// clock: times are the events'), safe for concurrent use, and cheap on
// the hot path: one lock per batch, events without a fingerprint are
// skipped at once, and consecutive events of one backend (batches are per
// pool) reuse its entry; a fingerprint is compared with the last one of
// its backend, which for interned strings is a pointer comparison.
type Fingerprints struct {
	minInterval time.Duration

	mu       sync.Mutex // guards backends, pools
	backends map[backendKey]*fpBackend
	pools    map[string][]*fpBackend
}

// NewFingerprints returns a tracker.
func NewFingerprints(s FingerprintSettings) *Fingerprints {
	if s.MinInterval == 0 {
		s.MinInterval = time.Minute
	}
	return &Fingerprints{minInterval: s.MinInterval, backends: map[backendKey]*fpBackend{}, pools: map[string][]*fpBackend{}}
}

// Observe follows batch and returns the events it gave, in order (nil
// when none: the common case allocates nothing).
func (f *Fingerprints) Observe(batch []fleetwatch.Event) []FingerprintEvent {
	var out []FingerprintEvent
	var last *fpBackend
	var dirty []string // pools with a change, compared once at the end
	var lastTS time.Time
	locked := false
	for i := range batch {
		ev := &batch[i]
		if ev.Fingerprint == "" {
			continue
		}
		if !locked {
			f.mu.Lock()
			locked = true
		}
		b := last
		if b == nil || b.backend != ev.Backend || b.pool != ev.Pool {
			b = f.backends[backendKey{ev.Pool, ev.Backend}]
			if b == nil {
				b = &fpBackend{pool: ev.Pool, backend: ev.Backend}
				f.backends[backendKey{ev.Pool, ev.Backend}] = b
				f.pools[ev.Pool] = append(f.pools[ev.Pool], b)
			}
			last = b
		}
		if b.fp == ev.Fingerprint {
			continue
		}
		before := b.fp
		b.fp = ev.Fingerprint
		if before != "" {
			b.changes++
			if f.due(b, ev.TS) {
				out = append(out, FingerprintEvent{Pool: b.pool, Backend: b.backend, Kind: FingerprintChanged,
					Before: before, After: b.fp, At: ev.TS, Changes: b.changes})
			}
		}
		lastTS = ev.TS
		if len(dirty) == 0 || dirty[len(dirty)-1] != b.pool {
			dirty = append(dirty, b.pool)
		}
	}
	for i, pool := range dirty {
		if i == 0 || !contains(dirty[:i], pool) {
			out = f.comparePool(pool, lastTS, out)
		}
	}
	if locked {
		f.mu.Unlock()
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// due reports whether an event of b at t may be returned, and records it.
func (f *Fingerprints) due(b *fpBackend, t time.Time) bool {
	if f.minInterval > 0 && !b.lastEvent.IsZero() && t.Sub(b.lastEvent) < f.minInterval {
		return false
	}
	b.lastEvent = t
	return true
}

// comparePool finds the pool's majority fingerprint (held by at least two
// backends and more than any other) and appends a disagreement event for
// each backend that newly differs from it. With no majority (two backends
// that differ) nobody is blamed. Called with f.mu held, once per batch
// for a pool where a fingerprint changed.
func (f *Fingerprints) comparePool(pool string, t time.Time, out []FingerprintEvent) []FingerprintEvent {
	members := f.pools[pool]
	counts := map[string]int{}
	for _, b := range members {
		if b.fp != "" {
			counts[b.fp]++
		}
	}
	majority, best, tie := "", 0, false
	for fp, n := range counts {
		switch {
		case n > best:
			majority, best, tie = fp, n, false
		case n == best:
			tie = true
		}
	}
	if best < 2 || tie {
		majority = ""
	}
	for _, b := range members {
		disagrees := majority != "" && b.fp != "" && b.fp != majority
		if disagrees && !b.disagreeing && f.due(b, t) {
			out = append(out, FingerprintEvent{Pool: pool, Backend: b.backend, Kind: FingerprintDisagrees,
				Before: majority, After: b.fp, At: t, Changes: b.changes})
		}
		b.disagreeing = disagrees
	}
	return out
}

// Current returns the fingerprint last seen in the traffic of every
// backend (After) with its count of changes, sorted by pool and backend.
func (f *Fingerprints) Current() []FingerprintEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FingerprintEvent, 0, len(f.backends))
	for _, b := range f.backends {
		out = append(out, FingerprintEvent{Pool: b.pool, Backend: b.backend, After: b.fp, Changes: b.changes})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].Backend < out[j].Backend
	})
	return out
}

// backendKey names one backend of one pool.
type backendKey struct{ pool, backend string }
