//go:build race

package serve

// The race detector slows the whole process (collector, analyzer and the
// embedded NATS server alike) five to twenty times: TestFloodOfInventedIDs
// then sends its sustained flood at a rate the instrumented collector can
// keep up with on a small machine, and allows one more heartbeat.
const (
	floodRatePerSecond  = 10000
	floodHeartbeatSlack = 3
)
