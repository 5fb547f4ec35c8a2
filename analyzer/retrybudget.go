package analyzer

import (
	"math"

	"github.com/fleetwatch/fleetwatch"
)

// The retry budget a snapshot carries (fleetwatch.RetryBudget, PROTOCOL.md
// "Retry budget (extension)") is computed here, the policy beside the
// analyzer that publishes it; the root package keeps the wire type.

// Defaults of RetryBudgetSettings.
const (
	// DefaultRetryBudgetRatio is the share of first attempts the fleet may
	// retry when the pool has no spare capacity (the per-router budget's
	// ratio, feed/p2c).
	DefaultRetryBudgetRatio = 0.2
	// DefaultRetryBudgetFloor is the fleet-wide floor, in retries per
	// second: one router's floor for the whole fleet.
	DefaultRetryBudgetFloor = 3.0
	// DefaultRetryBudgetSpare is the idle share of the pool's capacity from
	// which retries are free (docs/EVALUATION.md, "Retry budgets").
	DefaultRetryBudgetSpare = 0.5
)

// RetryBudgetSettings configure ComputeRetryBudget. The zero value works.
type RetryBudgetSettings struct {
	// Ratio is the share of first attempts the fleet may retry while the
	// pool has no spare capacity. If zero, 0.2 is used.
	Ratio float64
	// FloorPerSec is the retries a second the whole fleet may make
	// whatever the traffic. If zero, 3 is used.
	FloorPerSec float64
	// SpareFree is the idle share of the pool's capacity from which
	// retries are free. If zero, 0.5 is used; a value above 1 never frees
	// them.
	SpareFree float64
}

// ComputeRetryBudget returns the retry budget to publish for a pool, a pure
// function of its backends' decisions (their State and published Load), the
// backends' capacities and the pool's attempt rate.
//
// capacity returns how many requests a backend runs at once (its batch
// slots); 0 (or a nil capacity) means unknown, and the backend's
// kv_cache_usage stands for its utilisation instead (1 when requests wait).
// A backend with no load, or with neither capacity nor kv_cache_usage, is
// left out of Spare. An open backend counts with its last reported load:
// a breaker says how a backend answers, not how loaded the pool is (in a
// pool-wide failure such as docs/EVALUATION.md's retry-storm the analyzer
// opens backends that still have their capacity, and leaving them out made
// the budget refuse 9% of requests' retries that would have succeeded),
// and a publisher drops a load it has no recent report of (PROTOCOL.md,
// "Backend load (extension)").
//
// attemptsPerSec is the rate of attempts the pool received (first attempts
// and retries alike: outcome events do not tell them apart), for example
// the events of the analyzer's window divided by its length. Because it
// includes the retries, PerSec is Ratio / (1 + Ratio) of it plus the floor:
// a fleet that retries exactly that much retries Ratio of its first
// attempts.
func ComputeRetryBudget(backends []fleetwatch.Backend, capacity func(backend string) float64, attemptsPerSec float64, s RetryBudgetSettings) *fleetwatch.RetryBudget {
	ratio, floor, threshold := s.Ratio, s.FloorPerSec, s.SpareFree
	if ratio == 0 {
		ratio = DefaultRetryBudgetRatio
	}
	if floor == 0 {
		floor = DefaultRetryBudgetFloor
	}
	if threshold == 0 {
		threshold = DefaultRetryBudgetSpare
	}
	if !(attemptsPerSec > 0) || math.IsInf(attemptsPerSec, 0) {
		attemptsPerSec = 0
	}
	b := &fleetwatch.RetryBudget{PerSec: max(0, ratio/(1+ratio)*attemptsPerSec+floor)}
	idle, counted := 0.0, 0
	for i := range backends {
		be := &backends[i]
		l := be.Load
		if l == nil {
			continue
		}
		var used float64
		c := 0.0
		if capacity != nil {
			c = capacity(be.Backend)
		}
		switch {
		case c > 0 && !math.IsInf(c, 0):
			used = l.Total() / c
		case l.KVCacheUsage != nil:
			used = *l.KVCacheUsage
			if l.Waiting > 0 {
				used = max(used, 1)
			}
		default:
			continue
		}
		if math.IsNaN(used) || math.IsInf(used, 0) {
			continue
		}
		idle += 1 - used
		counted++
	}
	if counted > 0 {
		spare := idle / float64(counted)
		b.Spare = &spare
		b.Free = spare >= threshold
	}
	return b
}
