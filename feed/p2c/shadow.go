package p2c

import (
	"github.com/fleetwatch/fleetwatch"
)

// Shadow mode (PROTOCOL.md "Shadow mode (extension)"). A snapshot whose
// shadow field is "breakers" or "observe" carries advisory decisions. The
// picker then follows ShadowView(snap), the part of the decisions the mode
// keeps, and also picks on the full decisions for every request, with the
// same random draws, to count what it would have done differently
// (ShadowStats). Sharing the draws is what makes the count mean something:
// two independent weighted draws over the same decisions differ often,
// while two draws from the same bits over the same decisions never do, so
// every difference counted is one the decisions made.
//
// An operator override is honoured in every mode: a drain, a forced open
// and a weight set by hand are an operator's explicit instruction, not
// fleetwatch's judgement, which is what shadow mode holds back
// (docs/DECISIONS.md). A forced closed backend is closed at weight 1.
//
// The full decisions' state is built only for a snapshot in shadow mode;
// off, Pick pays one nil check for the feature.

// ShadowView returns the decisions a router in snap's shadow mode follows:
// a copy of snap whose backends are rewritten as the mode says. With
// "breakers" an open backend stays open and a half-open one keeps its
// published trickle weight, and every closed backend gets weight 1; with
// "observe" every backend is closed at weight 1 with no open_until. A
// backend carrying an operator override keeps its published state and
// weight, except that a force_closed one is closed at weight 1. With
// shadow mode off (or an unknown mode) it returns snap itself. snap is not
// modified.
func ShadowView(snap *fleetwatch.Snapshot) *fleetwatch.Snapshot {
	if snap == nil || !snap.Shadow.On() {
		return snap
	}
	out := *snap
	out.Backends = make([]fleetwatch.Backend, len(snap.Backends))
	for i, b := range snap.Backends {
		switch {
		case b.Override != nil && b.Override.Kind == fleetwatch.OverrideForceClosed:
			b.State, b.Weight, b.OpenUntil = fleetwatch.StateClosed, 1, nil
		case b.Override != nil:
			// The operator's drain, forced open or weight: as published.
		case snap.Shadow == fleetwatch.ShadowObserve:
			b.State, b.Weight, b.OpenUntil = fleetwatch.StateClosed, 1, nil
		case b.State == fleetwatch.StateClosed: // breakers
			b.Weight = 1
		}
		out.Backends[i] = b
	}
	return &out
}

// Why the full decisions never pick a backend (state.excluded).
const (
	exclNone   uint8 = iota
	exclOpen         // its breaker is open
	exclWeight       // it gets no share: weight 0, or a failover priority that gets no traffic
	exclShed         // every backend is open and all_open is shed: the request would fail
	numExcl
)

// ShadowStats counts what a picker in shadow mode did differently from
// what the full decisions would have done. The counts only grow; Mode is
// the applied snapshot's.
type ShadowStats struct {
	// Mode is the shadow mode of the snapshot applied: "" when off.
	Mode fleetwatch.Shadow
	// Picks counts the picks made while a snapshot in shadow mode was
	// applied.
	Picks uint64
	// Differed counts those whose backend is not the one the full
	// decisions would have picked with the same random draws (or for
	// which they would have picked none).
	Differed uint64
	// ExcludedOpen, ExcludedWeight and ExcludedShed count the picks, made
	// while the snapshot was fresh, that went to a backend the full
	// decisions never pick: held open; given no share (weight 0, or a
	// failover priority that gets no traffic); or any backend while every
	// one is open and all_open is shed (the request would have failed
	// fast). Each of them also counts in Differed.
	ExcludedOpen, ExcludedWeight, ExcludedShed uint64
}

// Excluded is the sum of the three Excluded counts.
func (s ShadowStats) Excluded() uint64 { return s.ExcludedOpen + s.ExcludedWeight + s.ExcludedShed }

// ShadowStats returns the picker's shadow-mode counts.
func (p *Picker) ShadowStats() ShadowStats {
	s := ShadowStats{
		Picks:          p.shadowPicks.Load(),
		Differed:       p.shadowDiffered.Load(),
		ExcludedOpen:   p.shadowExcluded[exclOpen].Load(),
		ExcludedWeight: p.shadowExcluded[exclWeight].Load(),
		ExcludedShed:   p.shadowExcluded[exclShed].Load(),
	}
	if st := p.state.Load(); st != nil {
		s.Mode = st.shadow
	}
	return s
}

// buildShadow builds the state of a snapshot in shadow mode: the state the
// picker follows (of ShadowView(snap)), holding the full decisions' state
// in full. Both share the backends' locals, so that the two picks see the
// same in-flight counts and local EWMAs.
func (p *Picker) buildShadow(snap *fleetwatch.Snapshot, prev *state) *state {
	st := p.build(ShadowView(snap), prev)
	st.shadow = snap.Shadow
	full := p.build(snap, st)
	full.excluded = full.exclusions()
	st.full = full
	return st
}

// exclusions returns, for each entry of a fresh snapshot's state, why the
// fresh path never picks it (exclNone when it may).
func (st *state) exclusions() []uint8 {
	out := make([]uint8, len(st.entries))
	for i := range st.entries {
		switch {
		case st.allOpen && st.shed:
			out[i] = exclShed
		case st.allOpen: // spread: every backend may be picked
		case st.mayPick(i):
		case st.entries[i].state == fleetwatch.StateOpen:
			out[i] = exclOpen
		default:
			out[i] = exclWeight
		}
	}
	return out
}

// mayPick reports whether the fresh path can return entry i: it has
// weight in the candidate table, or in a failover tier's.
func (st *state) mayPick(i int) bool {
	if st.fresh.cum != nil && st.fresh.weight(i) > 0 {
		return true
	}
	for k := range st.tiers {
		if st.tiers[k].tbl.weight(i) > 0 {
			return true
		}
	}
	return false
}

// replayRand is a splitmix64 generator: both picks of a shadow-mode
// request draw from one, reset to the same seed.
type replayRand struct{ s uint64 }

func (r *replayRand) Uint64() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// pickShadow is Pick for a state in shadow mode: it picks on st (what the
// mode follows) and on st.full (the full decisions) from the same random
// draws, counts the difference, and counts the request in flight on st's
// choice.
func (p *Picker) pickShadow(st *state, r Rand, req Request, ex int, now int64, fresh bool) (Choice, error) {
	seed := r.Uint64()
	rr := p.replays.Get().(*replayRand)
	defer p.replays.Put(rr)
	rr.s = seed
	i, sticky, err := p.pickOn(st, rr, req, ex, now, fresh)
	if err != nil {
		return Choice{}, err
	}
	rr.s = seed
	fi, _, ferr := p.pickOn(st.full, rr, req, ex, now, fresh)
	p.shadowPicks.Add(1)
	if fresh {
		if why := st.full.excluded[i]; why != exclNone {
			p.shadowExcluded[why].Add(1)
		}
	}
	if ferr != nil || fi != i {
		p.shadowDiffered.Add(1)
	}
	return p.start(st, i, sticky), nil
}

// pickOn is the fresh or the stale pick on st.
func (p *Picker) pickOn(st *state, r Rand, req Request, ex int, now int64, fresh bool) (int, bool, error) {
	if fresh {
		return p.pickFresh(st, r, req, ex, now)
	}
	return p.pickStale(st, r, req, ex, now)
}
