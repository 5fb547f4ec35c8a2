package p2c

import (
	"math"
	"math/bits"

	"github.com/fleetwatch/fleetwatch"
)

// Pick chooses a backend for req.
//
// With a fresh snapshot: open backends are never candidates; in failover
// mode the request first draws a tier by the tiers' shares (see the package
// doc: a tier of total weight W < 1 gets a share W, the next tiers the
// rest). A request
// with a prefix goes to its sticky backend (rendezvous hashing over the
// closed candidates with weight > 0, through a slot table; see affinity.go) while that backend's EWMA TTFT is below
// the affinity tolerance times the pool median. Otherwise, while the
// snapshot counts 1 to Settings.ScanRouters routers (8 by default), every
// candidate is compared (at most ScanMax; a down-weighted one joins with
// probability weight / largest weight) and the lowest score wins, a tie
// at random. With more routers (or none counted yet), Settings.Choices
// distinct candidates (3 by default, 2 beyond 16 routers) are sampled with
// probability proportional to their weight (a weight of 0 is never
// sampled; a down-weighted one after the first joins the comparison with
// probability weight / largest weight) and the one with the lowest score
// wins, ties to the first sampled. When every backend is open, Pick returns ErrShed
// (all_open=shed) or ignores the breakers (all_open=spread).
//
// With a stale snapshot (now after at + ttl_ms) the picker fails static:
// breakers whose open_until is still in the future stay honoured, every
// other backend is a candidate with equal weight, and the router's own EWMA
// is preferred over the snapshot's. The router's local breakers (see
// breaker.go and Settings.LocalFailures) then weigh the candidates: 0 while
// a backend's is open, the trickle while half-open, 1 closed; in failover
// mode the tiers follow the fresh path's rule over these weights. When
// every candidate's local breaker is open they are ignored. Affinity then uses the same slots over
// these candidates (not in failover mode, where the lowest priority's
// candidates are balanced by a scan of the pool: a degraded mode).
//
// A retry (req.Exclude or req.Retry set) is free while a fresh snapshot's
// retry_budget says the pool has spare capacity; otherwise it withdraws a
// token from the router's share of that fleet-wide budget, or, with a stale
// snapshot or one without retry_budget, from the router's own budget, and
// fails with ErrRetryBudget when none is left. A first attempt deposits
// into the router's own budget. Pick does not allocate.
//
// With a snapshot in shadow mode (its shadow field "breakers" or
// "observe") Pick follows ShadowView of it and counts what the full
// decisions would have done differently (see ShadowStats and shadow.go).
//
// The request is counted in flight on the chosen backend until Done is
// called on the returned Choice; on an error nothing is counted.
func (p *Picker) Pick(r Rand, req Request) (Choice, error) {
	st := p.state.Load()
	if st == nil || len(st.entries) == 0 {
		return Choice{}, ErrNoBackends
	}
	nowT := p.now()
	now := nowT.UnixNano()
	fresh := now < st.staleAt.Load()
	if !p.unbudgeted {
		if req.Retry || req.Exclude != "" {
			allowed := true
			switch {
			case fresh && st.retryFree:
				// The pool has spare capacity: retries are free.
			case fresh && st.retryFleet:
				allowed = p.fleet.withdrawAt(nowT)
			default:
				allowed = p.budget.withdrawAt(nowT)
			}
			if !allowed {
				return Choice{}, ErrRetryBudget
			}
		} else {
			p.budget.depositAt(nowT)
		}
	}
	ex := -1
	if req.Exclude != "" {
		if i, ok := st.byID[req.Exclude]; ok {
			ex = i
		}
	}
	if req.restricted() {
		i, sticky, err := p.pickAmong(st, r, req, ex, now, fresh)
		if err != nil {
			return Choice{}, err
		}
		return p.start(st, i, sticky), nil
	}
	if st.full != nil {
		return p.pickShadow(st, r, req, ex, now, fresh)
	}
	var (
		i      int
		sticky bool
		err    error
	)
	if fresh {
		i, sticky, err = p.pickFresh(st, r, req, ex, now)
	} else {
		i, sticky, err = p.pickStale(st, r, req, ex, now)
	}
	if err != nil {
		return Choice{}, err
	}
	return p.start(st, i, sticky), nil
}

