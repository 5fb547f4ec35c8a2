package p2c

import (
	"math"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/fleetwatch/fleetwatch"
)

// entry is one backend of the applied snapshot, flattened for the pick path.
type entry struct {
	id        string
	idHash    uint64 // for rendezvous hashing
	local     *local
	state     fleetwatch.State
	weight    float64
	priority  int
	cost      float64 // 0 when the snapshot has none
	costPerMs float64 // cost / Settings.CostWeightPerMs: the in-flight rank's cost term times ewma
	openUntil int64   // unix ns; for open backends, math.MaxInt64 when unknown
	// pub is what the feed says of the backend between decisions: its
	// published load and TTFT EWMA, set here and moved by load frames
	// (UpdateLoads, loads.go) while picks read it.
	pub *published
}

// table is a cumulative weight table over all entries, for weighted sampling
// by binary search. An entry outside the candidate set has weight 0 and is
// never chosen.
type table struct {
	cum       []float64 // cum[i] = sum of weights of entries 0..i
	positive  int       // entries with weight > 0
	maxWeight float64   // the largest weight
	// Walker's alias table (Vose's construction), for pools larger than
	// aliasMin: entry i is drawn with probability prob[i], else alias[i].
	prob  []float64
	alias []int32
}

// aliasMin is the pool size from which sampling uses the alias table (O(1))
// rather than a binary search of the cumulative weights (O(log n)).
const aliasMin = 17

func (t *table) weight(i int) float64 {
	if i <= 0 {
		return t.cum[0]
	}
	return t.cum[i] - t.cum[i-1]
}

// state is the immutable pick-path view of one snapshot.
type state struct {
	header    fleetwatch.Snapshot // epoch, seq, at and fence of the applied snapshot
	staleAt   atomic.Int64        // unix ns after which the snapshot is stale (a load frame moves it)
	ttl       int64               // ns: the snapshot's ttl_ms
	at        int64               // unix ns of the snapshot's at
	mode      fleetwatch.Mode
	shed      bool          // all_open is shed
	median    atomic.Uint64 // float64 bits: the pool median EWMA TTFT; NaN when unknown (med; a load frame moves it)
	alone     bool          // the snapshot counts this router only
	tolerance float64
	routers   float64 // the snapshot's routers, at least 1
	choices   int     // candidates a fresh pick compares
	scan      bool    // a fresh pick compares every candidate (pick.go scanBest)
	// The snapshot's retry budget: retryFree, retries are free;
	// retryFleet, they draw from Picker.fleet. Neither: the per-router
	// budget.
	retryFree, retryFleet bool

	entries []entry
	byID    map[string]int
	locals  map[string]*local // the entries' locals plus removed ones still in flight

	// Fresh snapshot.
	allOpen      bool     // no backend is usable (every one open)
	fresh        table    // the candidates: balance = not open, by weight; failover = the tier with the largest share
	tiers        []tier   // failover with traffic split over several tiers (a trickle tier); nil otherwise
	affinityTier int      // the index in tiers of fresh's tier
	spread       table    // every backend, equal weights (all_open=spread)
	slotMask     uint64   // the affinity slots' mask, by the number of entries (affinity.go)
	sticky       []int    // affinity candidates: closed, weight > 0, within fresh's candidates
	stickyHash   []uint64 // stickyHash[k] is entries[sticky[k]].idHash
	affinity     *affinityTable

	// Stale snapshot: every backend not open is a candidate, then open ones
	// whose open_until has passed, with equal weights.
	staleOrder     []int   // not-open entries first, then open ones by open_until
	staleNotOpen   int     // how many of staleOrder are not open
	staleOpenUntil []int64 // open_until of staleOrder[staleNotOpen:], ascending
	stalePos       []int   // stalePos[i] is entry i's position in staleOrder

	// Shadow mode (shadow.go): shadow is the snapshot's mode, and full
	// the state of its full decisions, which the picker does not follow
	// but picks on too, to count the difference; nil when off. excluded
	// is set in a full state: why its fresh path never picks entry i.
	shadow   fleetwatch.Shadow
	full     *state
	excluded []uint8
}

