package sim

import (
	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// The first-token deadline of feed/route (route.Settings.StallFloor,
// StallMultiple) for the policies that follow the feed: an attempt with no
// first token after max(floor, multiple x the pool's p95 TTFT in the latest
// snapshot, route.PoolP95TTFT) ends as stalled (status 0), a failure for the analyzer and the
// picker, and the request is retried like any failed attempt. Without it a
// stalled backend is noticed only at the client's timeout (30 s).

// stallDeadlineMs is the deadline for an attempt sent now, in ms, or 0 when
// the policy follows no feed or the scenario turns the deadline off.
func (s *sim) stallDeadlineMs() float64 {
	if s.an == nil || s.sc.StallFloor < 0 {
		return 0
	}
	floor := ms(route.DefaultStallFloor)
	if s.sc.StallFloor > 0 {
		floor = ms(s.sc.StallFloor)
	}
	mult := route.DefaultStallMultiple
	if s.sc.StallMultiple > 0 {
		mult = s.sc.StallMultiple
	}
	return max(floor, mult*s.stallP95)
}

// stallAttempt ends an attempt at its first-token deadline.
func (s *sim) stallAttempt(att *attempt) { s.endAttempt(att, 0, fleetwatch.OutcomeStalled) }

// poolP95 is the pool's p95 TTFT in snap as feed/route reads it (0 for
// none).
func poolP95(snap *fleetwatch.Snapshot) float64 {
	v, _ := route.PoolP95TTFT(snap)
	return v
}
