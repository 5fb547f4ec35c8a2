package analyzer

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// BackendOverride is an operator override of one backend of one pool.
type BackendOverride struct {
	Pool    string `json:"pool"`
	Backend string `json:"backend"`
	fleetwatch.Override
}

// overrideKey is what makes an override change a snapshot: an override set,
// changed, cleared or expired publishes the pool before its heartbeat.
type overrideKey struct {
	kind   fleetwatch.OverrideKind
	until  time.Time
	weight float64
}

// SetOverrides replaces the operator overrides in force with list (the last
// of a pool and backend wins). They change only what snapshots publish:
// the analyzer keeps counting and judging an overridden backend, so that
// when an override ends (cleared, or its Until passed) the backend's own
// verdict is published again. An override of a pool or backend the
// analyzer does not know yet applies once it appears. At each snapshot:
//
//   - drain: weight 0, state unchanged (requests in flight finish);
//   - force_open: state open, open_until the override's Until, weight 0;
//   - force_closed: state closed, open_until null; the computed weight if
//     the backend is closed, else 1;
//   - weight: the override's weight, state unchanged.
//
// The backend carries the override, and expired ones are ignored.
func (a *Analyzer) SetOverrides(list []BackendOverride) {
	m := make(map[string]map[string]fleetwatch.Override, len(list))
	for _, o := range list {
		if m[o.Pool] == nil {
			m[o.Pool] = map[string]fleetwatch.Override{}
		}
		m[o.Pool][o.Backend] = o.Override
	}
	a.mu.Lock()
	a.overrides = m
	a.mu.Unlock()
}

// overrideOf returns the override of pool's backend in force at now.
func (a *Analyzer) overrideOf(pool, backend string, now time.Time) (fleetwatch.Override, bool) {
	o, ok := a.overrides[pool][backend]
	if !ok || !o.Active(now) {
		return fleetwatch.Override{}, false
	}
	return o, true
}

// keyOf is the decision key part of the override of pool's backend at now.
func (a *Analyzer) overrideKeyOf(pool, backend string, now time.Time) overrideKey {
	o, ok := a.overrideOf(pool, backend, now)
	if !ok {
		return overrideKey{}
	}
	k := overrideKey{kind: o.Kind, until: o.Until.Time}
	if o.Weight != nil {
		k.weight = *o.Weight
	}
	return k
}

// applyOverride rewrites d, the decision of a backend in state own, by the
// override in force at now, if any.
func (a *Analyzer) applyOverride(pool string, d *fleetwatch.Backend, now time.Time) {
	o, ok := a.overrideOf(pool, d.Backend, now)
	if !ok {
		return
	}
	switch o.Kind {
	case fleetwatch.OverrideDrain:
		d.Weight = 0
	case fleetwatch.OverrideForceOpen:
		d.State, d.Weight = fleetwatch.StateOpen, 0
		until := o.Until
		d.OpenUntil = &until
	case fleetwatch.OverrideForceClosed:
		if d.State != fleetwatch.StateClosed {
			d.State, d.Weight = fleetwatch.StateClosed, 1
		}
		d.OpenUntil = nil
	case fleetwatch.OverrideWeight:
		if o.Weight != nil {
			d.Weight = *o.Weight
		}
	}
	d.Override = &o
}
