package p2c

import (
	"errors"
	"math"
	"slices"

	"github.com/fleetwatch/fleetwatch"
)

// Picks restricted by the caller: Request.Among (a subset the caller can
// reach, such as the endpoint subset an Envoy data plane hints at) and
// Request.Avoid (backends already chosen for the same request, such as the
// earlier endpoints of an ordered fallback list). They take one path,
// pickAmong, that follows the pool's rules over the allowed candidates and
// compares every one of them (at most ScanMax): a subset is small, and the
// scan is what the fresh path does for few routers anyway.
//
// Rules, by the snapshot:
//   - fresh: open backends and backends of weight 0 are never candidates;
//     in failover mode the lowest priority with a candidate is used (a
//     trickle tier's share is not drawn: a subset pick is a degraded
//     view); when every allowed backend is open, ErrShed (all_open=shed)
//     or the allowed backends with equal weights (spread);
//   - stale: the fail-static rules of the whole pool (breakers whose
//     open_until is ahead stay honoured, the rest equal, local breakers
//     weigh them);
//   - a request with a prefix keeps its sticky backend among the
//     candidates (rendezvous hashing over them) while the affinity rule
//     holds.
//
// Shadow mode: a restricted pick follows the view the picker follows
// (ShadowView) but is not counted in ShadowStats.

// ErrNoCandidates is returned when Request.Among (less Request.Avoid)
// leaves no backend that may be picked: none of its ids is in the pool, or
// every one is open, drained or of weight 0 while another allowed backend
// exists (a data plane's subset hint with no eligible endpoint: the
// endpoint-picker protocol answers 503).
var ErrNoCandidates = errors.New("p2c: none of the allowed backends can be picked")

// restricted reports whether req takes the restricted path.
func (req *Request) restricted() bool { return len(req.Among) > 0 || len(req.Avoid) > 0 }

// pickAmong is Pick's restricted path (see above).
func (p *Picker) pickAmong(st *state, r Rand, req Request, ex int, now int64, fresh bool) (int, bool, error) {
	var buf [ScanMax]int
	cands := p.allowed(st, req, buf[:0])
	if len(cands) == 0 {
		return -1, false, ErrNoCandidates
	}
	var wbuf [ScanMax]float64
	weights := wbuf[:len(cands)]
	var usable int
	if fresh {
		usable = p.freshAmong(st, cands, weights)
	} else {
		usable = p.staleAmong(st, cands, weights, now)
	}
	if usable == 0 {
		for _, i := range cands {
			if st.entries[i].state != fleetwatch.StateOpen {
				return -1, false, ErrNoCandidates // drained or of weight 0, not open
			}
		}
		if st.shed {
			return -1, false, ErrShed
		}
		for k := range weights {
			weights[k] = 1 // all_open=spread: the allowed backends, breakers ignored
		}
		usable = len(cands)
	}
	// The backend this retry already tried is a candidate only when it is
	// the only one left.
	if k := slices.Index(cands, ex); k >= 0 && usable > 1 && weights[k] > 0 {
		weights[k] = 0
		usable--
	}
	if req.HasPrefix {
		var sbuf [ScanMax]int
		sticky := sbuf[:0]
		for k, i := range cands {
			if weights[k] >= 1 && st.entries[i].state == fleetwatch.StateClosed {
				sticky = append(sticky, i)
			}
		}
		if i := st.rendezvousSlot(req.Prefix, sticky, len(sticky), -1); i >= 0 && p.keepSticky(st, i, len(sticky), !fresh) {
			return i, true, nil
		}
	}
	return p.scanAmong(st, r, cands, weights, !fresh, now), false, nil
}

// allowed appends to dst the indices of the backends req allows: those of
// req.Among in the snapshot (every backend when Among is empty), less
// req.Avoid, without repeats, at most ScanMax.
func (p *Picker) allowed(st *state, req Request, dst []int) []int {
	avoid := func(i int) bool {
		for _, id := range req.Avoid {
			if j, ok := st.byID[id]; ok && j == i {
				return true
			}
		}
		return false
	}
	if len(req.Among) == 0 {
		for i := range st.entries {
			if len(dst) == ScanMax {
				break
			}
			if !avoid(i) {
				dst = append(dst, i)
			}
		}
		return dst
	}
	for _, id := range req.Among {
		i, ok := st.byID[id]
		if !ok || avoid(i) || slices.Contains(dst, i) {
			continue
		}
		if len(dst) == ScanMax {
			break
		}
		dst = append(dst, i)
	}
	return dst
}

