//go:build race

package serve

// The race detector slows the whole process (collector, analyzer and the
// embedded NATS server alike) five to twenty times: TestFloodOfInventedIDs
// then sends its sustained flood at a rate the instrumented collector can
// keep up with on a small machine, and allows more heartbeats: the bound is
// there to catch starvation (the legitimate pool once went about 60 s without
// a snapshot in such a flood), not to time a shared, busy machine.
const (
	floodRatePerSecond  = 10000
	floodHeartbeatSlack = 10
)
