package sim

import (
	"math"
	"time"
)

// fleetFeed is the simulator's stand-in for the proposed fleet-wide load
// feed (docs/EVALUATION.md, "Fleet-wide load (experiment)"). Every outcome
// event a proxy publishes would carry the backend's load at the moment of
// the answer (requests running + waiting, as the backend reports it in a
// response header) and the proxy's id (Event.Source); the analyzer would
// keep the newest value per backend, count the distinct sources of its
// window (the routers sharing the pool) and publish both in every snapshot,
// with the fleet-wide retry budget. fleetwatch.Event and Snapshot have no
// such fields yet, so the simulator computes the same values from the same
// events, beside the real analyzer, and publishes them at the feed period.
type fleetFeed struct {
	windowMs float64 // how long a source counts as a router after its last event

	// What the events reported so far (the analyzer's side).
	load     []float64 // newest reported load per backend
	loadAt   []float64 // virtual ms of that report; -1 before the first
	slots    []float64 // per backend, its running capacity (reported with the load)
	lastSeen []float64 // per router (event source), virtual ms of its newest event; -1 never

	// The fleet-wide retry budget: first attempts deposit ratio of a
	// token, retries withdraw one, floorPerSec accrues, and the balance
	// decays with the same 10 s time constant as the per-router budget.
	budgetRatio, budgetFloor float64
	balance, balanceAt       float64

	// pub is what the latest snapshot carried; routers read it.
	pub publishedLoad
}

// publishedLoad is the fleet-wide part of one snapshot.
type publishedLoad struct {
	valid   bool      // at least one load report was published
	at      float64   // virtual ms of the snapshot
	load    []float64 // per backend, the newest reported load (0 before any report)
	exact   []float64 // per backend, its true load at the snapshot (the exact-load variant)
	ageMs   []float64 // per backend, how old that report was when published
	routers int       // distinct sources in the window (>= 1)
	// spare is 1 - total load / total slots: the share of the pool's
	// running capacity that is idle (negative when requests wait).
	spare float64
	// budget is the fleet-wide retry budget's balance (retries).
	budget float64
}

// Fleet retry budget defaults: the ratio of today's per-router budget, with
// one router's floor for the whole fleet.
const (
	fleetBudgetRatio   = 0.2
	fleetBudgetFloor   = 3.0 // retries per second, fleet-wide
	fleetBudgetTauMs   = 10000
	spareFreeThreshold = 0.5 // retries are free while at least this share of the slots is idle
)

func newFleetFeed(slots []float64, routers int, window time.Duration) *fleetFeed {
	n := len(slots)
	f := &fleetFeed{
		windowMs: ms(window),
		load:     make([]float64, n),
		loadAt:   make([]float64, n),
		slots:    slots,
		lastSeen: make([]float64, routers),
		pub: publishedLoad{
			load: make([]float64, n), exact: make([]float64, n), ageMs: make([]float64, n), routers: 1, spare: 1,
		},
		budgetRatio: fleetBudgetRatio,
		budgetFloor: fleetBudgetFloor,
		balance:     fleetBudgetFloor,
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
// load at the answer, the source router, and whether the attempt was a
// retry (for the fleet budget).
func (f *fleetFeed) report(now float64, backend int, load float64, router int, retry bool) {
	f.load[backend], f.loadAt[backend] = load, now
	f.lastSeen[router] = now
	f.advance(now)
	if retry {
		// Free retries (spare capacity) are charged too, but the balance
		// does not go into debt: the budget starts from what the
		// first attempts of the last seconds allow when spare runs out.
		f.balance = max(0, f.balance-1)
	} else {
		f.balance += f.budgetRatio
	}
}

// advance decays the budget's balance toward the floor's steady state.
func (f *fleetFeed) advance(now float64) {
	dt := now - f.balanceAt
	if dt <= 0 {
		return
	}
	f.balanceAt = now
	decay := math.Exp(-dt / fleetBudgetTauMs)
	f.balance = f.balance*decay + f.budgetFloor*fleetBudgetTauMs/1000*(1-decay)
}

// publish fills pub as a snapshot taken at now would carry it; exact is
// every backend's true load now (what a scrape at the snapshot would read,
// for the exact-load variant only).
func (f *fleetFeed) publish(now float64, exact []float64) {
	p := &f.pub
	p.at = now
	copy(p.exact, exact)
	total, slots := 0.0, 0.0
	for b := range f.load {
		p.load[b] = f.load[b]
		p.ageMs[b] = 0
		if f.loadAt[b] >= 0 {
			p.valid = true
			p.ageMs[b] = now - f.loadAt[b]
		}
		total += f.load[b]
		slots += f.slots[b]
	}
	p.spare = 1 - total/slots
	p.routers = 0
	for _, seen := range f.lastSeen {
		if seen >= 0 && now-seen <= f.windowMs {
			p.routers++
		}
	}
	p.routers = max(p.routers, 1)
	f.advance(now)
	p.budget = f.balance
}