// Update applies snap, unless it is not newer than the one applied (same
// epoch, seq not greater; see Snapshot.NewerThan). The picker keeps its own
// in-flight counts and local EWMAs per backend id across snapshots. snap is
// not retained or modified.
func (p *Picker) Update(snap *fleetwatch.Snapshot) {
	if snap == nil {
		return
	}
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	prev := p.state.Load()
	if prev != nil && !snap.NewerThan(&prev.header) {
		return
	}
	var st *state
	if snap.Shadow.On() {
		st = p.buildShadow(snap, prev)
	} else {
		st = p.build(snap, prev)
	}
	if rb := snap.RetryBudget; rb != nil {
		// The share accrues while retries are free too, so that it holds
		// up to about ten seconds' worth when the pool fills up.
		st.retryFree, st.retryFleet = rb.Free, !rb.Free
		p.fleet.setRate(rb.PerSec/st.routers, p.now())
	}
	p.state.Store(st)
}

func (p *Picker) build(snap *fleetwatch.Snapshot, prev *state) *state {
	n := len(snap.Backends)
	st := &state{
		header:   fleetwatch.Snapshot{Epoch: snap.Epoch, Seq: snap.Seq, At: snap.At, Fence: snap.Fence},
		at:       snap.At.UnixNano(),
		ttl:      int64(snap.StaleAt().Sub(snap.At.Time)),
		mode:     snap.Mode,
		shed:     snap.AllOpen != fleetwatch.AllOpenSpread,
		routers:  float64(max(snap.Routers, 1)),
		alone:    snap.Routers == 1,
		choices:  p.choices,
		entries:  make([]entry, n),
		slotMask: slotMask(n),
	}
	if st.choices == 0 { // Settings.Choices unset: by the number of routers
		st.scan = snap.Routers >= 1 && snap.Routers <= p.scanRouters
		switch {
		case snap.Routers > fleetwatch.ManyRouters:
			st.choices = DefaultChoicesMany
		default:
			st.choices = DefaultChoices
		}
	}
	st.staleAt.Store(snap.StaleAt().UnixNano()) // the one staleness rule (fleetwatch.Snapshot.Stale)
	st.setMedian(snap.MedianEWMATTFTMs)
	st.tolerance = p.tolerance
	if st.tolerance == 0 {
		st.tolerance = snap.AffinityTolerance
	}
	if st.tolerance <= 0 {
		st.tolerance = fleetwatch.DefaultAffinityTolerance
	}
	pubs := make([]published, n)
	for i := range snap.Backends {
		e := p.entryOf(&snap.Backends[i], &pubs[i], snap.At, st.at, snap.Routers == 1)
		if prev != nil {
			e.local = prev.locals[e.id]
		}
		if e.local == nil {
			e.local = new(local)
		}
		p.setBaseline(st.at, &e)
		st.entries[i] = e
	}
	// What follows from the backends alone is prev's when they did not
	// change: most snapshots repeat the decisions and move only loads,
	// EWMAs or pool fields, and most others only weights.
	same := prev != nil && st.sameBackends(prev)
	if same {
		st.byID = prev.byID
	} else {
		st.byID = make(map[string]int, n)
		for i := range st.entries {
			st.byID[st.entries[i].id] = i
		}
	}
	st.locals = st.localsFrom(prev, same)
	if same && st.sameCandidates(prev) {
		st.shareCandidates(prev)
		return st
	}
	st.buildFresh()
	if same {
		st.shareStale(prev)
	} else {
		st.buildStale()
	}
	var prevTable *affinityTable
	if prev != nil {
		prevTable = prev.affinity
	}
	st.affinity = buildAffinity(prevTable, st.slotMask, st.sticky, st.stickyHash)
	return st
}

