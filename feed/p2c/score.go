package p2c

import (
	"fmt"
	"math"
)

// Score ranks one candidate backend; lower is better. Rank receives the
// candidate's load in requests, its EWMA of time to first token in ms (the
// pool median when it has none; always > 0), its configured price (0 when
// unset) and the exchange rate between money and milliseconds (+Inf ignores
// cost). Load is the router's own in-flight count to the backend, unless
// FleetLoad is set (see LoadScore).
//
// Every score below belongs to one family,
//
//	(load+1) * ewma^g + cost/costWeightPerMs * ewma^(g-1)
//
// which is the seed's score divided by ewma^(1-g): g = 1 is the seed, g = 0
// ranks by load alone (least connections) with cost converted to queue
// slots at the backend's own service time. The family keeps the cost term's
// exchange rate meaning the same thing in every member.
//
// The zero Score is "unset": Settings.Score then takes DefaultScore.
type Score struct {
	// Name names the score in reports and in the configuration.
	Name string
	// Rank computes the score.
	Rank func(load, ewmaMs, costPerMTok, costWeightPerMs float64) float64
	// FleetLoad makes load the backend's fleet-wide load estimate: the
	// load the snapshot published for it plus R x (the router's in-flight
	// count now - its count when it applied that snapshot), R being the
	// snapshot's routers (at least 1). Every other router is assumed to
	// have added as much as this one since. A backend whose snapshot has
	// no load, or whose load is older than Settings.LoadStale, is counted
	// as R x the router's own in-flight count, and with a stale snapshot
	// every backend is. In between, the published estimate's share decays
	// as exp(-age / Settings.LoadStale), the rest taken from R x the
	// router's own count. A snapshot that counts one router (R = 1) gives
	// no load from outcome events (source "event"): they echo this
	// router's own traffic, which its own count has exactly and sooner;
	// a load serve scraped (source "metrics") is kept.
	FleetLoad bool
	// Weighted divides the score by the backend's weight (in (0, 1]), so
	// that a down-weighted backend must be that much emptier to win.
	Weighted bool
}

// seedRank, inFlightRank and sqrtRank are the family's members g = 1, 0, 1/2.
func seedRank(load, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	return (load+1)*ewmaMs + costPerMTok/costWeightPerMs
}

func inFlightRank(load, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	return (load + 1) + costPerMTok/costWeightPerMs/ewmaMs
}

func sqrtRank(load, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
	r := math.Sqrt(ewmaMs)
	return (load+1)*r + costPerMTok/costWeightPerMs/r
}

// SeedScore is the seed article's score, the predicted wait in ms:
// (inFlight+1) * ewma + cost/costWeightPerMs. Because TTFT already contains
// the queue wait, it counts the queue twice (once in inFlight, once in the
// EWMA); the simulator shows what that costs.
var SeedScore = Score{Name: "seed", Rank: seedRank}

// InFlightScore ranks by the router's own in-flight count (least
// connections within the choices), with the cost term converted to queue
// slots: (inFlight+1) + cost/costWeightPerMs/ewma.
var InFlightScore = Score{Name: "inflight", Rank: inFlightRank}

// SqrtScore is halfway between the two: (inFlight+1) * sqrt(ewma) +
// cost/costWeightPerMs/sqrt(ewma). Latency still breaks ties and separates a
// much slower backend, but a 4x slower backend weighs as 2 queued requests,
// not 4.
var SqrtScore = Score{Name: "sqrt", Rank: sqrtRank}

// LoadScore is InFlightScore over the fleet-wide load estimate (see
// Score.FleetLoad): (load+1) + cost/costWeightPerMs/ewma, where load is the
// backend's published load (requests running + waiting, fleet-wide) plus R
// x this router's in-flight change since the snapshot, blended with R x
// its own count as the report ages (Settings.LoadStale). Routers that share
// a pool thus rank by what the whole fleet sends, not by the 1/R of it each
// sees. Without published loads (an analyzer that does not fill them, or a
// stale snapshot) it ranks as InFlightScore does.
//
// It does not divide by the weight (Score.Weighted): a backend answering
// 429 at once holds no requests and looks empty, but the weighted variant,
// which measured fewer errors in the 429, stall and fast-failure
// scenarios, also starves a half-open backend of the trickle its breaker
// needs to close; the analyzer's quicker 429 trip covers that case
// (docs/EVALUATION.md, "The load score").
var LoadScore = Score{Name: "load", Rank: inFlightRank, FleetLoad: true}

// PowerScore returns the member of the family with exponent g (see Score),
// ranking by the router's own in-flight count. It calls math.Pow per
// candidate; prefer the named scores for g = 0, 0.5, 1.
func PowerScore(g float64) Score {
	return Score{Name: fmt.Sprintf("power-%g", g), Rank: func(load, ewmaMs, costPerMTok, costWeightPerMs float64) float64 {
		r := math.Pow(ewmaMs, g)
		return (load+1)*r + costPerMTok/costWeightPerMs*r/ewmaMs
	}}
}

// Scores are the named scores, by Name: the values of the configuration's
// score key.
var Scores = []Score{LoadScore, InFlightScore, SqrtScore, SeedScore}

// ScoreByName returns the named score; false when there is none.
func ScoreByName(name string) (Score, bool) {
	for _, s := range Scores {
		if s.Name == name {
			return s, true
		}
	}
	return Score{}, false
}

// DefaultScore is the score a Picker uses when Settings.Score is unset. The
// simulator chose it (docs/EVALUATION.md, "Choosing the default score").
var DefaultScore = LoadScore
