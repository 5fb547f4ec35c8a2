// Package p2c is fleetwatch's router-side picker: weighted power-of-two-choices
// load balancing over a pool's decision snapshot, with prefix affinity,
// failover, shedding and a retry budget.
//
// The algorithm is the seed article's pick (two random candidates, the lower
// score wins; Mitzenmacher, "The Power of Two Choices in Randomized Load
// Balancing", IEEE TPDS 2001), extended the way tower's p2c balancer and
// grpc-go's weighted balancers are: the candidates are distinct and
// sampled with probability proportional to the snapshot's weight, from a
// cumulative weight table built once per snapshot and binary-searched per
// pick; the number of candidates compared is a setting (Settings.Choices:
// 3 by default, 2 beyond 16 routers). Up to 8 routers
// (Settings.ScanRouters) a pick compares every candidate instead: with
// few routers a router's own counts and the published loads are close to
// exact, and sampling three of a larger pool lost to a least-connections
// scan at the tail (docs/EVALUATION.md, "Pools larger than the choices").
// The score is
// pluggable (Score); the default, LoadScore, ranks by the backend's load as
// the snapshot publishes it plus R times the router's own change since the
// snapshot (R the routers sharing the pool), and by the router's own
// in-flight count when the snapshot has no load or counts this router
// alone; in the simulator the seed's
// (inFlight+1) x EWMA(TTFT), which counts the queue twice, lost to
// in-flight counting in every steady state (docs/EVALUATION.md). A
// slow-outlier guard keeps the
// latency signal where it pays: a candidate whose EWMA has reached five
// times the pool median has its score scaled by the excess.
//
// Affinity uses rendezvous (highest-random-weight) hashing (Thaler and
// Ravishankar, "Using Name-Based Mappings to Increase Hit Rates", 1998), so
// removing one backend moves only the prefixes it held; the sticky backend
// is kept under the seed's tolerance rule (EWMA below 2.5 x the median) and
// a load bound, consistent hashing with bounded loads (Mirrokni, Thorup and
// Zadimoghaddam, SODA 2018). The retry budget is a token bucket in the
// manner of Finagle's RetryBudget: every first attempt deposits a fraction
// of a token, every retry withdraws a whole one.
//
// Failover mode judges a tier (the backends of one priority that are not
// open) by its weights, not by whether it has a backend. Tiers are taken
// lowest priority number first; a tier whose total weight is W receives the
// share min(W, 1) of the traffic that the tiers before it left, so a
// healthy tier (W >= 1) takes everything left, a tier whose only usable
// backend is half-open (W = 0.05) takes a 5% trickle and passes the other
// 95% on, and a quarantined or throttled-to-zero tier (W = 0) passes
// everything on. When even the last tier leaves traffic over (every tier
// below 1), the shares are normalised; when every tier has weight 0 the
// lowest one is spread equally rather than send nothing. A request first
// draws its tier by these shares, then two choices by weight within it;
// affinity holds within the tier with the largest share.
//
// The package is pure: it imports only the module root, takes randomness as
// a parameter and reads the clock through Settings.Now. Discovery (the
// snapshot, swapped atomically by Update), load (the router's own in-flight
// count per backend, and the published load with the count at the
// snapshot) and choice (Pick) are kept apart, and Pick does not allocate.
//
// The retry budget is the snapshot's fleet-wide one when it carries
// retry_budget (free while the pool has spare capacity, else a share of
// the fleet's rate per router), the router's own otherwise.
//
// Shadow mode (shadow.go): a snapshot whose shadow field is "breakers" or
// "observe" is advisory. The picker follows ShadowView of it (the breakers
// only, or nothing but an operator's overrides), picks on the full
// decisions too from the same random draws, and counts the picks that
// differ (ShadowStats), so that a team can see what fleetwatch would have
// done before it lets fleetwatch do it.
//
// Load is counted the way grpc-go's balancers count it: Pick counts the
// request in flight on the backend it returns, and the returned Choice is the
// one way to finish it (Choice.Done). There is no separate start call to
// forget, and a second Done on the same Choice does nothing.
package p2c

