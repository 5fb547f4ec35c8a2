package fleetwatch

import (
	"fmt"
	"math"
)

// RetryBudget is a pool's fleet-wide retry budget as a snapshot carries it
// (an extension of the protocol; PROTOCOL.md "Retry budget (extension)").
//
// A router that follows it retries freely while Free is set, because then
// the pool has capacity to spare and a retry is cheap; otherwise it may make
// PerSec / R retries per second, where R is the snapshot's Routers (at least
// 1), so that the whole fleet makes about PerSec. One budget for the fleet
// replaces a budget per router, whose floor grows with the number of
// routers and which refuses retries that would succeed.
type RetryBudget struct {
	// Free is true when the pool has spare capacity (Spare at or above the
	// publisher's threshold): retries are not budgeted.
	Free bool `json:"free"`
	// Spare is the share of the pool's capacity that was idle, the mean
	// over the backends with a published load of 1 - load / capacity
	// (negative when requests wait); nil when no backend's load and
	// capacity are known, in which case Free is false.
	Spare *float64 `json:"spare,omitempty"`
	// PerSec is how many retries a second the whole fleet may make while
	// Free is false, >= 0.
	PerSec float64 `json:"per_sec"`
}

func (b *RetryBudget) validate() error {
	switch {
	case b == nil:
		return nil
	case !inRange(b.PerSec, 0, math.MaxFloat64):
		return invalid("retry_budget.per_sec", b.PerSec, ErrOutOfRange, nonNegative)
	case b.Spare != nil && !inRange(*b.Spare, -math.MaxFloat64, 1):
		return invalid("retry_budget.spare", *b.Spare, ErrOutOfRange, fmt.Sprintf(" (want at most 1, got %v)", *b.Spare))
	}
	return nil
}
