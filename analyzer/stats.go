package analyzer

import (
	"maps"

	"github.com/fleetwatch/fleetwatch"
)

// Stats are the analyzer's cumulative counters, for metrics.
type Stats struct {
	Pools    int // pools tracked now
	Backends int // backends tracked now

	// Observed counts the events given to Observe, by outcome (indexed by
	// fleetwatch.Outcome).
	Observed [fleetwatch.NumOutcomes]uint64
	// Trips counts breakers opened, by cause (Cause* constants).
	Trips map[string]uint64
	// HeldByGate counts rate-based trips that min_requests held back, by
	// cause: each time a backend's rule fires with fewer than MinRequests
	// counted requests in its window, after not firing (or not being held)
	// at the previous Evaluate.
	HeldByGate map[string]uint64
	// HeldByCap counts trips that the ejection cap held back (each time a
	// backend becomes held).
	HeldByCap uint64
	// HeldByRecency counts evaluations at which a backend's window showed
	// a failure, 429 or client-error rate past its threshold but the
	// newest quarter of the window did not (the backend has recovered; it
	// is not opened on its history; for client errors, also when the
	// requests sent in the same seconds to its peers were rejected alike).
	HeldByRecency uint64
	// HeldByMedian counts evaluations at which a backend's EWMA TTFT was
	// past slow_factor x the pool median but its window median TTFT was not
	// (a few slow requests, not a slow backend).
	HeldByMedian uint64
	// Expired counts backends dropped after Expiry without events.
	Expired uint64
	// LatencySamplesDiscounted counts ok events with a TTFT that gave no
	// latency sample, by why.
	LatencySamplesDiscounted Discounts
	// DroppedOld counts events older than their backend's window.
	DroppedOld uint64
	// StaleGeneration counts events older than their backend's current
	// breaker generation (dropped: they must not re-trip or close it).
	StaleGeneration uint64
	// DroppedNoTime counts events without a TS observed before the first
	// Evaluate (there is no clock to count them at).
	DroppedNoTime uint64
	// DroppedInvalid counts events whose outcome is not one of the
	// protocol's.
	DroppedInvalid uint64
	// ClampedFuture counts events more than two heartbeats ahead of the
	// latest Evaluate, counted in the newest bucket.
	ClampedFuture uint64
	// Shed counts events refused in front of their backend (the event's
	// shed field): never counted for or against it.
	Shed uint64
}

// Discounts counts latency samples left out of the EWMA and histograms.
type Discounts struct {
	Cold  uint64 // the event said cold: true
	First uint64 // the first event of a backend never seen
	Idle  uint64 // the first event after IdleGap of silence
}

// Total is the sum of the discounts.
func (d Discounts) Total() uint64 { return d.Cold + d.First + d.Idle }

// statsCounters is the mutable form of Stats, guarded by Analyzer.mu.
type statsCounters struct {
	Stats
	observed   [fleetwatch.NumOutcomes]uint64
	trips      map[string]uint64
	heldByGate map[string]uint64
}

func (s *statsCounters) init() {
	s.trips = make(map[string]uint64)
	s.heldByGate = make(map[string]uint64)
}

// Stats returns a copy of the cumulative counters.
func (a *Analyzer) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.stats.Stats
	out.Observed = a.stats.observed
	out.Trips = maps.Clone(a.stats.trips)
	out.HeldByGate = maps.Clone(a.stats.heldByGate)
	out.Pools = len(a.pools)
	for _, p := range a.pools {
		out.Backends += len(p.backends)
	}
	return out
}
