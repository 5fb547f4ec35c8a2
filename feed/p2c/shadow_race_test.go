//go:build race

package p2c

// raceEnabled: sync.Pool drops items at random under the race detector, so
// the shadow path may allocate there.
const raceEnabled = true
