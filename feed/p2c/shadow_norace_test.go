//go:build !race

package p2c

const raceEnabled = false
