package p2c

import (
	"math"
	"sync/atomic"
	"time"
)

// Loads between decisions: a snapshot sets every backend's published load
// and TTFT EWMA, and a load update (UpdateLoads: the compact feed's load
// frame, docs/PROTOCOL.md "Compact feed (extension)") moves the ones that
// changed, and the snapshot's staleness, without building the state again:
// the decisions (states, weights, tables) stay as the last snapshot built
// them. Picks read a backend's published record field by field while an
// update writes it, so a pick may see an update half applied: two
// consecutive reports of one backend mixed, each a true load a moment
// apart, which no rule depends on.

// published is what the feed says of one backend between decisions.
type published struct {
	load  atomic.Uint64 // float64 bits: the load the score ranks by; NaN: none (Score.FleetLoad)
	ewma  atomic.Uint64 // float64 bits: the feed's TTFT EWMA; NaN: none
	decay atomic.Uint64 // float64 bits: decayFrom(the state's at, loadAt); 1 when LoadStale < 0
	// loadAt is the report's time (unix ns), staleAt when it goes stale,
	// atSnap the router's in-flight count the load is counted from.
	loadAt, staleAt, atSnap atomic.Int64
}

func (f *published) pubLoad() float64 { return math.Float64frombits(f.load.Load()) }
func (f *published) feedEWMA() float64 {
	return math.Float64frombits(f.ewma.Load())
}
func (f *published) loadDecay() float64 { return math.Float64frombits(f.decay.Load()) }

// setLoad publishes a load report of running and waiting requests, ageMs
// old at frameAt (unix ns), on a state taken at stateAt.
func (p *Picker) setLoad(f *published, running, waiting float64, frameAt, ageMs, stateAt int64) {
	t := running + waiting
	if p.runningW != 1 {
		t = waiting + p.runningW*running
	}
	if !(t >= 0) || math.IsInf(t, 0) {
		f.load.Store(math.Float64bits(math.NaN()))
		return
	}
	loadAt := frameAt - ageMs*int64(time.Millisecond)
	staleAt, decay := int64(math.MaxInt64), 1.0
	if p.loadStale >= 0 {
		staleAt = loadAt + int64(p.loadStale)
		decay = p.decayFrom(stateAt, loadAt)
	}
	f.loadAt.Store(loadAt)
	f.staleAt.Store(staleAt)
	f.decay.Store(math.Float64bits(decay))
	f.load.Store(math.Float64bits(t))
}

// reported moves e's published load's report to loadAt when that is
// newer (the same load, reported again), counting the router's own
// requests from then on; at is the update's time.
func (p *Picker) reported(e *entry, loadAt, at, stateAt int64) {
	if loadAt <= e.pub.loadAt.Load() {
		return
	}
	e.pub.loadAt.Store(loadAt)
	if p.loadStale >= 0 {
		e.pub.staleAt.Store(loadAt + int64(p.loadStale))
		e.pub.decay.Store(math.Float64bits(p.decayFrom(stateAt, loadAt)))
	}
	p.setBaseline(at, e)
}

// decayFrom is exp(-(stateAt - loadAt) / LoadStale): a load's decay at the
// state's time, which a pick multiplies by the decay since (Picker.decay)
// for the load's decay now. A load reported after the state was built (a
// load frame's) decays by less than nothing at it, more than 1, so that
// the product is its true decay; picks cap the product at 1 (a report
// from the future is as good as a report now).
func (p *Picker) decayFrom(stateAt, loadAt int64) float64 {
	return math.Exp(-float64(stateAt-loadAt) / float64(p.loadStale))
}

// setBaseline sets the in-flight count e's published load is counted from:
// the count at the first snapshot (or load update) at or after the
// report, at being the snapshot's or update's time. A report older than
// earlier snapshots does not include what this router sent since those
// (docs/EVALUATION.md "The steady-state cells"; counting from the snapshot
// that carries the load was the rule before 2026-12-05). The counts are
// kept at the last 8 snapshots per backend, written on Update, not on
// Pick.
func (p *Picker) setBaseline(at int64, e *entry) {
	n := e.local.inFlight.Load()
	// Recorded at every snapshot; used only against a published load.
	if base := e.local.baselineAt(at, n, e.pub.loadAt.Load()); !math.IsNaN(e.pub.pubLoad()) {
		n = base
	}
	e.pub.atSnap.Store(n)
}

