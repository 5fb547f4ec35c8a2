package analyzer

import (
	"math"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The parts of a closed backend's weight, shared by setWeights (the
// decision) and by Explain and the snapshot's reasons (its explanation), so
// that what is explained is what is computed.

// weightPrior is the pool prior of the shrinkage: the mean observed weight
// of the closed backends not held by the cap with at least MinRequests
// counted requests, 1 when there is none.
func weightPrior(s *Settings, bs []*backend) float64 {
	prior, n := 0.0, 0
	for _, b := range bs {
		if b.state == fleetwatch.StateClosed && b.holdReason == "" && b.view.counted >= uint64(s.MinRequests) {
			prior += observedWeight(s, &b.view)
			n++
		}
	}
	if n == 0 {
		return 1
	}
	return prior / float64(n)
}

// shrinkK is the shrinkage's pseudo-count: max(1, MinRequests/4).
func shrinkK(s *Settings) int { return max(1, s.MinRequests/4) }

// shrunkWeight is a closed backend's target weight: its observed weight
// shrunk toward prior as (n*w_obs + k*prior)/(n + k), n its counted
// requests, floored at HalfOpenWeight.
func shrunkWeight(s *Settings, v *windowStats, prior float64) float64 {
	n, k := float64(v.counted), float64(shrinkK(s))
	target := (n*observedWeight(s, v) + k*prior) / (n + k)
	return max(target, s.HalfOpenWeight)
}

// dampedWeight moves current toward target by MaxWeightStep per Heartbeat
// of time elapsed since the weight last moved: at the pool's beats
// (heartbeats and 250 ms load beats), however they fall, the steps add up
// to MaxWeightStep a Heartbeat. (A whole step per beat moved weights four
// times faster at the 250 ms beat many routers had; a step rounded to
// whole beats, with a heartbeat a tenth early just after a load beat, a
// quarter faster.)
func dampedWeight(s *Settings, current, target float64, movedAt, now time.Time) float64 {
	step := s.MaxWeightStep * float64(now.Sub(movedAt)) / float64(s.Heartbeat)
	return min(max(target, current-step), current+step)
}

// roundWeight clips a weight to [0, 1] and rounds it to 4 decimals.
func roundWeight(w float64) float64 { return math.Round(min(max(w, 0), 1)*1e4) / 1e4 }
