//go:build !race

package toylm

// raceDetector: this test binary runs without the race detector, so the
// statistical tests run here (see race_test.go).
const raceDetector = false
