//go:build !race

package toylm

// nullCycles is how many unchanged cycles the null tests run (see
// race_test.go).
const nullCycles = 100

// raceFewer is n without the race detector (see race_test.go).
func raceFewer(n int) int { return n }

// calibrationTargets are the KL targets whose calibration the tests check.
var calibrationTargets = []float64{KLQ8, KLQ6, KLQ4}