func (p *Picker) pickFresh(st *state, r Rand, req Request, ex int, now int64) (int, bool, error) {
	tbl := &st.fresh
	k := st.affinityTier
	if st.allOpen {
		if st.shed {
			return -1, false, ErrShed
		}
		tbl = &st.spread
	} else {
		if len(st.tiers) > 1 {
			// Failover with a trickle tier: the tier first, by its share.
			k = st.tierOf(unitFloat(r.Uint64()))
			tbl = &st.tiers[k].tbl
		}
		// The sticky backend of a retry that already failed there is not
		// sticky; the retry goes through two choices.
		if req.HasPrefix && k == st.affinityTier {
			if i := st.affinity.lookup(req.Prefix); i >= 0 && i != ex && p.keepSticky(st, i, len(st.sticky), false) {
				return i, true, nil
			}
		}
	}
	if st.scan {
		if i := p.scanBest(st, tbl, r, ex, now); i >= 0 {
			return i, false, nil
		}
		// Nothing in the drawn tier but the excluded backend: the
		// sampling below tries the other tiers.
	}
	u := r.Uint64()
	a := tbl.sample(u, ex, -1)
	for j := 0; a < 0 && j < len(st.tiers); j++ {
		// The drawn tier holds only the backend this retry excludes:
		// another tier, lowest priority first.
		if j != k {
			if a = st.tiers[j].tbl.sample(u, ex, -1); a >= 0 {
				tbl = &st.tiers[j].tbl
			}
		}
	}
	if a < 0 {
		if ex >= 0 && tbl.weight(ex) > 0 {
			return ex, false, nil // the tried backend is the only candidate
		}
		return -1, false, ErrNoBackends
	}
	// The other choices: distinct from a, from each other and from ex.
	var (
		cands [maxChoices]int
		skip  = [maxChoices + 1]int{a, ex}
	)
	cands[0] = a
	n, nskip := 1, 2
	for k := 1; k < st.choices; k++ {
		b := tbl.sampleSkip(r.Uint64(), skip[:nskip])
		if b < 0 {
			break
		}
		skip[nskip] = b
		nskip++
		// A down-weighted candidate after the first joins the comparison
		// only with probability weight/maxWeight. Otherwise, in a pool of
		// two, the distinct second draw would always be the half-open
		// backend and its empty queue (an instant failure has no
		// in-flight time) would win every comparison: weights would mean
		// nothing.
		if w := tbl.weight(b); w < tbl.maxWeight && unitFloat(r.Uint64())*tbl.maxWeight >= w {
			continue
		}
		cands[n] = b
		n++
	}
	if n == 1 {
		return a, false, nil
	}
	return p.best(st, cands[:n], false, now), false, nil
}

