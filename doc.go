// Package fleetwatch holds the shared vocabulary of the fleetwatch wire
// protocol (docs/PROTOCOL.md): outcome events published by proxies, decision
// snapshots consumed by routers, drift alerts and review digests, reject
// notices, and the NATS subject and JetStream names they travel on.
//
// The package depends on the standard library only, so that a router or proxy
// written in Go can import it without pulling in NATS or anything else. The
// outcome-event decoder is a hand-written, zero-allocation scanner (see
// decode.go): it is on the hot path of the collector, and no library that the
// standard library provides meets the protocol's budget of 500 ns and one
// allocation per event.
package fleetwatch
