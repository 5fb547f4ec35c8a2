// Package feed carries fleetwatch's decisions from the analyzer to routers.
//
// On the fleetwatch side, Publisher sends each pool's decision snapshot as
// JSON on fw.decisions.<pool> and keeps the last one per pool in the
// JetStream KV bucket fw_decisions (PROTOCOL.md "Decision snapshot").
//
// On the router side, Watcher follows one, several or all pools: it reads
// the KV at start and after every reconnect (so a router that starts late or
// lost its connection has the current state at once), checks each snapshot
// (fleetwatch.Snapshot.Validate), applies it when it is newer than the one
// it has (fleetwatch.Snapshot.NewerThan) and drops older and malformed ones,
// and publishes the latest snapshot of each pool through an atomic pointer
// to an immutable view, so that the request path reads it without locks.
// Staleness follows the protocol: a snapshot is stale after at + ttl_ms, and
// Effective turns a stale snapshot into what a router should apply: breakers
// whose open_until is still in the future stay open, every other backend is
// closed with weight 1 (fail static, never fail closed). The picker itself
// lives in feed/p2c.
package feed