// freshAmong sets the weight of each candidate under a fresh snapshot and
// returns how many may be picked: not open, weight > 0, and in failover
// mode of the lowest priority that has one.
func (p *Picker) freshAmong(st *state, cands []int, weights []float64) int {
	best := math.MaxInt
	for k, i := range cands {
		e := &st.entries[i]
		if e.state == fleetwatch.StateOpen || e.weight <= 0 {
			weights[k] = 0
			continue
		}
		weights[k] = e.weight
		best = min(best, e.priority)
	}
	n := 0
	for k, i := range cands {
		if weights[k] > 0 && st.mode == fleetwatch.ModeFailover && st.entries[i].priority != best {
			weights[k] = 0
		}
		if weights[k] > 0 {
			n++
		}
	}
	return n
}

// staleAmong sets the weight of each candidate under a stale snapshot (fail
// static: a breaker whose open_until is ahead stays honoured, the rest are
// equal, weighed by the router's local breakers) and returns how many may
// be picked. In failover mode the lowest priority with a candidate.
func (p *Picker) staleAmong(st *state, cands []int, weights []float64, now int64) int {
	local := p.tripped.Load() > 0
	best := math.MaxInt
	for k, i := range cands {
		e := &st.entries[i]
		if e.state == fleetwatch.StateOpen && e.openUntil > now {
			weights[k] = 0
			continue
		}
		weights[k] = 1
		if local {
			weights[k] = p.localWeight(st, i, now)
		}
		if weights[k] > 0 {
			best = min(best, e.priority)
		}
	}
	n := 0
	for k, i := range cands {
		if weights[k] > 0 && st.mode == fleetwatch.ModeFailover && st.entries[i].priority != best {
			weights[k] = 0
		}
		if weights[k] > 0 {
			n++
		}
	}
	if n == 0 && local {
		// Every candidate's local breaker is open: they are ignored.
		for k, i := range cands {
			if e := &st.entries[i]; e.state != fleetwatch.StateOpen || e.openUntil <= now {
				weights[k] = 1
				n++
			}
		}
	}
	return n
}

// scanAmong compares every candidate with a positive weight and returns
// the lowest score: one of the largest weight always, a down-weighted one
// with probability weight / largest weight, as the scan of the fresh path;
// a tie goes to one of the tied at random. It starts at a random candidate
// so that the coin flips do not favour the first ones.
func (p *Picker) scanAmong(st *state, r Rand, cands []int, weights []float64, stale bool, now int64) int {
	maxW := 0.0
	for _, w := range weights {
		maxW = max(maxW, w)
	}
	fill := math.NaN()
	if !stale {
		fill = st.med()
	}
	n := len(cands)
	start := uniformInt(r.Uint64(), n)
	best, bestScore, ties := -1, 0.0, 0
	decay := math.NaN()
	for j := range n {
		k := (start + j) % n
		w := weights[k]
		if w <= 0 || (w < maxW && unitFloat(r.Uint64())*maxW >= w) {
			continue
		}
		i := cands[k]
		e := p.ewmaFor(st, i, stale)
		if math.IsNaN(e) {
			if math.IsNaN(fill) {
				fill = 1
			}
			e = fill
		}
		sc := p.scoreOf(st, i, e, stale, now, &decay)
		switch {
		case best < 0 || sc < bestScore:
			best, bestScore, ties = i, sc, 1
		case sc == bestScore:
			ties++
			if uniformInt(r.Uint64(), ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 { // every candidate lost its coin: the heaviest
		for k, w := range weights {
			if w == maxW {
				return cands[k]
			}
		}
	}
	return best
}

// Fallbacks appends to dst up to n backends for the same request after
// primary, each chosen as Pick would choose it among req's candidates less
// primary and the ones before it (an ordered fallback list that a data
// plane walks when an attempt fails). It counts nothing in flight and
// draws nothing from the retry budget: a fallback is sent only if the
// attempts before it failed, and then reported as the served endpoint. It
// stops early when no candidate is left.
func (p *Picker) Fallbacks(r Rand, req Request, primary string, n int, dst []string) []string {
	st := p.state.Load()
	if st == nil || len(st.entries) == 0 {
		return dst
	}
	now := p.now().UnixNano()
	fresh := now < st.staleAt.Load()
	avoid := append(make([]string, 0, len(req.Avoid)+n+1), req.Avoid...)
	avoid = append(avoid, primary)
	req.Exclude, req.Retry = "", false
	for range n {
		req.Avoid = avoid
		i, _, err := p.pickAmong(st, r, req, -1, now, fresh)
		if err != nil || i < 0 {
			return dst
		}
		id := st.entries[i].id
		dst = append(dst, id)
		avoid = append(avoid, id)
	}
	return dst
}
