//go:build race

package toylm

// nullCycles is how many unchanged cycles the null tests run: the race
// detector slows the toy model's arithmetic (single-goroutine code it has
// nothing to check in) about tenfold, so the README's race suite runs a
// quarter of them; a plain `go test` and `fleetwatch drift sim` run more.
const nullCycles = 25

// raceFewer is one fewer trial (or null backend) under the race detector,
// at least one.
func raceFewer(n int) int { return max(1, n-1) }

// calibrationTargets are the KL targets whose calibration the tests check:
// under the race detector the q4-like one only (the search is the same for
// all three).
var calibrationTargets = []float64{KLQ4}
