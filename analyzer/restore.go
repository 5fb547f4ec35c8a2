package analyzer

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Restored counts what Restore carried over.
type Restored struct {
	Open     int // breakers kept open until their open_until
	HalfOpen int // breakers kept half-open (or half-opened: their open time ran out)
	Drift    int // drift statuses restored
	Weights  int // weights restored, to be damped from there
}

// Restore carries decisions across a restart or a takeover: snaps are the
// last snapshots the previous analyzer published (for example from the KV
// bucket), applied after the outcome stream was replayed and before the
// first snapshot is published. A router must never see an open breaker
// close early because the analyzer changed:
//
//   - a backend open with open_until after now stays open until then (or
//     later, when the replay re-tripped it on events after the snapshot),
//     with its reason and trip count; a trip the replay made from events
//     the snapshot had already decided on gives way to the snapshot's;
//   - a backend that was open with open_until passed, or half-open, is
//     half-open: it must prove itself with its own traffic;
//   - the trip count is kept, so the next open time keeps growing;
//   - drift statuses other than unknown are kept until the probes report;
//   - a closed backend's weight starts from the published one and is damped
//     from there;
//   - a backend that carried an operator override restores neither state
//     nor weight (they were the override's), only the rest.
//
// Pools and backends in snaps that the analyzer does not know are created,
// as an event would create them, within the Limits. A snapshot that fails
// Validate is skipped.
func (a *Analyzer) Restore(snaps []fleetwatch.Snapshot, now time.Time) Restored {
	a.mu.Lock()
	defer a.mu.Unlock()
	var r Restored
	for i := range snaps {
		snap := &snaps[i]
		if snap.Validate() != nil {
			continue
		}
		for j := range snap.Backends {
			prev := &snap.Backends[j]
			p, b, refused := a.lookup(snap.Pool, prev.Backend)
			if refused != "" {
				continue // beyond the limits, as an event would be
			}
			a.restoreBackend(p, b, prev, snap.At.Time, now, &r)
		}
	}
	return r
}

func (a *Analyzer) restoreBackend(p *pool, b *backend, prev *fleetwatch.Backend, at, now time.Time, r *Restored) {
	if !b.seen && b.lastSeen.Before(at) {
		// Not seen since the restart: its expiry counts from the
		// snapshot, the last time anyone knew of it.
		b.lastSeen = at
	}
	if prev.Drift != fleetwatch.DriftUnknown && b.drift == fleetwatch.DriftUnknown {
		b.drift = prev.Drift
		r.Drift++
	}
	b.trips = max(b.trips, prev.Trips)
	if !b.hasEWMA && prev.EWMATTFTMs != nil {
		b.ewma, b.hasEWMA = *prev.EWMATTFTMs, true
	}
	if prev.Override != nil {
		// The published state and weight were an operator's, not the
		// breaker's (override.go): the backend starts from its replayed
		// events alone, and the override itself comes back from its bucket.
		return
	}
	since := at
	if prev.Since != nil {
		since = prev.Since.Time
	}
	switch prev.State {
	case fleetwatch.StateOpen:
		var until time.Time
		if prev.OpenUntil != nil {
			until = prev.OpenUntil.Time
		}
		if until.After(now) {
			// The snapshot decided on every event up to its at: a trip
			// the replay made from those events (at another evaluation
			// time) gives way to it; only a trip on later events may
			// keep a later open_until.
			if b.state != fleetwatch.StateOpen || b.openUntil.Before(until) || !b.since.After(at) {
				b.trips = max(b.trips, 1)
				b.enter(fleetwatch.StateOpen, since, prev.Reason)
				b.openUntil = until
			}
			if prev.QuotaUntil != nil && prev.QuotaUntil.After(now) {
				// Out of quota: not a trip of the breaker's own.
				b.quotaUntil, b.tripCause = prev.QuotaUntil.Time, CauseQuota
				b.trips = 0
			}
			b.weight, b.weightSet, b.weightAt = 0, true, now
			r.Open++
			return
		}
		if b.state == fleetwatch.StateClosed {
			b.trips = max(b.trips, 1)
			b.enter(fleetwatch.StateHalfOpen, now, "open until "+fleetwatch.FormatTime(until)+" before a restart; probing with weight "+fmtFloat(p.settings.HalfOpenWeight))
			b.weight, b.weightSet, b.weightAt = p.settings.HalfOpenWeight, true, now
			r.HalfOpen++
		}
	case fleetwatch.StateHalfOpen:
		if b.state == fleetwatch.StateClosed {
			b.trips = max(b.trips, 1)
			b.enter(fleetwatch.StateHalfOpen, since, prev.Reason)
			b.weight, b.weightSet, b.weightAt = p.settings.HalfOpenWeight, true, now
			r.HalfOpen++
		}
	default:
		if b.state == fleetwatch.StateClosed && !b.weightSet {
			b.weight, b.weightSet, b.weightAt = prev.Weight, true, now
			r.Weights++
		}
	}
}
