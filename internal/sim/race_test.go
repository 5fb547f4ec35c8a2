//go:build race

package sim

// raceEnabled: the race detector slows the simulator about 40x; the long
// claim tests skip under it (they run in a plain go test).
const raceEnabled = true