import (
	"errors"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Errors Pick returns.
var (
	// ErrNoBackends: the pool has no backend (or no snapshot was applied).
	ErrNoBackends = errors.New("p2c: no backends in the pool")
	// ErrShed: every backend is open and the pool's all_open policy is shed.
	// Fail the request fast; do not retry it against the same pool.
	ErrShed = errors.New("p2c: every backend is open; shedding the request (all_open=shed)")
	// ErrRetryBudget: the request is a retry and the retry budget is spent.
	ErrRetryBudget = errors.New("p2c: retry budget exhausted")
)

// Defaults of Settings.
const (
	DefaultLocalAlpha = 0.2
	// DefaultSlowOutlierFactor is Settings.SlowOutlierFactor's default.
	DefaultSlowOutlierFactor = 5.0
	// DefaultAffinityLoadFactor is Settings.AffinityLoadFactor's default.
	DefaultAffinityLoadFactor = 1.5
	DefaultRetryRatio         = 0.2
	DefaultRetryFloorPerSec   = 3.0
	// DefaultChoices and DefaultChoicesMany are Settings.Choices'
	// defaults: 3 while the snapshot counts at most 16 routers, 2 beyond
	// (docs/EVALUATION.md, "The load score": 3 choices had the lower p99
	// up to 16 routers; at 64 they herded, 2 did not).
	DefaultChoices     = 3
	DefaultChoicesMany = 2
	// DefaultScanRouters is Settings.ScanRouters' default: up to 8
	// routers, a fresh pick compares every candidate. Sampling three of
	// a pool of 16 or 64 backends left most idle backends out of most
	// comparisons: p99 TTFT 1.2-2x least-connections' at 1 to 8 routers,
	// where comparing all of them was within a few percent of it or
	// under; at 16 routers the scan herded and three choices were best
	// (docs/EVALUATION.md, "Pools larger than the choices").
	DefaultScanRouters = 8
	// ScanMax bounds the candidates a scanning pick compares: in a larger
	// pool, a run of ScanMax consecutive entries from a random start.
	ScanMax = 64
	// DefaultLoadStale is Settings.LoadStale's default.
	DefaultLoadStale = 2 * time.Second
	// DefaultTTL is the staleness horizon used when a snapshot carries no
	// ttl_ms (DESIGN.md's analyzer.ttl default).
	DefaultTTL = fleetwatch.DefaultSnapshotTTL
)

// Rand is the source of randomness Pick uses. *math/rand/v2.Rand and
// rand.PCG satisfy it. Pick calls Uint64 two or three times per request; a
// Rand is not required to be safe for concurrent use, so give each goroutine
// its own (or guard a shared one).
type Rand interface{ Uint64() uint64 }

// Settings configure a Picker. The zero value works.
type Settings struct {
	// Score ranks a candidate; lower is better. If unset, DefaultScore is
	// used (the simulator's winner; see docs/EVALUATION.md).
	Score Score
	// CostWeightPerMs is the exchange rate between money and milliseconds
	// in the score's cost term: cost_per_mtok / CostWeightPerMs is added in
	// ms. If zero, +Inf is used (pure latency routing; cost ignored). The
	// configuration sets it per pool as ms_per_cost_unit, its inverse
	// (docs/CONFIG.md).
	CostWeightPerMs float64
	// AffinityTolerance keeps a request on the backend holding its prefix
	// while that backend's EWMA TTFT is below this multiple of the pool
	// median. If zero, the snapshot's affinity_tolerance is used, or
	// fleetwatch.DefaultAffinityTolerance (2.5) when the snapshot has none.
	AffinityTolerance float64
	// AffinityLoadFactor bounds the load a prefix may pile onto its sticky
	// backend: the sticky backend is kept only while the router's in-flight
	// count on it is below ceil(AffinityLoadFactor x (total in flight + 1)
	// / candidates), consistent hashing with bounded loads (Mirrokni,
	// Thorup and Zadimoghaddam, SODA 2018). It catches what the EWMA rule
	// sees only a heartbeat later: a queue building on the sticky backend.
	// If zero, 1.5 is used; a negative value disables the bound.
	AffinityLoadFactor float64
	// SlowOutlierFactor is the outlier guard of the two-choice comparison:
	// a candidate whose EWMA TTFT has reached this multiple of the pool
	// median has its score multiplied by EWMA / (factor x median) (see
	// docs/EVALUATION.md for why). If zero, 5 is used (the analyzer's
	// slow_factor default); a negative value turns the guard off.
	SlowOutlierFactor float64
	// LocalAlpha is the weight of the newest sample in the router's own
	// EWMA of TTFT. If zero, 0.2 is used (the seed's alpha).
	LocalAlpha float64
	// Choices is how many distinct candidates a pick samples by weight and
	// compares by score on a fresh snapshot. If zero: every candidate
	// (a scan, see ScanRouters) while the snapshot counts 1 to
	// ScanRouters routers, 3 up to 16 routers and 2 beyond
	// (DefaultChoices, DefaultChoicesMany). Values above 8 are 8; 1 is
	// weighted random. The stale path always compares two.
	Choices int
	// ScanRouters is the most routers a snapshot may count for a fresh
	// pick with Choices zero to compare every candidate of the drawn tier
	// instead of sampling some: each backend with the tier's largest
	// weight, and each down-weighted one with probability weight /
	// largest weight (as a sampled candidate after the first), at most
	// ScanMax of them (a run of consecutive entries from a random
	// start); a tie goes to one of the tied at random. An idle
	// down-weighted backend thus wins weight / largest weight of the
	// picks whatever the pool's size: a half-open one its 5% trickle,
	// and one whose every answer is an instant failure, which leaves it
	// idle, as much (TestScanDownWeighted). If zero or negative,
	// DefaultScanRouters (8). (A negative value kept the sampled choices
	// of before 2026-12-05 until 2026-12-06; their figures are in
	// docs/EVALUATION.md "Pools larger than the choices".)
	ScanRouters int
	// LoadStale is how old a backend's published load may be (its age_ms
	// at the snapshot plus the time since the snapshot) before a
	// load-aware score (Score.FleetLoad) counts the backend by R x the
	// router's own in-flight count instead. Before that, the published
	// estimate is blended with that local one, its share decaying as
	// exp(-age / LoadStale). If zero, 2s is used; a negative value never
	// discards or discounts a published load.
	LoadStale time.Duration
	// RunningWeight is how much a published load's running sequences
	// count in a load-aware score, its waiting requests counting 1: the
	// published load is waiting + RunningWeight x running. If zero, 1 is
	// used (running + waiting); a negative value counts waiting requests
	// only. An experiment, not the default: in the simulator, whose
	// backends start a new prompt at once while a slot is free, 0.25 cut
	// the p99 of sparse pools behind 4-8 routers by 4-15% (docs/EVALUATION.md
	// "Pools larger than the choices"); a real server's running decodes
	// slow a new prompt's prefill, which the model leaves out.
	RunningWeight float64
	// RetryRatio is the share of first attempts that may be retried. If
	// zero, 0.2 is used. A negative value disables the budget (unlimited
	// retries; for comparison runs only). The per-router budget applies
	// while the snapshot carries no retry_budget or is stale; a fresh
	// snapshot's retry_budget replaces it (see Pick).
	RetryRatio float64
	// RetryFloorPerSec is the retry allowance per second that does not
	// depend on traffic, so a quiet router can still retry. If zero, 3 is
	// used.
	RetryFloorPerSec float64
	// Now is the clock, read once per Pick and used for staleness and the
	// retry budget (and by Done when an outcome moves a local breaker). If
	// nil, time.Now is used.
	Now func() time.Time

	// The local breaker (breaker.go) keeps a backend that fails at once
	// from winning every comparison while the feed is stale: it is
	// consulted only on the stale path, before the first snapshot or when
	// the last one is older than its ttl_ms.

	// LocalFailures is how many failures in a row (error, timeout or
	// throttled outcomes) open a backend's local breaker. If zero, 5; a
	// negative value disables the local breaker.
	LocalFailures int
	// LocalOpen is how long the local breaker stays open on its first
	// trip; the n-th trip in a row opens it for n x LocalOpen. If zero,
	// 10s.
	LocalOpen time.Duration
	// LocalOpenMax caps the open time. If zero, 1 minute.
	LocalOpenMax time.Duration
	// LocalTrickle is the weight of a backend whose local breaker is
	// half-open (its open time has passed), against 1 for a closed one. If
	// zero, 0.05 (the analyzer's half_open_weight default).
	LocalTrickle float64
	// LocalSuccesses is how many ok outcomes in a row close a tripped
	// local breaker. If zero, 3.
	LocalSuccesses int
}

// Request describes what is being routed.
type Request struct {
	// Prefix is the hash of the request's shared prefix (system prompt);
	// only used when HasPrefix is set.
	Prefix    uint64
	HasPrefix bool
	// Exclude names a backend already tried by this request; it is not
	// chosen again unless it is the only candidate. A non-empty Exclude
	// marks the request as a retry.
	Exclude string
	// Retry marks a retry of a failed attempt even without Exclude. Retries
	// withdraw from the retry budget; first attempts deposit into it.
	Retry bool
	// Among, when not empty, restricts the pick to these backend ids (an
	// endpoint subset the caller can reach); ids the snapshot does not name
	// are ignored, and at most ScanMax are considered. Avoid lists backends
	// never to choose (the earlier endpoints of an ordered fallback list);
	// unlike Exclude it does not mark a retry, and an avoided backend is not
	// chosen even when nothing else is left. Either takes the restricted
	// path of among.go, which may return ErrNoCandidates, and allocates
	// nothing.
	Among, Avoid []string
}

// Choice is the backend Pick (or Choose) chose, and the handle that finishes
// the request: the request is counted in flight on Backend from the pick
// until Done is called on the Choice.
//
// Keep the Choice where the request is tracked and call Done through a
// pointer to it: Done clears the Choice, so a second Done on it is a no-op.
// A copy of a Choice is a second handle on the same request; finishing both
// would finish the request twice. The picker never lets a count drop below
// zero and counts the Done calls that tried (Picker.UnbalancedDone), which a
// correct program keeps at 0.
type Choice struct {
	Backend string // the backend id
	Index   int    // its index in the snapshot's Backends
	Sticky  bool   // chosen by prefix affinity rather than by two choices

	picker *Picker
	local  *local // nil once Done
}

// Done finishes the request: the backend's in-flight count goes down and,
// for an ok, non-cold outcome, ttftMs feeds the router's local EWMA (an
// instant error must never look fast). Call it once the answer is complete,
// failed or abandoned; for a pick that was never sent, report
// fleetwatch.OutcomeCanceled. Done zeroes the Choice (read Backend before),
// so Done on a finished or zero Choice does nothing.
// Done is safe to call concurrently with the picker's other methods, but not
// concurrently with itself on the same Choice.
func (c *Choice) Done(outcome fleetwatch.Outcome, ttftMs float64, cold bool) {
	l, p := c.local, c.picker
	if l == nil {
		return
	}
	*c = Choice{}
	p.finish(l, outcome, ttftMs, cold)
}

// Picker chooses backends for one pool. All methods are safe for concurrent
// use; Pick, Choose and Choice.Done take no lock.
type Picker struct {
	score Score
	// inFlightRank: score.Rank is inFlightRank (the in-flight and load
	// scores), which scoreOf computes inline.
	inFlightRank bool
	costWeight   float64
	tolerance    float64      // 0: from the snapshot
	loadFactor   float64      // <= 0: no bound
	slowFactor   float64      // <= 0: no outlier guard
	total        atomic.Int64 // requests in flight over all backends
	unbalanced   atomic.Int64 // Done calls that found a count at zero
	alpha        float64
	now          func() time.Time
	budget       *Budget
	unbudgeted   bool
	choices      int
	scanRouters  int           // Settings.ScanRouters with its default
	loadStale    time.Duration // < 0: a published load never goes stale
	runningW     float64       // Settings.RunningWeight with its default; 0: waiting only
	decay        decayTable    // exp(-d / loadStale), when loadStale > 0
	// fleet is this router's share of the snapshot's fleet-wide retry
	// budget: it accrues retry_budget.per_sec / routers a second.
	fleet *Budget
	// The local breaker's settings; localFailures <= 0 disables it.
	localFailures  int32
	localSuccesses int32
	localOpen      time.Duration
	localOpenMax   time.Duration
	localTrickle   float64
	tripped        atomic.Int64 // backends whose local breaker is not closed
	state          atomic.Pointer[state]
	updateMu       sync.Mutex // serialises Update, which carries locals over
	// Shadow mode's counts (shadow.go), and the replayed random sources
	// of its two picks per request.
	shadowPicks    atomic.Uint64
	shadowDiffered atomic.Uint64
	shadowExcluded [numExcl]atomic.Uint64
	replays        sync.Pool // *replayRand
}

// New returns a Picker with no snapshot; Pick returns ErrNoBackends until
// Update is called.
func New(s Settings) *Picker {
	p := &Picker{
		score:      s.Score,
		costWeight: s.CostWeightPerMs,
		tolerance:  s.AffinityTolerance,
		loadFactor: s.AffinityLoadFactor,
		slowFactor: s.SlowOutlierFactor,
		alpha:      s.LocalAlpha,
		now:        s.Now,
	}
	if p.score.Rank == nil {
		p.score = DefaultScore
	}
	p.inFlightRank = reflect.ValueOf(p.score.Rank).Pointer() == reflect.ValueOf(inFlightRank).Pointer()
	p.choices = min(max(s.Choices, 0), maxChoices) // 0: by the snapshot's routers
	p.scanRouters = s.ScanRouters
	if p.scanRouters <= 0 {
		p.scanRouters = DefaultScanRouters
	}
	p.loadStale = s.LoadStale
	switch p.runningW = s.RunningWeight; {
	case p.runningW == 0:
		p.runningW = 1
	case p.runningW < 0:
		p.runningW = 0
	}
	if p.loadStale == 0 {
		p.loadStale = DefaultLoadStale
	}
	p.decay = newDecayTable(p.loadStale)
	if p.costWeight == 0 {
		p.costWeight = math.Inf(1)
	}
	if p.alpha == 0 {
		p.alpha = DefaultLocalAlpha
	}
	if p.slowFactor == 0 {
		p.slowFactor = DefaultSlowOutlierFactor
	}
	if p.loadFactor == 0 {
		p.loadFactor = DefaultAffinityLoadFactor
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.localFailures, p.localSuccesses = int32(s.LocalFailures), int32(s.LocalSuccesses)
	p.localOpen, p.localOpenMax, p.localTrickle = s.LocalOpen, s.LocalOpenMax, s.LocalTrickle
	if p.localFailures == 0 {
		p.localFailures = DefaultLocalFailures
	}
	if p.localSuccesses <= 0 {
		p.localSuccesses = DefaultLocalSuccesses
	}
	if p.localOpen <= 0 {
		p.localOpen = DefaultLocalOpen
	}
	if p.localOpenMax <= 0 {
		p.localOpenMax = DefaultLocalOpenMax
	}
	p.localOpenMax = max(p.localOpenMax, p.localOpen)
	if !(p.localTrickle > 0) {
		p.localTrickle = DefaultLocalTrickle
	}
	p.localTrickle = min(p.localTrickle, 1)
	ratio, floor := s.RetryRatio, s.RetryFloorPerSec
	if ratio < 0 {
		p.unbudgeted = true
	}
	if ratio == 0 {
		ratio = DefaultRetryRatio
	}
	if floor == 0 {
		floor = DefaultRetryFloorPerSec
	}
	p.budget = NewBudget(ratio, floor, p.now)
	p.fleet = NewBudget(0, 0, p.now)
	p.replays.New = func() any { return new(replayRand) }
	return p
}

// Budget returns the picker's per-router retry budget (for metrics, or for
// callers that retry through other means).
func (p *Picker) Budget() *Budget { return p.budget }

// FleetBudget returns the router's share of the fleet-wide retry budget the
// snapshots carry (see Pick); its Balance is the retries it may make now
// while the pool has no spare capacity.
func (p *Picker) FleetBudget() *Budget { return p.fleet }

// maxChoices bounds Settings.Choices. Beyond fleetwatch.ManyRouters
// routers the default is DefaultChoicesMany.
const maxChoices = 8

// local is what one router knows about one backend by itself.
type local struct {
	inFlight atomic.Int64
	ewmaBits atomic.Uint64 // math.Float64bits of the EWMA; 0 = no sample yet
	// The local breaker (breaker.go).
	openUntil atomic.Int64 // unix ns; 0: closed; open before it, half-open after
	fails     atomic.Int32 // failures in a row
	oks       atomic.Int32 // ok outcomes in a row while not closed
	trips     atomic.Int32 // trips in a row since the breaker last closed
	// marks are the in-flight counts at the last snapshots applied, with
	// their at (unix ns), the newest at marks[(next-1)%len(marks)]; kept
	// under Picker.updateMu.
	marks *[8]mark
	next  int
}

// mark is a backend's in-flight count at a snapshot's at.
type mark struct{ at, n int64 }

// baselineAt records n as the count at the snapshot taken at, and returns
// the count at the first snapshot recorded at or after reportAt (the
// oldest recorded when all are after it; n when none is).
func (l *local) baselineAt(at, n, reportAt int64) int64 {
	if l.marks == nil {
		l.marks = new([8]mark)
	}
	l.marks[l.next%len(l.marks)] = mark{at, n}
	l.next++
	base := n
	for k := 1; k <= min(l.next, len(l.marks)); k++ {
		m := l.marks[(l.next-k)%len(l.marks)]
		if m.at < reportAt {
			break
		}
		base = m.n
	}
	return base
}

func (l *local) ewma() (float64, bool) {
	b := l.ewmaBits.Load()
	return math.Float64frombits(b), b != 0
}

func (l *local) observe(ttftMs, alpha float64) {
	for {
		old := l.ewmaBits.Load()
		v := ttftMs
		if old != 0 {
			v = alpha*ttftMs + (1-alpha)*math.Float64frombits(old)
		}
		nb := math.Float64bits(v)
		if nb == 0 {
			nb = math.Float64bits(math.SmallestNonzeroFloat64)
		}
		if l.ewmaBits.CompareAndSwap(old, nb) {
			return
		}
	}
}

// start counts a request in flight on entry i and returns its handle.
func (p *Picker) start(st *state, i int, sticky bool) Choice {
	e := &st.entries[i]
	e.local.inFlight.Add(1)
	p.total.Add(1)
	return Choice{Backend: e.id, Index: i, Sticky: sticky, picker: p, local: e.local}
}

// finish is Choice.Done.
func (p *Picker) finish(l *local, outcome fleetwatch.Outcome, ttftMs float64, cold bool) {
	if l.inFlight.Add(-1) < 0 {
		// A copied Choice finished twice: undo, and count the misuse.
		l.inFlight.Add(1)
		p.unbalanced.Add(1)
	} else {
		p.total.Add(-1)
	}
	if p.localFailures > 0 {
		p.localOutcome(l, outcome)
	}
	if outcome == fleetwatch.OutcomeOK && !cold && ttftMs >= 0 && !math.IsNaN(ttftMs) && !math.IsInf(ttftMs, 0) {
		l.observe(ttftMs, p.alpha)
	}
}

// Choose returns a Choice for the named backend of the applied snapshot,
// counted in flight like a pick, for a caller that decided by other means (a
// third attempt that must go to a backend not tried yet, a policy of its
// own). It bypasses the breakers, the sampling and the retry budget. It
// returns ErrNoBackends when the snapshot has no such backend.
func (p *Picker) Choose(backend string) (Choice, error) {
	st := p.state.Load()
	if st == nil {
		return Choice{}, ErrNoBackends
	}
	i, ok := st.byID[backend]
	if !ok {
		return Choice{}, ErrNoBackends
	}
	return p.start(st, i, false), nil
}

// Compared returns how many candidates a fresh pick compares under the
// applied snapshot: the backends with a weight (at most ScanMax) while it
// scans (Settings.ScanRouters), else the sampled choices; 0 before the
// first snapshot, and when every backend is open and the pool sheds. In
// failover mode it counts the tier with the largest share.
func (p *Picker) Compared() int {
	st := p.state.Load()
	switch {
	case st == nil || (st.allOpen && st.shed):
		return 0
	case st.scan && st.allOpen:
		return min(st.spread.positive, ScanMax)
	case st.scan:
		return min(st.fresh.positive, ScanMax)
	}
	return st.choices
}

// UnbalancedDone returns how many Choice.Done calls found their backend's
// in-flight count already at zero: a copy of a Choice finished after the
// original. It is 0 in a correct program.
func (p *Picker) UnbalancedDone() int64 { return p.unbalanced.Load() }

// InFlight returns the router's own in-flight count for backend.
func (p *Picker) InFlight(backend string) int {
	if l := p.lookup(backend); l != nil {
		return int(l.inFlight.Load())
	}
	return 0
}

func (p *Picker) lookup(backend string) *local {
	st := p.state.Load()
	if st == nil {
		return nil
	}
	return st.locals[backend]
}
