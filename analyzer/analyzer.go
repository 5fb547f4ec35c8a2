package analyzer

import (
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Analyzer turns outcome events into decision snapshots. It is safe for
// concurrent use: one mutex guards all of its state, so Observe may run on a
// collector goroutine while a ticker calls Evaluate. It never calls out while
// holding the mutex: Evaluate returns what to publish.
type Analyzer struct {
	mu sync.Mutex // guards everything below

	global     Settings
	quarantine bool
	epoch      string
	seed       uint64
	rng        *rand.Rand

	pools     map[string]*pool
	poolOrder []*pool // sorted by id; nil when it must be rebuilt
	configs   map[string]*PoolConfig
	// retiredSeq keeps the last seq of forgotten pools, so that a pool
	// that comes back continues its seq within the epoch (a router drops a
	// snapshot whose seq is not newer than the last it applied).
	retiredSeq map[string]uint64
	// retiredFloor is the largest seq retiredSeq forgot to stay within
	// limits.MaxPools entries (see retire).
	retiredFloor uint64

	// limits bound the pools and backends (defaults applied);
	// backendCount is the number of backends of all pools (recounted by
	// evaluate, which drops expired ones), and refused counts the events
	// the limits kept out.
	limits       Limits
	backendCount int
	refused      RefusedCounts

	// hasNow is true once Evaluate or Snapshots ran; lastNow is the latest
	// now they saw, the reference for clamping future events.
	hasNow  bool
	lastNow time.Time

	// last is the most recently observed backend, a cache for batches that
	// carry many events of the same backend.
	lastPool    *pool
	lastBackend *backend

	stats statsCounters

	// overrides are the operators' overrides, by pool and backend
	// (override.go); kept apart from the pools, which come and go.
	overrides map[string]map[string]fleetwatch.Override
}

// pool is the state of one pool.
type pool struct {
	id         string
	configured bool
	mode       fleetwatch.Mode
	allOpen    fleetwatch.AllOpen
	shadow     fleetwatch.Shadow // the snapshot's shadow mode (shadow.go)
	tolerance  float64
	settings   Settings

	backends map[string]*backend
	order    []*backend // sorted by id; nil when it must be rebuilt

	seq       uint64
	published bool          // a snapshot of the pool was returned
	beatAt    time.Time     // the pool's last heartbeat, the anchor of the next
	loadAt    time.Time     // the pool's last load beat, the anchor of the next
	ruleAt    time.Time     // EvaluateDue's last rule tick without load beats
	resync    bool          // Resync asked for a snapshot at the next Evaluate
	signature []decisionKey // the decisions of the last returned snapshot
	spare     []decisionKey // the other buffer of signature
	peers     peers         // scratch of the slowness rule
	routers   routerSet     // the distinct event sources (load.go)
}

// decisionKey is what makes a snapshot "changed" and published before the
// heartbeat: membership, state, weight, reason, drift and open_until.
type decisionKey struct {
	backend   string
	state     fleetwatch.State
	weight    float64
	reason    string
	drift     fleetwatch.DriftStatus
	openUntil time.Time
	override  overrideKey // the operator override in force (override.go)
}

// New returns an Analyzer for cfg, with defaults applied to a copy of it. It
// returns a *SettingError wrapping ErrInvalidSettings or ErrInvalidConfig
// when a value is out of range.
func New(cfg Config) (*Analyzer, error) {
	global := cfg.Settings.WithDefaults()
	if err := cfg.validate(global); err != nil {
		return nil, err
	}
	limits := cfg.Limits.WithDefaults()
	if err := limits.validate(cfg.Pools); err != nil {
		return nil, err
	}
	a := &Analyzer{
		global:     global,
		quarantine: cfg.Quarantine,
		epoch:      cfg.Epoch,
		seed:       cfg.Seed,
		rng:        rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		pools:      make(map[string]*pool, len(cfg.Pools)),
		configs:    make(map[string]*PoolConfig, len(cfg.Pools)),
		retiredSeq: make(map[string]uint64),
		limits:     limits,
	}
	a.stats.init()
	for i := range cfg.Pools {
		pc := cfg.Pools[i]
		pc.Backends = slices.Clone(pc.Backends)
		a.configs[pc.ID] = &pc
		p := a.newPool(pc.ID)
		for _, bc := range pc.Backends {
			b := p.addBackend(bc.ID)
			a.backendCount++
			b.configured = true
			b.priority = bc.Priority
			if bc.CostPerMTok != nil {
				b.cost = new(float64(*bc.CostPerMTok))
			}
		}
	}
	return a, nil
}

// newPool creates and registers a pool, configured or from an event.
func (a *Analyzer) newPool(id string) *pool {
	p := &pool{
		id:       id,
		backends: make(map[string]*backend),
		seq:      a.startSeq(id),
	}
	a.configurePool(p)
	a.pools[id] = p
	a.poolOrder = nil
	return p
}

func (p *pool) addBackend(id string) *backend {
	b := newBackend(id, &p.settings)
	p.backends[id] = b
	p.order = nil
	return b
}

// sorted returns the pool's backends sorted by id.
func (p *pool) sorted() []*backend {
	if p.order == nil {
		p.order = make([]*backend, 0, len(p.backends))
		for _, b := range p.backends {
			p.order = append(p.order, b)
		}
		slices.SortFunc(p.order, func(x, y *backend) int { return cmpString(x.id, y.id) })
	}
	return p.order
}

func cmpString(x, y string) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// sortedPools returns the pools sorted by id.
func (a *Analyzer) sortedPools() []*pool {
	if a.poolOrder == nil {
		a.poolOrder = make([]*pool, 0, len(a.pools))
		for _, p := range a.pools {
			a.poolOrder = append(a.poolOrder, p)
		}
		slices.SortFunc(a.poolOrder, func(x, y *pool) int { return cmpString(x.id, y.id) })
	}
	return a.poolOrder
}

// Observe counts a batch of events. Their TS must be filled (the collector
// uses the arrival time when an event has none); an event with a zero TS is
// counted at the latest Evaluate's now (and dropped before the first
// Evaluate, counted in Stats.DroppedNoTime). Events for pools and backends not
// seen before create them with the global defaults. Events older than the
// window are counted in Stats and dropped; events further in the future than
// two heartbeats past the latest Evaluate's now go in the newest bucket that
// far ahead.
//
// An event without an outcome gets the one its status implies (as the
// decoder does); an event with an outcome beyond the protocol's is dropped
// (Stats.DroppedInvalid), and so is a TTFT outside [0, 1 h] as a latency
// sample.
//
// An event that would create a pool or a backend beyond Config.Limits is
// not counted (see Refused; ObserveRefusing also says which events).
//
// It returns true when an event may have decided a breaker transition (a
// consecutive-failure trip, or a half-open probe's verdict), so that the
// caller can Evaluate at once instead of waiting for the heartbeat.
func (a *Analyzer) Observe(batch []fleetwatch.Event) (urgent bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	urgent, _ = a.observe(batch, nil)
	return urgent
}

// observe is Observe under a.mu; it appends the refused events to refused
// when it is not nil.
func (a *Analyzer) observe(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (urgent bool, _ []fleetwatch.Refusal) {
	for i := range batch {
		ev := &batch[i]
		if ev.Shed != "" {
			// Refused in front of the backend (a gateway's or a
			// scheduler's shed): it says nothing of the backend, and
			// creates nothing.
			a.stats.Shed++
			continue
		}
		p, b := a.lastPool, a.lastBackend
		if p == nil || p.id != ev.Pool || b.id != ev.Backend {
			var reason fleetwatch.Reason
			if p, b, reason = a.lookup(ev.Pool, ev.Backend); reason != "" {
				if reason == fleetwatch.ReasonTooManyPools {
					a.refused.Pools++
				} else {
					a.refused.Backends++
				}
				if refused != nil {
					refused = append(refused, fleetwatch.Refusal{Index: i, Reason: reason})
				}
				continue
			}
			a.lastPool, a.lastBackend = p, b
		}
		outcome := ev.Outcome
		if outcome == fleetwatch.OutcomeUnset {
			outcome = fleetwatch.OutcomeFromStatus(ev.Status) // the decoder's rule
		}
		if int(outcome) >= fleetwatch.NumOutcomes {
			a.stats.DroppedInvalid++
			continue
		}
		a.stats.observed[outcome]++
		ts := ev.TS
		switch {
		case ts.IsZero() && !a.hasNow:
			a.stats.DroppedNoTime++ // no reference to count it at
			continue
		case ts.IsZero():
			ts = a.lastNow
		case a.hasNow:
			if lead := a.lastNow.Add(2 * p.settings.Heartbeat); ts.After(lead) {
				ts = lead
				a.stats.ClampedFuture++
			}
		}
		if a.observeOne(p, b, ev, outcome, ts) {
			urgent = true
		}
	}
	return urgent, refused
}

// lookup returns the pool and backend of an event, creating them within
// the limits; when a limit keeps one out it returns the reason instead. A
// pool is not created for an event whose backend could not be, so that
// refused events leave no empty pools behind.
func (a *Analyzer) lookup(poolID, backendID string) (*pool, *backend, fleetwatch.Reason) {
	p := a.pools[poolID]
	if p == nil {
		switch {
		case len(a.pools) >= a.limits.MaxPools:
			return nil, nil, fleetwatch.ReasonTooManyPools
		case a.backendCount >= a.limits.MaxBackends:
			return nil, nil, fleetwatch.ReasonTooManyBackends
		}
		p = a.newPool(poolID)
	}
	b := p.backends[backendID]
	if b == nil {
		if len(p.backends) >= a.limits.MaxBackendsPerPool || a.backendCount >= a.limits.MaxBackends {
			return nil, nil, fleetwatch.ReasonTooManyBackends
		}
		b = p.addBackend(backendID)
		a.backendCount++
	}
	return p, b, ""
}

// SetDrift records a backend's drift status (from the probes). With
// Config.Quarantine a drifted backend gets weight 0 at the next Evaluate. A
// pool or backend the analyzer does not know is ignored: probes only run
// against configured backends, which exist from New.
func (a *Analyzer) SetDrift(poolID, backendID string, status fleetwatch.DriftStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil {
		return
	}
	if b := p.backends[backendID]; b != nil {
		b.drift = status
	}
}

// Evaluation is what one Evaluate decided.
type Evaluation struct {
	// Snapshots to publish, sorted by pool: every pool whose decisions
	// changed and every pool whose last snapshot is a heartbeat old.
	Snapshots []fleetwatch.Snapshot
	// Loads lists the pools whose load beat is due (Settings.LoadBeat)
	// and that are not in Snapshots, sorted by pool: each a snapshot of
	// its decisions, with the seq of the pool's last snapshot, and its
	// loads, EWMAs, median and retry budget now. Reasons, TTFT and TPOT
	// quantiles, rates and since are left out (the compact feed's load
	// frames carry none of them).
	Loads []fleetwatch.Snapshot
	// Transitions lists every breaker state change, in pool and backend
	// order.
	Transitions []Transition
}

// Transition is one breaker state change.
type Transition struct {
	Pool    string           `json:"pool"`
	Backend string           `json:"backend"`
	From    fleetwatch.State `json:"from"`
	To      fleetwatch.State `json:"to"` // "" when the backend expired
	At      time.Time        `json:"at"`
	// Reason is the sentence with the numbers.
	Reason string `json:"reason"`
	// Generation is the backend's breaker generation after the change.
	Generation uint64 `json:"generation"`
	// Cause is one of the Cause* constants.
	Cause string `json:"cause"`
}

// Causes of transitions, the keys of Stats.Trips and Stats.HeldByGate.
const (
	CauseFailureRate       = "failure_rate"           // closed -> open: error rate
	CauseConsecutive       = "consecutive"            // closed -> open: failures in a row
	CauseThrottled         = "throttled"              // closed -> open: 429 rate
	CauseSlow              = "slow"                   // closed -> open: EWMA against the pool median
	CauseClientError       = "client_error_rate"      // closed -> open: 4xx rate far above the peers'
	CauseHalfOpenClientErr = "half_open_client_error" // half_open -> open: client errors again, after a client_error_rate trip
	CauseHalfOpenFailure   = "half_open_failure"      // half_open -> open: an error or timeout
	CauseHalfOpenThrottled = "half_open_throttled"    // half_open -> open: a 429
	CauseQuota             = "quota"                  // closed or half_open -> open: a quota spent until a time hours or days ahead (quota_reset_ms)
	CauseOpenElapsed       = "open_elapsed"           // open -> half_open
	CauseRecovered         = "recovered"              // half_open -> closed
	CauseExpired           = "expired"                // dropped after Expiry without events
)

// Evaluate applies the rules at now and returns the snapshots to publish and
// the transitions made. Each returned snapshot of a pool has the next seq.
func (a *Analyzer) Evaluate(now time.Time) Evaluation { return a.evaluate(now, false, false) }

// EvaluateDue is Evaluate for the pools that are due at now: a heartbeat or
// load beat, a resync, a first snapshot, or a rule tick (the load beat, or
// the heartbeat up to RuleTick without load beats). A caller that ticks
// every tenth of the load beat takes each pool on its own phase, so the
// pools of a fleet publish across the beat instead of all at one instant
// (their subscribers' work comes evenly rather than in one burst), and
// each pool's rules run as often as a caller of Evaluate every load beat
// runs them. A pool left out changes nothing: its events wait in its
// windows for its next turn, at most a rule tick away (an event that may
// open a breaker is the caller's cue to Evaluate every pool at once).
func (a *Analyzer) EvaluateDue(now time.Time) Evaluation { return a.evaluate(now, false, true) }

// Final evaluates at now and returns a snapshot of every pool, each with its
// seq advanced, so routers accept it: the snapshot a process publishes when
// it shuts down.
func (a *Analyzer) Final(now time.Time) []fleetwatch.Snapshot {
	return a.evaluate(now, true, false).Snapshots
}

func (a *Analyzer) evaluate(now time.Time, all, dueOnly bool) Evaluation {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tick(now)
	var ev Evaluation
	pools := a.sortedPools()
	var dropped []string
	for _, p := range pools {
		first := len(ev.Transitions)
		beat := p.beat(now)
		loads := !beat && p.loadBeat(now)
		if dueOnly && !beat && !loads && !p.resync && !p.ruleTick(now) {
			continue
		}
		// Damped weights step on load beats too (a ramp goes out as
		// decision snapshots four times a second), by the time elapsed.
		gone := a.evaluatePool(p, now, beat || loads, &ev)
		slices.SortStableFunc(ev.Transitions[first:], func(x, y Transition) int { return cmpString(x.Backend, y.Backend) })
		// Two signature buffers per pool, swapped on change: a tick that
		// changes nothing allocates nothing for the comparison.
		sig := a.decisions(p, p.spare, now)
		resync := p.resync
		p.resync = false
		if all || gone || beat || resync || !slices.Equal(sig, p.signature) {
			p.seq++
			p.published, p.signature, p.spare = true, sig, p.signature
			ev.Snapshots = append(ev.Snapshots, a.snapshot(p, now, false))
		} else {
			p.spare = sig // keep the grown buffer
			if loads {
				ev.Loads = append(ev.Loads, a.snapshot(p, now, true))
			}
		}
		if gone {
			dropped = append(dropped, p.id)
		}
	}
	for _, id := range dropped {
		a.retire(id, a.pools[id].seq)
		delete(a.pools, id)
		a.poolOrder = nil
		a.lastPool, a.lastBackend = nil, nil
	}
	// The rules drop expired backends; recount rather than track each drop.
	a.backendCount = 0
	for _, p := range a.pools {
		a.backendCount += len(p.backends)
	}
	return ev
}

// tick records now as the reference clock and fixes the epoch.
func (a *Analyzer) tick(now time.Time) {
	if !a.hasNow || now.After(a.lastNow) {
		a.lastNow = now
	}
	a.hasNow = true
	if a.epoch == "" {
		a.epoch = newEpoch(now, a.rng)
	}
}

// Snapshots returns the current snapshot of every pool, sorted by pool id,
// without applying the rules or advancing seq (each carries the seq of the
// pool's last returned snapshot): for /api/decisions and a last snapshot on
// shutdown. The window figures are as of now.
func (a *Analyzer) Snapshots(now time.Time) []fleetwatch.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tick(now)
	out := make([]fleetwatch.Snapshot, 0, len(a.pools))
	for _, p := range a.sortedPools() {
		p.advance(now)
		out = append(out, a.snapshot(p, now, false))
	}
	return out
}

// Snapshot is Snapshots for one pool; ok is false for an unknown pool.
func (a *Analyzer) Snapshot(poolID string, now time.Time) (snap fleetwatch.Snapshot, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil {
		return fleetwatch.Snapshot{}, false
	}
	a.tick(now)
	p.advance(now)
	return a.snapshot(p, now, false), true
}

// Epoch returns the analyzer's epoch ("" before the first Evaluate when
// Config.Epoch was empty).
func (a *Analyzer) Epoch() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// beat reports whether the pool's heartbeat is due at now, and if so moves
// the anchor. The first beat is the pool's first Evaluate (t); the next
// ones are anchored a phase earlier (t-ph+hb, t-ph+2hb, ...), ph a hash of
// the pool id below the heartbeat, so that pools created together beat
// apart instead of in one burst. A beat may come a tenth of a heartbeat
// early (of a load beat, with load beats: the heartbeat is then one of
// their grid), so that a caller ticking at or faster than the beats gets
// exactly one per period whatever the jitter of its ticks. A caller that
// fell more than two heartbeats behind re-anchors at now.
func (p *pool) beat(now time.Time) bool {
	hb := p.settings.Heartbeat
	if !p.published {
		p.beatAt = now.Add(-phase(p.id, hb))
		return true
	}
	early := hb / 10
	if lb := p.settings.LoadBeat; lb > 0 && lb < hb {
		early = lb / 10 // on the load beats' grid: a heartbeat is one of them
	}
	return nextBeat(&p.beatAt, now, hb, early)
}

// nextBeat reports whether the beat of period d anchored at *anchor is due
// at now (early at most), and if so moves the anchor: to the beat, or to
// now when it is more than d late.
func nextBeat(anchor *time.Time, now time.Time, d, early time.Duration) bool {
	next := anchor.Add(d)
	if now.Before(next.Add(-early)) {
		return false
	}
	if now.Sub(next) > d {
		*anchor = now
	} else {
		*anchor = next
	}
	return true
}

// loadBeat reports whether the pool's load beat is due at now (between
// heartbeats; Settings.LoadBeat), and if so moves its anchor. Load beats
// fall on the heartbeat's grid (the heartbeat's time + k x LoadBeat, a
// tenth early at most), so that beats of both kinds are evenly spaced;
// one missed is skipped, not caught up.
func (p *pool) loadBeat(now time.Time) bool {
	lb := p.settings.LoadBeat
	if lb <= 0 || lb >= p.settings.Heartbeat || !p.published {
		return false
	}
	return onGrid(&p.loadAt, p.beatAt, now, lb)
}

// onGrid reports whether a point of the grid of period d from the
// heartbeat at beatAt is due at now (a tenth of d early at most), and if so
// moves *anchor, the last point taken, to the latest point due: one missed
// is skipped, not caught up.
func onGrid(anchor *time.Time, beatAt, now time.Time, d time.Duration) bool {
	if anchor.Before(beatAt) {
		*anchor = beatAt // a heartbeat came: the grid starts from it
	}
	next := anchor.Add(d)
	early := now.Add(d / 10)
	if early.Before(next) {
		return false
	}
	*anchor = next.Add(early.Sub(next) / d * d) // the latest grid point due
	return true
}

// RuleTick is the longest time between two evaluations of a pool's rules
// by EvaluateDue when the pool has no load beats (with load beats, they
// are its rule ticks): what time alone decides (open_until passing, a
// weight's step, an expiry) waits for it.
const RuleTick = 250 * time.Millisecond

// ruleTick reports whether EvaluateDue should apply the pool's rules at
// now although neither beat is due: never with load beats (they are the
// rule ticks), else on a grid of min(Heartbeat, RuleTick) from the
// heartbeat, a tenth early at most.
func (p *pool) ruleTick(now time.Time) bool {
	hb := p.settings.Heartbeat
	if lb := p.settings.LoadBeat; lb > 0 && lb < hb {
		return false
	}
	return onGrid(&p.ruleAt, p.beatAt, now, min(hb, RuleTick))
}

// phase is a pool's offset within a period: FNV-1a of its id, mixed
// (ids that differ in their last characters differ in the low bits only),
// modulo d.
func phase(id string, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * 1099511628211
	}
	h ^= h >> 33 // murmur3's finalizer
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return time.Duration(h % uint64(d))
}

