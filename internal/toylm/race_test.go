//go:build race

package toylm

import (
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// raceDetector: this test binary runs under the race detector. The
// statistical tests (statistical) skip here and run in a plain test binary
// of this package that TestStatisticsWithoutTheRaceDetector starts: they
// are single-goroutine arithmetic, which the race detector slows about
// tenfold with nothing to find in it (the whole package took 257 s under
// it with a quarter of the null cycles, and takes 34 s without it at full
// counts). The tests with goroutines (Null's workers, the artefact cache,
// the HTTP server) run here, under the race detector.
const raceDetector = true

// TestStatisticsWithoutTheRaceDetector runs this package's statistical
// tests in a test binary built without the race detector, so that `go test
// -race ./...` still runs every one of them, at full counts.
func TestStatisticsWithoutTheRaceDetector(t *testing.T) {
	t.Parallel()
	testkit.RunWithoutRace(t, "statistical")
}