// localsFrom returns the locals of st's entries, and prev's of a backend
// that left the snapshot while requests to it are in flight, so that it
// finds its count again if it returns before they finish (their Choices
// hold the local itself). With the same backends as prev (same), prev's
// map is kept when it holds no one else.
func (st *state) localsFrom(prev *state, same bool) map[string]*local {
	if same && len(prev.locals) == len(st.entries) {
		return prev.locals
	}
	locals := make(map[string]*local, len(st.entries))
	for i := range st.entries {
		locals[st.entries[i].id] = st.entries[i].local
	}
	if prev != nil {
		for id, l := range prev.locals {
			if _, ok := locals[id]; !ok && l.inFlight.Load() > 0 {
				locals[id] = l
			}
		}
	}
	return locals
}

// sameBackends reports whether st's entries are prev's backends, in the
// same order, with the same state and open_until: everything the id index
// and buildStale read, so that st may share what they built for prev
// (shareStale).
func (st *state) sameBackends(prev *state) bool {
	if len(st.entries) != len(prev.entries) {
		return false
	}
	for i := range st.entries {
		a, b := &st.entries[i], &prev.entries[i]
		if a.id != b.id || a.state != b.state || a.openUntil != b.openUntil {
			return false
		}
	}
	return true
}

// sameCandidates reports whether st's entries, the same backends as
// prev's (sameBackends), also have the same weight and priority, in the
// same mode: everything buildFresh and the affinity table read too, so
// that st may share every table built for prev (shareCandidates).
func (st *state) sameCandidates(prev *state) bool {
	if st.mode != prev.mode {
		return false
	}
	for i := range st.entries {
		a, b := &st.entries[i], &prev.entries[i]
		if a.weight != b.weight || a.priority != b.priority {
			return false
		}
	}
	return true
}

// shareCandidates gives st prev's candidate tables, which it never
// modifies (sameCandidates).
func (st *state) shareCandidates(prev *state) {
	st.allOpen, st.fresh, st.tiers, st.affinityTier, st.spread = prev.allOpen, prev.fresh, prev.tiers, prev.affinityTier, prev.spread
	st.sticky, st.stickyHash, st.affinity = prev.sticky, prev.stickyHash, prev.affinity
	st.shareStale(prev)
}

// shareStale gives st prev's stale order, which it never modifies
// (sameBackends).
func (st *state) shareStale(prev *state) {
	st.staleOrder, st.staleNotOpen, st.staleOpenUntil, st.stalePos = prev.staleOrder, prev.staleNotOpen, prev.staleOpenUntil, prev.stalePos
}

// entryOf is the picker's entry for one backend of a snapshot taken at
// (snapAt; at in nanoseconds), without its local counts. alone: the
// snapshot counts this router only, and a load reported on outcome events
// is then not the fleet's but an echo of this router's own traffic, which
// its own counts know exactly and sooner (Score.FleetLoad).
func (p *Picker) entryOf(b *fleetwatch.Backend, pub *published, snapAt fleetwatch.Time, at int64, alone bool) entry {
	e := entry{
		id:       b.Backend,
		idHash:   hashID(b.Backend),
		state:    b.State,
		weight:   b.Weight,
		priority: b.Priority,
		pub:      pub,
	}
	pub.ewma.Store(math.Float64bits(math.NaN()))
	pub.load.Store(math.Float64bits(math.NaN()))
	if l := b.Load; l != nil && p.score.FleetLoad && !(alone && l.Source == fleetwatch.LoadSourceEvent) {
		p.setLoad(pub, l.Running, l.Waiting, snapAt.UnixNano(), l.AgeMs, at)
	}
	if !(e.weight > 0) { // also NaN
		e.weight = 0
	}
	if e.weight > 1 {
		e.weight = 1
	}
	if b.EWMATTFTMs != nil && *b.EWMATTFTMs > 0 {
		pub.ewma.Store(math.Float64bits(*b.EWMATTFTMs))
	}
	if b.CostPerMTok != nil {
		e.cost = *b.CostPerMTok
		e.costPerMs = e.cost / p.costWeight
	}
	if e.state == fleetwatch.StateOpen {
		e.openUntil = math.MaxInt64
		if b.OpenUntil != nil {
			e.openUntil = b.OpenUntil.UnixNano()
		}
	}
	return e
}