// Resync asks for a snapshot of pool at the next Evaluate, as if its
// heartbeat were due (its heartbeats keep their grid): routers that
// missed frames of the compact feed ask for one (fw.resync.<pool>), whose
// key frame brings every load again. It reports whether the pool is known.
func (a *Analyzer) Resync(poolID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil || !p.published {
		return false
	}
	p.resync = true
	return true
}

// Beat returns how soon a caller that evaluates on the beat alone should
// call Evaluate again for the pool: its load beat (Settings.LoadBeat) when
// it is on and shorter than its heartbeat, else its heartbeat. 0 for an
// unknown pool.
func (a *Analyzer) Beat(poolID string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil {
		return 0
	}
	if lb := p.settings.LoadBeat; lb > 0 && lb < p.settings.Heartbeat {
		return lb
	}
	return p.settings.Heartbeat
}

// advance moves every window of the pool to now and refreshes the views.
func (p *pool) advance(now time.Time) {
	for _, b := range p.sorted() {
		b.win.advance(b.win.bucketOf(now))
		b.view = b.win.stats()
	}
}

// decisions writes the pool's decision keys at now, sorted by backend, into dst's
// storage and returns them.
func (a *Analyzer) decisions(p *pool, dst []decisionKey, now time.Time) []decisionKey {
	dst = dst[:0]
	for _, b := range p.sorted() {
		dst = append(dst, decisionKey{backend: b.id, state: b.state, weight: b.weight, reason: b.reason(), drift: b.drift, openUntil: b.openUntil,
			override: a.overrideKeyOf(p.id, b.id, now)})
	}
	return dst
}
