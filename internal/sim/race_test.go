//go:build race

package sim

import (
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// raceEnabled: the race detector slows the simulator about 40x; the long
// claim tests skip under it and run in a plain test binary that
// TestLongSimulationsWithoutTheRaceDetector starts.
const raceEnabled = true

// TestLongSimulationsWithoutTheRaceDetector runs this package's long
// tests in a test binary built without the race detector, so that `go test
// -race ./...` still checks every claim the long simulations assert.
func TestLongSimulationsWithoutTheRaceDetector(t *testing.T) {
	t.Parallel()
	testkit.RunWithoutRace(t, "long")
}