// buildFresh builds the candidate table of a fresh snapshot.
func (st *state) buildFresh() {
	n := len(st.entries)
	weights := make([]float64, n)
	anyPositive, anyCandidate := false, false
	for i := range st.entries {
		e := &st.entries[i]
		if e.state != fleetwatch.StateOpen {
			anyCandidate = true
			weights[i] = e.weight
			anyPositive = anyPositive || e.weight > 0
		}
	}
	st.allOpen = !anyCandidate
	switch {
	case st.mode == fleetwatch.ModeFailover && anyCandidate:
		st.buildTiers()
	case anyCandidate && !anyPositive:
		// Every candidate has weight 0 (for example all quarantined):
		// spread equally rather than send nothing.
		for i := range st.entries {
			if st.entries[i].state != fleetwatch.StateOpen {
				weights[i] = 1
			}
		}
		st.fresh = newTable(weights)
	default:
		st.fresh = newTable(weights)
	}
	for i := range weights {
		weights[i] = 1
	}
	st.spread = newTable(weights)
	for i := range st.entries {
		e := &st.entries[i]
		if st.fresh.weight(i) > 0 && e.state == fleetwatch.StateClosed && e.weight > 0 {
			st.sticky = append(st.sticky, i)
			st.stickyHash = append(st.stickyHash, e.idHash)
		}
	}
}

// tier is one priority level of a failover pool that receives traffic.
type tier struct {
	upTo float64 // the cumulative share of the tiers up to this one; the last is 1
	tbl  table   // the tier's backends by weight, every other entry 0
}

// tierShares applies the failover rule (see the package doc) to the total
// weights of the tiers, lowest priority first: tier k receives
// (1 - what the tiers before it received) x min(totals[k], 1), and the
// shares are normalised when every tier's total is below 1. All shares are
// 0 when every total is 0.
func tierShares(totals, shares []float64) {
	left, sum := 1.0, 0.0
	for k, w := range totals {
		shares[k] = left * min(max(w, 0), 1)
		left -= shares[k]
		sum += shares[k]
	}
	if sum > 0 {
		for k := range shares {
			shares[k] /= sum
		}
	}
}

// buildTiers builds the failover tables: the backends that are not open,
// grouped by priority, each group (tier) given its share of the traffic by
// tierShares. st.fresh is the table of the tier with the largest share (the
// lowest priority among equals), whose closed backends affinity uses;
// st.tiers lists every tier with a positive share when there are several.
func (st *state) buildTiers() {
	var prios []int
	for i := range st.entries {
		if e := &st.entries[i]; e.state != fleetwatch.StateOpen && !slices.Contains(prios, e.priority) {
			prios = append(prios, e.priority)
		}
	}
	slices.Sort(prios)
	totals := make([]float64, len(prios))
	for i := range st.entries {
		if e := &st.entries[i]; e.state != fleetwatch.StateOpen {
			totals[slices.Index(prios, e.priority)] += e.weight
		}
	}
	shares := make([]float64, len(prios))
	tierShares(totals, shares)
	tierTable := func(prio int, equal bool) table {
		w := make([]float64, len(st.entries))
		for i := range st.entries {
			if e := &st.entries[i]; e.state != fleetwatch.StateOpen && e.priority == prio {
				w[i] = e.weight
				if equal {
					w[i] = 1
				}
			}
		}
		return newTable(w)
	}
	if !slices.ContainsFunc(shares, func(s float64) bool { return s > 0 }) {
		// Every tier has weight 0 (all quarantined, say): spread equally
		// over the lowest tier rather than send nothing.
		st.fresh = tierTable(prios[0], true)
		return
	}
	best, upTo := -1, 0.0
	for k, prio := range prios {
		if shares[k] <= 0 {
			continue
		}
		upTo += shares[k]
		st.tiers = append(st.tiers, tier{upTo: upTo, tbl: tierTable(prio, false)})
		if best < 0 || shares[k] > shares[best] {
			best = k
			st.fresh = st.tiers[len(st.tiers)-1].tbl
			st.affinityTier = len(st.tiers) - 1
		}
	}
	st.tiers[len(st.tiers)-1].upTo = 1 // rounding
	if len(st.tiers) == 1 {
		st.tiers, st.affinityTier = nil, 0
	}
}