func (st *state) setMedian(m *float64) {
	v := math.NaN()
	if m != nil && *m > 0 {
		v = *m
	}
	st.median.Store(math.Float64bits(v))
}

// med is the pool median EWMA TTFT; NaN when unknown.
func (st *state) med() float64 { return math.Float64frombits(st.median.Load()) }

// BackendLoad is one backend's change in a load update. NaN fields did not
// change.
type BackendLoad struct {
	Backend          string
	Running, Waiting float64 // NaN: the load did not change
	AgeMs            int64   // the report's age at the update's At; -1 unknown
	NoLoad           bool    // the load is no longer published
	Metrics          bool    // the load came from the backend's metrics (else an outcome event)
	EWMATTFTMs       float64 // NaN: the EWMA did not change
}

// LoadUpdate moves the published loads and EWMAs of the snapshot the
// picker applied (the compact feed's load frame): Epoch and Base name that
// snapshot (its epoch and seq), At is when the update was taken. A backend
// listed with a report age but no load keeps its load, reported that long
// before At (the same value, reported again: the router counts its own
// requests from then on); one not listed keeps both. Median and Budget are
// the pool's median EWMA (0: none any more) and the retry budget's rate
// when they moved (NaN otherwise).
type LoadUpdate struct {
	Epoch    string
	Base     uint64
	At       time.Time
	Median   float64
	Budget   float64
	Backends []BackendLoad
	// Full: the update lists every backend, from a key frame that
	// repeated the decisions of the snapshot applied (feed.Watcher's
	// refresh); else only what moved.
	Full bool
}

// UpdateLoads applies u to the snapshot applied, when u names it (its
// epoch and seq) and is not older than it; it reports whether it did. The
// snapshot is fresh again until u.At + ttl_ms. It takes Update's lock, does
// not allocate, and picks go on meanwhile.
func (p *Picker) UpdateLoads(u *LoadUpdate) bool {
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	st := p.state.Load()
	if st == nil || st.full != nil || st.header.Epoch != u.Epoch || st.header.Seq != u.Base {
		return false
	}
	at := u.At.UnixNano()
	if at < st.at {
		return false
	}
	for i := range u.Backends {
		b := &u.Backends[i]
		k := i // the feed's order is the snapshot's (both by id): look there first
		if k >= len(st.entries) || st.entries[k].id != b.Backend {
			var ok bool
			if k, ok = st.byID[b.Backend]; !ok {
				continue
			}
		}
		e := &st.entries[k]
		switch {
		case b.NoLoad:
			e.pub.load.Store(math.Float64bits(math.NaN()))
		case !math.IsNaN(b.Running) && p.score.FleetLoad && !(st.alone && !b.Metrics):
			p.setLoad(e.pub, b.Running, b.Waiting, at, max(b.AgeMs, 0), st.at)
			p.setBaseline(at, e)
		case b.AgeMs >= 0 && !math.IsNaN(e.pub.pubLoad()):
			p.reported(e, at-b.AgeMs*int64(time.Millisecond), at, st.at)
		}
		if !math.IsNaN(b.EWMATTFTMs) && b.EWMATTFTMs > 0 {
			e.pub.ewma.Store(math.Float64bits(b.EWMATTFTMs))
		}
	}
	if !math.IsNaN(u.Median) {
		st.setMedian(&u.Median)
	}
	if !math.IsNaN(u.Budget) && u.Budget >= 0 {
		p.fleet.setRate(u.Budget/st.routers, p.now())
	}
	st.staleAt.Store(at + st.ttl)
	return true
}

// StaleAt returns when the decisions applied go stale: the snapshot's
// StaleAt, moved on by every load update applied to it (UpdateLoads); the
// zero time when none was applied.
func (p *Picker) StaleAt() time.Time {
	st := p.state.Load()
	if st == nil {
		return time.Time{}
	}
	return time.Unix(0, st.staleAt.Load())
}
