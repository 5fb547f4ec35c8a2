package sim

import (
	"math"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// fleetFeed is the simulator's stand-in for the analyzer's fleet-wide load
// (docs/PROTOCOL.md, "Backend load (extension)" and "Retry budget
// (extension)"). Every outcome event a proxy publishes carries the
// backend's load at the moment of the answer (requests running and
// waiting, as the backend reports it in a response header) and the
// proxy's id (Event.Source); the feed keeps the newest load per backend,
// counts the distinct sources of its window (the routers sharing the
// pool) and the pool's attempt rate, and the simulator lays these over
// every snapshot the real analyzer returns (sim.withFleetLoad): each
// backend's Load with its age, the snapshot's Routers, and the retry
// budget analyzer.ComputeRetryBudget makes of them.
type fleetFeed struct {
	windowMs float64 // how long a source counts as a router after its last event

	// What the events reported so far (the analyzer's side).
	running  []float64 // newest reported load per backend
	waiting  []float64
	loadAt   []float64 // virtual ms of that report; -1 before the first
	slots    []float64 // per backend, its running capacity
	lastSeen []float64 // per router (event source), virtual ms of its newest event; -1 never

	// The pool's attempt rate: a count of attempts decaying with a 10 s
	// time constant, so rate = count / 10 s.
	attempts, attemptsAt float64

	// cur is what the latest snapshot or load beat carried; pub what the
	// latest decision snapshot did (the fleet-load experiments read it, at
	// the cadence their EVALUATION.md figures were measured at).
	cur, pub publishedLoad
}

// publishedLoad is the fleet-wide part of one snapshot.
type publishedLoad struct {
	valid   bool      // at least one load report was published
	at      float64   // virtual ms of the snapshot
	load    []float64 // per backend, the newest reported load, running + waiting (0 before any report)
	exact   []float64 // per backend, its true load at the snapshot (the exact-load variant)
	ageMs   []float64 // per backend, how old that report was when published
	routers int       // distinct sources in the window (0 before any, as the analyzer's)
	// ratePerSec is the pool's attempts a second.
	ratePerSec float64
}

// attemptTauMs is the attempt rate's time constant.
const attemptTauMs = 10000

func newFleetFeed(slots []float64, routers int, window time.Duration) *fleetFeed {
	n := len(slots)
	f := &fleetFeed{
		windowMs: ms(window),
		running:  make([]float64, n),
		waiting:  make([]float64, n),
		loadAt:   make([]float64, n),
		slots:    slots,
		lastSeen: make([]float64, routers),
		cur: publishedLoad{
			load: make([]float64, n), exact: make([]float64, n), ageMs: make([]float64, n),
		},
		pub: publishedLoad{
			load: make([]float64, n), exact: make([]float64, n), ageMs: make([]float64, n),
		},
	}
	for i := range f.loadAt {
		f.loadAt[i] = -1
	}
	for i := range f.lastSeen {
		f.lastSeen[i] = -1
	}
	return f
}

// report is one outcome event as the analyzer would read it: the backend's
// load at the answer and the source router.
func (f *fleetFeed) report(now float64, backend int, running, waiting float64, router int) {
	f.running[backend], f.waiting[backend], f.loadAt[backend] = running, waiting, now
	f.lastSeen[router] = now
	f.advance(now)
	f.attempts++
}

// advance decays the attempt count.
func (f *fleetFeed) advance(now float64) {
	dt := now - f.attemptsAt
	if dt <= 0 {
		return
	}
	f.attemptsAt = now
	f.attempts *= math.Exp(-dt / attemptTauMs)
}

// publish fills cur as a snapshot (or a load beat) taken at now would
// carry it, and pub too for a decision snapshot; exact is every backend's
// true load now (what a scrape at the snapshot would read, for the
// exact-load variant only).
func (f *fleetFeed) publish(now float64, exact []float64, decision bool) {
	f.fill(now, exact)
	if decision {
		c, p := &f.cur, &f.pub
		p.valid, p.at, p.routers, p.ratePerSec = c.valid, c.at, c.routers, c.ratePerSec
		copy(p.load, c.load)
		copy(p.exact, c.exact)
		copy(p.ageMs, c.ageMs)
	}
}

func (f *fleetFeed) fill(now float64, exact []float64) {
	p := &f.cur
	p.at = now
	copy(p.exact, exact)
	for b := range f.running {
		p.load[b] = f.running[b] + f.waiting[b]
		p.ageMs[b] = 0
		if f.loadAt[b] >= 0 {
			p.valid = true
			p.ageMs[b] = now - f.loadAt[b]
		}
	}
	p.routers = 0
	for _, seen := range f.lastSeen {
		if seen >= 0 && now-seen <= f.windowMs {
			p.routers++
		}
	}
	f.advance(now)
	p.ratePerSec = f.attempts / (attemptTauMs / 1000)
}

// loadOf is backend b's Load as the snapshot carries it (nil before its
// first report), or its true load at the snapshot with exact.
func (f *fleetFeed) loadOf(b int, exact bool) *fleetwatch.Load {
	if exact {
		return &fleetwatch.Load{Running: f.cur.exact[b], Source: "metrics"}
	}
	if f.loadAt[b] < 0 {
		return nil
	}
	return &fleetwatch.Load{Running: f.running[b], Waiting: f.waiting[b], AgeMs: int64(f.cur.ageMs[b]), Source: "event"}
}