// scanBest returns the lowest-scoring candidate of tbl other than ex,
// comparing every one (Settings.ScanRouters): each entry with the largest
// weight, and a down-weighted one with probability weight / largest weight,
// as a sampled candidate after the first. A tie goes to one of the tied
// candidates at random. In a pool of more than ScanMax it compares a run of
// ScanMax consecutive entries from a random start. -1 when no entry with a
// positive weight is left.
func (p *Picker) scanBest(st *state, tbl *table, r Rand, ex int, now int64) int {
	n := len(tbl.cum)
	start := uniformInt(r.Uint64(), n)
	// fill scores a candidate with no TTFT estimate at all (no EWMA and no
	// pool median), as best does: the first known estimate among the
	// candidates, or 1.
	median := st.med()
	fill := median
	if math.IsNaN(fill) {
		fill = p.firstEstimate(st, tbl, start, ex)
	}
	best, bestScore, ties := -1, 0.0, 0
	decay := math.NaN() // the candidates' shared decay since the snapshot (see loadDecayed)
	// fast: the default load score, which the loop computes inline with
	// the same operations as scoreOf and loadDecayed (so the same bits),
	// its pick-wide factors taken once: the decay since the snapshot and
	// the outlier guard's line (as slowPenalty).
	fast := p.inFlightRank && p.score.FleetLoad && !p.score.Weighted && p.loadStale > 0
	since := now - st.at
	if fast && since >= 0 {
		decay = p.decay.at(since)
	}
	line := p.slowFactor * median
	guard := p.slowFactor > 0 && !math.IsNaN(line)
	for k := range min(n, ScanMax) {
		i := start + k
		if i >= n {
			i -= n
		}
		w := tbl.weight(i)
		if w <= 0 || i == ex || (w < tbl.maxWeight && unitFloat(r.Uint64())*tbl.maxWeight >= w) {
			continue
		}
		e := p.ewmaFor(st, i, false)
		if math.IsNaN(e) {
			e = fill
		}
		var sc float64
		if fast {
			en := &st.entries[i]
			own := en.local.inFlight.Load()
			load := st.routers * float64(own)
			if pub := en.pub.pubLoad(); !math.IsNaN(pub) && now < en.pub.staleAt.Load() {
				est := max(0, pub+st.routers*float64(own-en.pub.atSnap.Load()))
				var wt float64
				if since >= 0 {
					wt = min(decay*en.pub.loadDecay(), 1)
				} else { // a snapshot from the future: the exact age
					wt = math.Exp(-max(float64(now-en.pub.loadAt.Load()), 0) / float64(p.loadStale))
				}
				load = wt*est + (1-wt)*load
			}
			sc = load + 1
			if en.costPerMs != 0 {
				sc += en.costPerMs / e
			}
			if guard && e >= line {
				sc *= e / line
			}
		} else {
			sc = p.scoreOf(st, i, e, false, now, &decay)
		}
		switch {
		case best < 0 || sc < bestScore:
			best, bestScore, ties = i, sc, 1
		case sc == bestScore:
			// A tie goes to each of the tied candidates with equal
			// probability (reservoir sampling of one).
			ties++
			if uniformInt(r.Uint64(), ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// firstEstimate is the first TTFT estimate known among the candidates
// scanBest compares from start, or 1: for a pool without a median.
func (p *Picker) firstEstimate(st *state, tbl *table, start, ex int) float64 {
	n := len(tbl.cum)
	for k := range min(n, ScanMax) {
		i := start + k
		if i >= n {
			i -= n
		}
		if i == ex || tbl.weight(i) <= 0 {
			continue
		}
		if e := p.ewmaFor(st, i, false); !math.IsNaN(e) {
			return e
		}
	}
	return 1
}

func (p *Picker) pickStale(st *state, r Rand, req Request, ex int, now int64) (int, bool, error) {
	m := st.staleCandidates(now)
	// local: some backend's local breaker is not closed, so the draws
	// weigh candidates by it (a rare, slower path).
	local := p.tripped.Load() > 0
	switch {
	case m == 0 && st.shed:
		return -1, false, ErrShed
	case m == 0:
		m = len(st.staleOrder) // all_open=spread: ignore the breakers
	case st.mode == fleetwatch.ModeFailover:
		if local {
			if i := p.pickStaleFailoverLocal(st, r, ex, m, now); i >= 0 {
				return i, false, nil
			}
		}
		return p.pickStaleFailover(st, r, ex, m)
	case req.HasPrefix:
		if i := st.rendezvousSlot(req.Prefix, st.staleOrder, m, ex); i >= 0 && p.keepSticky(st, i, m, true) &&
			(!local || p.localWeight(st, i, now) >= 1) {
			return i, true, nil
		}
	}
	exPos := -1
	if ex >= 0 && st.stalePos[ex] < m {
		exPos = st.stalePos[ex]
	}
	var a, b int
	if local {
		a = p.drawLocal(st, r, m, exPos, -1, now)
	} else {
		a = uniformSkip(r.Uint64(), m, exPos, -1)
	}
	if a < 0 {
		if exPos >= 0 {
			return ex, false, nil
		}
		return -1, false, ErrNoBackends
	}
	if local {
		b = p.drawLocal(st, r, m, exPos, a, now)
	} else {
		b = uniformSkip(r.Uint64(), m, exPos, a)
	}
	if b < 0 {
		return st.staleOrder[a], false, nil
	}
	ia, ib := st.staleOrder[a], st.staleOrder[b]
	if local {
		// As on the fresh path: a down-weighted (half-open) second
		// candidate joins the comparison only with probability wb/wa, or
		// its empty queue would win every one.
		if wa, wb := p.localWeight(st, ia, now), p.localWeight(st, ib, now); wb < wa && unitFloat(r.Uint64())*wa >= wb {
			return ia, false, nil
		}
	}
	return p.better(st, ia, ib, true, now), false, nil
}

// drawLocal draws a position of staleOrder[:m] other than s1 and s2 with
// probability proportional to its local breaker weight, by rejection; -1
// when none is left. After a run of rejections (most candidates tripped) it
// scans for a closed one, then a half-open one; when every candidate's
// local breaker is open it ignores them (never send nothing).
func (p *Picker) drawLocal(st *state, r Rand, m, s1, s2 int, now int64) int {
	for range 8 {
		pos := uniformSkip(r.Uint64(), m, s1, s2)
		if pos < 0 {
			return -1
		}
		w := p.localWeight(st, st.staleOrder[pos], now)
		if w >= 1 || (w > 0 && unitFloat(r.Uint64()) < w) {
			return pos
		}
	}
	for _, closedOnly := range [2]bool{true, false} {
		count := 0
		for pos := range m {
			if p.drawable(st, pos, s1, s2, closedOnly, now) {
				count++
			}
		}
		if count == 0 {
			continue
		}
		j := uniformInt(r.Uint64(), count)
		for pos := range m {
			if p.drawable(st, pos, s1, s2, closedOnly, now) {
				if j == 0 {
					return pos
				}
				j--
			}
		}
	}
	return uniformSkip(r.Uint64(), m, s1, s2)
}

// drawable reports whether position pos of staleOrder may be drawn: not s1
// or s2, and its local breaker closed (closedOnly) or not open.
func (p *Picker) drawable(st *state, pos, s1, s2 int, closedOnly bool, now int64) bool {
	if pos == s1 || pos == s2 {
		return false
	}
	w := p.localWeight(st, st.staleOrder[pos], now)
	return w >= 1 || (!closedOnly && w > 0)
}

// pickStaleFailover balances, with equal weights, over the lowest priority
// that has a candidate. It scans the pool: the stale path is a degraded mode.
func (p *Picker) pickStaleFailover(st *state, r Rand, ex, m int) (int, bool, error) {
	cands := st.staleOrder[:m]
	best := math.MaxInt
	for _, i := range cands {
		best = min(best, st.entries[i].priority)
	}
	count := 0
	for _, i := range cands {
		if st.entries[i].priority == best && i != ex {
			count++
		}
	}
	if count == 0 {
		return ex, false, nil // ex is the tier's only backend
	}
	nth := func(j int) int {
		for _, i := range cands {
			if st.entries[i].priority == best && i != ex {
				if j == 0 {
					return i
				}
				j--
			}
		}
		panic("p2c: candidate index out of range")
	}
	ja := uniformInt(r.Uint64(), count)
	a := nth(ja)
	if count == 1 {
		return a, false, nil
	}
	jb := uniformInt(r.Uint64(), count-1)
	if jb >= ja {
		jb++
	}
	return p.better(st, a, nth(jb), true, 0), false, nil
}

// pickStaleFailoverLocal is the stale failover pick while some local
// breaker is tripped: the failover rule of the fresh path (see the package
// doc) over the candidates' local breaker weights (1 closed, 0 open, the
// trickle half-open; the excluded backend counts 0), then two choices by
// those weights within the drawn tier. It returns -1 when every candidate
// weighs 0, for the caller to ignore the local breakers.
func (p *Picker) pickStaleFailoverLocal(st *state, r Rand, ex, m int, now int64) int {
	cands := st.staleOrder[:m]
	// tierWeight is the total local weight of priority prio's candidates.
	tierWeight := func(prio int) float64 {
		w := 0.0
		for _, i := range cands {
			if i != ex && st.entries[i].priority == prio {
				w += p.localWeight(st, i, now)
			}
		}
		return w
	}
	// next is the lowest priority above prev among the candidates.
	next := func(prev int, first bool) (int, bool) {
		best, found := 0, false
		for _, i := range cands {
			if pr := st.entries[i].priority; (first || pr > prev) && (!found || pr < best) {
				best, found = pr, true
			}
		}
		return best, found
	}
	sum, left := 0.0, 1.0
	for prio, ok := next(0, true); ok && left > 0; prio, ok = next(prio, false) {
		share := left * min(tierWeight(prio), 1)
		sum, left = sum+share, left-share
	}
	if sum <= 0 {
		return -1
	}
	x := unitFloat(r.Uint64()) * sum
	chosen := 0
	left = 1
	for prio, ok := next(0, true); ok && left > 0; prio, ok = next(prio, false) {
		share := left * min(tierWeight(prio), 1)
		left -= share
		if share > 0 {
			chosen = prio // the last tier with a share, should rounding leave x over
			if x < share {
				break
			}
		}
		x -= share
	}
	a := p.scanDraw(st, cands, chosen, ex, -1, unitFloat(r.Uint64()), now)
	if a < 0 {
		return -1
	}
	b := p.scanDraw(st, cands, chosen, ex, a, unitFloat(r.Uint64()), now)
	if b < 0 {
		return a
	}
	if wa, wb := p.localWeight(st, a, now), p.localWeight(st, b, now); wb < wa && unitFloat(r.Uint64())*wa >= wb {
		return a
	}
	return p.better(st, a, b, true, now)
}

// scanDraw draws one of cands with priority prio, other than ex and skip,
// with probability proportional to its local weight, from the unit draw u;
// -1 when none weighs more than 0.
func (p *Picker) scanDraw(st *state, cands []int, prio, ex, skip int, u float64, now int64) int {
	total := 0.0
	for _, i := range cands {
		if i != ex && i != skip && st.entries[i].priority == prio {
			total += p.localWeight(st, i, now)
		}
	}
	if total <= 0 {
		return -1
	}
	x, last := u*total, -1
	for _, i := range cands {
		if i != ex && i != skip && st.entries[i].priority == prio {
			if w := p.localWeight(st, i, now); w > 0 {
				if x < w {
					return i
				}
				x, last = x-w, i
			}
		}
	}
	return last // rounding
}

// ewmaFor is the TTFT estimate of entry i: with a fresh snapshot the feed's
// EWMA (it sees every router's traffic), else the router's own; with a stale
// one the router's own first. NaN when neither knows and the pool has no
// median.
func (p *Picker) ewmaFor(st *state, i int, stale bool) float64 {
	e := &st.entries[i]
	feed := e.pub.feedEWMA()
	if !stale && !math.IsNaN(feed) {
		return feed
	}
	if v, ok := e.local.ewma(); ok {
		return v
	}
	if !math.IsNaN(feed) {
		return feed
	}
	return st.med()
}

// better returns whichever of a and b scores lower, a on a tie.
func (p *Picker) better(st *state, a, b int, stale bool, now int64) int {
	pair := [2]int{a, b}
	return p.best(st, pair[:], stale, now)
}

// best returns the candidate that scores lowest, the earliest on a tie. A
// candidate with no TTFT estimate at all (no EWMA and no pool median) is
// scored with the first known estimate among the candidates, or 1.
func (p *Picker) best(st *state, cands []int, stale bool, now int64) int {
	var ewmas [maxChoices]float64
	fill := math.NaN()
	for k, i := range cands {
		ewmas[k] = p.ewmaFor(st, i, stale)
		if math.IsNaN(fill) {
			fill = ewmas[k]
		}
	}
	if math.IsNaN(fill) {
		fill = 1
	}
	best, bestScore := -1, 0.0
	decay := math.NaN() // the candidates' shared decay since the snapshot (see loadDecayed)
	for k, i := range cands {
		e := ewmas[k]
		if math.IsNaN(e) {
			e = fill
		}
		sc := p.scoreOf(st, i, e, stale, now, &decay)
		if best < 0 || sc < bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}

// scoreOf is entry i's score with TTFT estimate ewma; decay is the pick's
// cache for loadDecayed.
func (p *Picker) scoreOf(st *state, i int, ewma float64, stale bool, now int64, decay *float64) float64 {
	e := &st.entries[i]
	load := p.loadDecayed(st, e, stale, now, decay)
	var sc float64
	if p.inFlightRank {
		// inFlightRank inline, its cost term's first division taken at
		// the snapshot: the same operations, so the same bits.
		sc = load + 1
		if e.costPerMs != 0 {
			sc += e.costPerMs / ewma
		}
	} else {
		sc = p.score.Rank(load, ewma, e.cost, p.costWeight)
	}
	sc *= p.slowPenalty(st, ewma)
	if p.score.Weighted && !stale && e.weight > 0 && e.weight < 1 {
		sc /= e.weight
	}
	return sc
}

// loadOf is the load a score ranks entry e by: the router's own in-flight
// count, or for a fleet-load score the published load plus R x the
// router's change since the snapshot (never below 0), R x its own count
// when the published load is missing or stale.
func (p *Picker) loadOf(st *state, e *entry, stale bool, now int64) float64 {
	decay := math.NaN()
	return p.loadDecayed(st, e, stale, now, &decay)
}

// loadDecayed is loadOf with the cache of one pick: decay is NaN, or the
// factor exp(-(now - at) / LoadStale) that every candidate's decay shares,
// computed by the first candidate that needs it.
func (p *Picker) loadDecayed(st *state, e *entry, stale bool, now int64, decay *float64) float64 {
	own := e.local.inFlight.Load()
	if !p.score.FleetLoad {
		return float64(own)
	}
	local := st.routers * float64(own)
	pub := e.pub.pubLoad()
	if stale || math.IsNaN(pub) || now >= e.pub.staleAt.Load() {
		return local
	}
	est := max(0, pub+st.routers*float64(own-e.pub.atSnap.Load()))
	if p.loadStale < 0 {
		return est
	}
	// The published load's share decays with its age (the report's age at
	// the snapshot plus the time since), with LoadStale as time constant:
	// the fleet's changes between the report and the snapshot are not in
	// it, and R x the router's own count is the other estimate of the
	// same load. exp(-age/LoadStale) is the entry's decay at the snapshot
	// (state build) times the decay since, which is the same for every
	// candidate and is read from the picker's table (decay.go): no exp
	// on the pick path.
	var w float64
	if since := now - st.at; since >= 0 {
		if math.IsNaN(*decay) {
			*decay = p.decay.at(since)
		}
		w = min(*decay*e.pub.loadDecay(), 1)
	} else { // a snapshot from the future (clock skew): the exact age
		w = math.Exp(-max(float64(now-e.pub.loadAt.Load()), 0) / float64(p.loadStale))
	}
	return w*est + (1-w)*local
}

// slowPenalty is the outlier guard: a candidate whose EWMA has reached
// slowFactor times the pool median has its score multiplied by
// EWMA / (slowFactor x median), which is 1 at the line and grows with the
// excess. An in-flight score alone gives a backend five times slower an
// equal share at equal occupancy; the guard tilts the comparison away from
// it, yet it still wins when the other candidate is far busier, which keeps
// its EWMA fresh so that it can recover. 1 for every other candidate, and
// when the guard is off or the median unknown.
func (p *Picker) slowPenalty(st *state, ewma float64) float64 {
	line := p.slowFactor * st.med()
	if p.slowFactor <= 0 || math.IsNaN(line) || ewma < line {
		return 1
	}
	return ewma / line
}

// keepSticky applies the seed's affinity rule: keep the sticky backend while
// its EWMA is below tolerance x the pool median (a backend with no EWMA is
// scored at the median and so kept), and while its in-flight count stays
// under the bounded-load capacity over the n candidates.
func (p *Picker) keepSticky(st *state, i, n int, stale bool) bool {
	if p.loadFactor > 0 && n > 0 {
		capacity := math.Ceil(p.loadFactor * float64(p.total.Load()+1) / float64(n))
		if float64(st.entries[i].local.inFlight.Load()) >= capacity {
			return false
		}
	}
	median := st.med()
	if math.IsNaN(median) {
		return true
	}
	e := p.ewmaFor(st, i, stale)
	return math.IsNaN(e) || e < st.tolerance*median
}

// sample draws one entry with probability proportional to its weight,
// never s1 or s2 (entry indices, -1 for none), from the random bits u.
// It returns -1 when no entry with positive weight is left.
func (t *table) sample(u uint64, s1, s2 int) int {
	skip := [2]int{s1, s2}
	return t.sampleSkip(u, skip[:])
}

// sampleSkip is sample with any number of skipped entries (-1 entries and
// repeats are ignored); skip may be reordered in place (its set of entries
// is kept).
func (t *table) sampleSkip(u uint64, skip []int) int {
	if t.alias != nil {
		// O(1) draws from the alias table, rejecting the skipped entries;
		// a few rejections in a row (one entry holds most of the weight)
		// fall back to the exact search below. A membership test needs
		// no sorted list: the sort waits for the fallback.
		for range 4 {
			i := int(uniformInt(u, len(t.prob)))
			if float64(uint32(u))*0x1p-32 >= t.prob[i] {
				i = int(t.alias[i])
			}
			if !skipped(skip, i) {
				return i
			}
			u = mix64(u + 0x9e3779b97f4a7c15)
		}
	}
	skip = sortSkip(skip)
	n := len(t.cum)
	left := t.positive
	skippedWeight := 0.0
	for _, v := range skip {
		if w := t.weight(v); w > 0 {
			left--
			skippedWeight += w
		}
	}
	if left <= 0 {
		return -1
	}
	x := unitFloat(u) * (t.cum[n-1] - skippedWeight)
	// Map x from the line without the skipped intervals onto the full one
	// (skip is ascending).
	for _, v := range skip {
		if w := t.weight(v); x >= t.cum[v]-w {
			x += w
		}
	}
	// The first entry whose cumulative weight exceeds x, by a branchless
	// binary search (the compiler turns the step into a conditional move).
	lo, length := 0, n
	for length > 1 {
		half := length >> 1
		if t.cum[lo+half-1] <= x {
			lo += half
		}
		length -= half
	}
	if t.cum[lo] <= x {
		lo++
	}
	if lo >= n || skipped(skip, lo) || t.weight(lo) <= 0 {
		lo = t.nearest(min(lo, n-1), skip) // floating-point edge
	}
	return lo
}

// sortSkip sorts skip in place, dropping -1 entries and repeats, and
// returns the sorted prefix (the list is at most maxChoices+1 long).
func sortSkip(skip []int) []int {
	ns := 0
	for _, v := range skip {
		if v < 0 {
			continue
		}
		j := ns
		for j > 0 && skip[j-1] > v {
			j--
		}
		if j > 0 && skip[j-1] == v {
			continue
		}
		copy(skip[j+1:ns+1], skip[j:ns])
		skip[j] = v
		ns++
	}
	return skip[:ns]
}

// skipped reports whether i is in skip (-1 entries never match).
func skipped(skip []int, i int) bool {
	for _, v := range skip {
		if v == i {
			return true
		}
	}
	return false
}

// nearest returns the usable entry closest to i, looking forward first.
func (t *table) nearest(i int, skip []int) int {
	for j := i; j < len(t.cum); j++ {
		if !skipped(skip, j) && t.weight(j) > 0 {
			return j
		}
	}
	for j := i - 1; j >= 0; j-- {
		if !skipped(skip, j) && t.weight(j) > 0 {
			return j
		}
	}
	return -1
}

// uniformSkip draws a position in [0, m) other than s1 and s2 (-1 for
// none), uniformly; -1 when none is left.
func uniformSkip(u uint64, m, s1, s2 int) int {
	count := m
	if s1 >= 0 {
		count--
	}
	if s2 >= 0 && s2 != s1 {
		count--
	}
	if count <= 0 {
		return -1
	}
	if s1 > s2 {
		s1, s2 = s2, s1
	}
	j := uniformInt(u, count)
	if s1 >= 0 && j >= s1 {
		j++
	}
	if s2 >= 0 && s2 != s1 && j >= s2 {
		j++
	}
	return j
}

// uniformInt maps u to [0, n) by multiply-shift (Lemire), without division.
func uniformInt(u uint64, n int) int {
	hi, _ := bits.Mul64(u, uint64(n))
	return int(hi)
}

// unitFloat maps u to [0, 1).
func unitFloat(u uint64) float64 { return float64(u>>11) * 0x1p-53 }
