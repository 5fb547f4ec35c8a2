//go:build !race

package serve

// See flood_race_test.go.
const (
	floodRatePerSecond  = 50000
	floodHeartbeatSlack = 5
)
