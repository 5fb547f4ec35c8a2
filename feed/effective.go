package feed

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// StaleReason is the reason Effective gives a backend it closed because the
// snapshot was stale.
const StaleReason = "snapshot stale: fail static, equal weight"

// Stale reports whether snap is stale at now: now is after at + ttl_ms,
// a ttl_ms of 0 meaning fleetwatch.DefaultSnapshotTTL (PROTOCOL.md
// "Decision snapshot"; Snapshot.Stale, the rule the picker follows too). A
// nil snapshot is stale.
func Stale(snap *fleetwatch.Snapshot, now time.Time) bool { return snap.Stale(now) }

// Effective returns the snapshot a router should apply at now. A fresh
// snapshot is returned as it is. For a stale one it returns a copy in which
// open breakers whose open_until is still in the future stay open (the
// feed's last word on a failing backend is still the best information), and
// every other backend is closed with weight 1: the router spreads traffic
// evenly and relies on its own local signals until the feed is back. That
// is the protocol's "fail static, never fail closed": a stale feed never
// leaves a pool with nothing to send to. The other fields (EWMA, rates,
// priority, cost) are kept as last known. snap is never modified.
func Effective(snap *fleetwatch.Snapshot, now time.Time) *fleetwatch.Snapshot {
	if snap == nil || !Stale(snap, now) {
		return snap
	}
	eff := *snap
	eff.Backends = make([]fleetwatch.Backend, len(snap.Backends))
	for i, b := range snap.Backends {
		if b.State == fleetwatch.StateOpen && b.OpenUntil != nil && b.OpenUntil.After(now) {
			eff.Backends[i] = b
			continue
		}
		if b.State != fleetwatch.StateClosed || b.Weight != 1 {
			b.Reason = StaleReason
		}
		b.State = fleetwatch.StateClosed
		b.Weight = 1
		b.OpenUntil = nil
		eff.Backends[i] = b
	}
	return &eff
}