// tierOf returns the tier a unit draw u in [0, 1) falls in.
func (st *state) tierOf(u float64) int {
	for k := range st.tiers {
		if u < st.tiers[k].upTo {
			return k
		}
	}
	return len(st.tiers) - 1
}

func newTable(weights []float64) table {
	t := table{cum: make([]float64, len(weights))}
	sum := 0.0
	for i, w := range weights {
		if w > 0 {
			sum += w
			t.positive++
			t.maxWeight = max(t.maxWeight, w)
		}
		t.cum[i] = sum
	}
	if len(weights) >= aliasMin && t.positive > 0 {
		t.buildAlias(weights, sum)
	}
	return t
}

// buildAlias builds the alias table by Vose's method ("A Linear Algorithm
// for Generating Random Numbers with a Given Distribution", 1991).
func (t *table) buildAlias(weights []float64, sum float64) {
	n := len(weights)
	t.prob = make([]float64, n)
	t.alias = make([]int32, n)
	scaled := make([]float64, n)
	var small, large []int32
	for i, w := range weights {
		scaled[i] = max(w, 0) * float64(n) / sum
		if scaled[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		t.prob[s], t.alias[s] = scaled[s], l
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	// What is left has probability 1 up to rounding.
	for _, i := range large {
		t.prob[i], t.alias[i] = 1, i
	}
	for _, i := range small {
		if weights[i] > 0 {
			t.prob[i], t.alias[i] = 1, i
		} else { // a zero weight left over by rounding: never itself
			t.prob[i], t.alias[i] = 0, int32(t.firstPositive(weights))
		}
	}
}

func (t *table) firstPositive(weights []float64) int {
	for i, w := range weights {
		if w > 0 {
			return i
		}
	}
	return 0
}

// buildStale orders the entries for the stale path: not-open ones first (in
// snapshot order), then open ones by the time their breaker may close.
func (st *state) buildStale() {
	n := len(st.entries)
	st.staleOrder = make([]int, 0, n)
	var open []int
	for i := range st.entries {
		if st.entries[i].state == fleetwatch.StateOpen {
			open = append(open, i)
		} else {
			st.staleOrder = append(st.staleOrder, i)
		}
	}
	st.staleNotOpen = len(st.staleOrder)
	sort.SliceStable(open, func(a, b int) bool {
		return st.entries[open[a]].openUntil < st.entries[open[b]].openUntil
	})
	st.staleOrder = append(st.staleOrder, open...)
	st.staleOpenUntil = make([]int64, len(open))
	for k, i := range open {
		st.staleOpenUntil[k] = st.entries[i].openUntil
	}
	st.stalePos = make([]int, n)
	for pos, i := range st.staleOrder {
		st.stalePos[i] = pos
	}
}

// staleCandidates is how many of staleOrder are candidates at now: the
// not-open ones and the open ones whose open_until is not in the future.
func (st *state) staleCandidates(now int64) int {
	lo, hi := 0, len(st.staleOpenUntil)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if st.staleOpenUntil[mid] > now {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return st.staleNotOpen + lo
}

// hashID is FNV-1a followed by a 64-bit finaliser, so that ids differing in
// one byte land far apart.
func hashID(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return mix64(h)
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// RendezvousWeight is the weight rendezvous hashing gives backend id for the
// prefix key: the picker's sticky backend for key is the non-open backend
// with the highest weight. It is exported so that other implementations
// (the simulator's always-sticky policy, a router in another language) can
// place keys exactly as the picker does.
func RendezvousWeight(key uint64, id string) uint64 { return mix64(key ^ hashID(id)) }
