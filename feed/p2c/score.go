package p2c

import "math"

// Score ranks one candidate backend; lower is better. inFlight is the
// router's own count of requests in flight to the backend, ewmaMs its EWMA
// of time to first token (the pool median when it has none; always > 0),
// costPerMTok its configured price (0 when unset) and costWeightPerMs the
// exchange rate between money and milliseconds (+Inf ignores cost).
//
// Every score below belongs to one family,
//
//	(inFlight+1) * ewma^g + cost/costWeightPerMs * ewma^(g-1)
//
// which is the seed's score divided by ewma^(1-g): g = 1 is the seed, g = 0
// ranks by in-flight count alone (least connections) with cost converted to
// queue slots at the backend's own service time. The family keeps the cost
// term's exchange rate meaning the same thing in every member.
type Score func(inFlight int, ewmaMs, costPerMTok, costWeightPerMs float64) float64

// SeedScore is the seed article's score, the predicted wait in ms:
// (inFlight+1) * ewma + cost/costWeightPerMs. Because TTFT already contains
// the queue wait, it counts the queue twice (once in inFlight, once in the
// EWMA); the simulator shows what that costs.
var SeedScore Score = func(inFlight int, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	return float64(inFlight+1)*ewmaMs + costPerMTok/costWeightPerMs
}

// InFlightScore ranks by the router's own in-flight count (least
// connections within the two choices), with the cost term converted to queue
// slots: (inFlight+1) + cost/costWeightPerMs/ewma.
var InFlightScore Score = func(inFlight int, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	return float64(inFlight+1) + costPerMTok/costWeightPerMs/ewmaMs
}

// SqrtScore is halfway between the two: (inFlight+1) * sqrt(ewma) +
// cost/costWeightPerMs/sqrt(ewma). Latency still breaks ties and separates a
// much slower backend, but a 4x slower backend weighs as 2 queued requests,
// not 4.
var SqrtScore Score = func(inFlight int, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	r := math.Sqrt(ewmaMs)
	return float64(inFlight+1)*r + costPerMTok/costWeightPerMs/r
}

// PowerScore returns the member of the family with exponent g (see Score).
// It calls math.Pow per candidate; prefer the named scores for g = 0, 0.5, 1.
func PowerScore(g float64) Score {
	return func(inFlight int, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
		r := math.Pow(ewmaMs, g)
		return float64(inFlight+1)*r + costPerMTok/costWeightPerMs*r/ewmaMs
	}
}

// DefaultScore is the score a Picker uses when Settings.Score is nil. The
// simulator chose it (docs/EVALUATION.md, "Choosing the default score"): it
// had the lowest p99 of the family in every steady-state scenario; the
// latency term pays only for outliers, which the slow-outlier guard covers.
var DefaultScore = InFlightScore
