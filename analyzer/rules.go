package analyzer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Rate-based causes, the ones the min_requests gate applies to; indexes of
// backend.gateHeld.
const (
	gateFailureRate = iota
	gateThrottled
	gateSlow
	gateClientError
	numCauses
)

var gateCauses = [numCauses]string{CauseFailureRate, CauseThrottled, CauseSlow, CauseClientError}

// trip is a closed backend that a rule wants to open.
type trip struct {
	b        *backend
	cause    string
	reason   string
	minOpen  time.Duration // a 429 trip lasts at least the largest retry-after
	severity float64       // how far past its threshold; the worst are opened first under the cap
}

// evaluatePool applies the rules to one pool at now. gone reports that the
// pool is not configured and has no backend left, so it is forgotten after
// this (empty) snapshot.
func (a *Analyzer) evaluatePool(p *pool, now time.Time, beat bool, out *Evaluation) (gone bool) {
	s := &p.settings
	a.expire(p, now, out)
	bs := p.sorted()
	if len(bs) == 0 {
		return !p.configured
	}
	p.advance(now)
	for _, b := range bs {
		if b.since.IsZero() {
			b.since = now
		}
		if b.trips > 0 && b.state == fleetwatch.StateClosed && now.Sub(b.since) >= s.Window {
			// Closed for a whole window without tripping: the next trip
			// is a first trip again. A backend that flaps (trips again
			// within a window of closing) keeps growing its open time.
			b.trips = 0
		}
	}

	a.openForQuota(p, bs, now, out)
	a.halfOpenElapsed(p, bs, now, out)
	open := 0
	for _, b := range bs {
		if b.state == fleetwatch.StateOpen {
			open++
		}
	}

	// Half-open verdicts.
	for _, b := range bs {
		if b.state != fleetwatch.StateHalfOpen {
			continue
		}
		switch b.verdict {
		case verdictClose:
			reason := fmt.Sprintf("%d ok in a row while half-open", b.halfOpenOK)
			a.transition(p, b, fleetwatch.StateClosed, now, CauseRecovered, reason, out)
		case verdictFailure, verdictThrottled, verdictClientError:
			cause, reason, minOpen := CauseHalfOpenFailure, "failure while half-open", time.Duration(0)
			if b.verdict == verdictClientError {
				cause, reason = CauseHalfOpenClientErr, fmt.Sprintf("%d client errors while half-open (opened for client errors)", b.halfOpen4xx)
			}
			if b.verdict == verdictThrottled {
				cause, reason = CauseHalfOpenThrottled, "429 while half-open"
				if b.verdictWait > 0 {
					minOpen = msDuration(b.verdictWait)
					reason += "; retry-after " + fmtDur(minOpen)
				}
			}
			if !a.canOpen(s, open, len(bs)) {
				a.holdByCap(s, b, open, len(bs), reason)
				b.halfOpenOK, b.halfOpen4xx, b.verdict, b.verdictWait = 0, 0, verdictNone, 0
				continue
			}
			a.openBreaker(p, b, now, cause, reason, minOpen, out)
			open++
		}
	}

	// Closed backends: the trip rules.
	trips := a.findTrips(p, bs)
	slices.SortFunc(trips, func(x, y trip) int {
		if x.severity != y.severity {
			if x.severity > y.severity {
				return -1
			}
			return 1
		}
		return cmpString(x.b.id, y.b.id)
	})
	for _, b := range bs {
		b.tripping = false
	}
	for _, t := range trips {
		t.b.tripping = true
		if !a.canOpen(s, open, len(bs)) {
			a.holdByCap(s, t.b, open, len(bs), t.reason)
			t.b.runLatched, t.b.stallLatch, t.b.latch429 = 0, 0, 0 // the next failure of the run latches again
			continue
		}
		a.openBreaker(p, t.b, now, t.cause, t.reason, t.minOpen, out)
		open++
	}
	for _, b := range bs {
		if b.state == fleetwatch.StateClosed && !b.tripping {
			b.holdReason = ""
		}
	}

	a.setWeights(p, bs, now, beat)
	return false
}

// findTrips applies the trip rules to the closed backends and counts the
// rate-based trips that the min_requests gate holds back.
func (a *Analyzer) findTrips(p *pool, bs []*backend) []trip {
	s := &p.settings
	p.peers = peerEWMAs(p.peers[:0], bs)
	peers := p.peers
	recentLen := recentBuckets(s)
	var clientPeers clientPeerRates
	clientRule := clientRuleNeeded(s, bs)
	if clientRule {
		clientPeers = buildClientPeers(s, bs)
	}
	var trips []trip
	for _, b := range bs {
		if b.state != fleetwatch.StateClosed {
			b.gateHeld = [numCauses]bool{}
			continue
		}
		v := &b.view
		gated := v.counted < uint64(s.MinRequests)
		// The client-error rule's gate counts the client errors too: a
		// backend that answers nothing but 4xx is evaluated by it.
		gatedClient := v.answered() < uint64(s.MinRequests)
		in := ruleInput{s: s, latch: b, b: b, bs: bs, peers: peers, recentLen: recentLen}
		if clientRule {
			in.client = &clientPeers
		}
		res := in.apply(nil)
		a.stats.HeldByRecency += res.heldByRecency
		a.stats.HeldByMedian += res.heldByMedian
		want, cand := res.want, res.trips()

		// The gate: rate-based causes need MinRequests counted requests
		// (the client-error rule, answered requests).
		var chosen *trip
		for i := range cand {
			c := &cand[i]
			if c.cause == CauseClientError && gatedClient || c.cause != CauseConsecutive && c.cause != CauseClientError && gated {
				continue
			}
			if chosen == nil {
				chosen = c
			}
		}
		for c := range numCauses {
			held := gated && want[c]
			if c == gateClientError {
				held = gatedClient && want[c]
			}
			if held && !b.gateHeld[c] {
				a.stats.heldByGate[gateCauses[c]]++
			}
			b.gateHeld[c] = held
		}
		if chosen != nil {
			trips = append(trips, *chosen)
		}
		if chosen == nil || chosen.cause != CauseThrottled {
			// A run of 429s that did not open the backend now (the gate,
			// the pool's hold, another rule first) must happen again.
			b.latch429 = 0
		}
	}
	return trips
}

// canOpen reports whether one more backend may open in a pool of n backends
// of which open are open: the pool must keep at least 1 - MaxOpenFraction of
// its backends not open, and one backend may always be opened.
func (a *Analyzer) canOpen(s *Settings, open, n int) bool {
	return open == 0 || float64(open+1) <= s.MaxOpenFraction*float64(n)+1e-9
}

// holdByCap keeps b from opening. The reason is written when the hold
// starts and kept while it lasts, so that the snapshot does not change at
// every Evaluate while the numbers move.
func (a *Analyzer) holdByCap(s *Settings, b *backend, open, n int, reason string) {
	if b.holdReason != "" {
		return
	}
	a.stats.HeldByCap++
	b.holdReason = fmt.Sprintf("ejection cap held: %d of %d already open (max_open_fraction %.2f); %s", open, n, s.MaxOpenFraction, reason)
}

// openBreaker opens b for OpenBase x consecutive trips (capped, jittered),
// and at least minOpen.
func (a *Analyzer) openBreaker(p *pool, b *backend, now time.Time, cause, reason string, minOpen time.Duration, out *Evaluation) {
	b.trips++
	if cause != CauseHalfOpenFailure && cause != CauseHalfOpenThrottled && cause != CauseHalfOpenClientErr {
		b.tripCause = cause // a reopening keeps the cause of the trip
	}
	d := max(openDuration(&p.settings, b.trips, a.rng), minOpen)
	a.transition(p, b, fleetwatch.StateOpen, now, cause, reason, out)
	b.openUntil = now.Add(d)
	b.weight, b.weightSet, b.weightAt = 0, true, now
	a.stats.trips[cause]++
}

// halfOpenElapsed moves every open backend whose open time is over to
// half_open.
func (a *Analyzer) halfOpenElapsed(p *pool, bs []*backend, now time.Time, out *Evaluation) {
	for _, b := range bs {
		if b.state == fleetwatch.StateOpen && !now.Before(b.openUntil) {
			reason := fmt.Sprintf("open for %s; probing with weight %.2f", fmtDur(now.Sub(b.since)), p.settings.HalfOpenWeight)
			a.transition(p, b, fleetwatch.StateHalfOpen, now, CauseOpenElapsed, reason, out)
			b.view = b.win.stats()
		}
	}
}

// openForQuota keeps every backend whose quota resets ahead of now open
// until then: a quota spent for hours or days (a spend limit) is certain,
// not a sign to probe on a schedule, so it is not a trip (the open time of
// the next one does not grow), it is not held by the ejection cap (a
// backend that cannot serve until then helps nobody by staying closed),
// and its open_until is the reset. A quota that has reset clears.
func (a *Analyzer) openForQuota(p *pool, bs []*backend, now time.Time, out *Evaluation) {
	for _, b := range bs {
		switch {
		case b.quotaUntil.IsZero():
			continue
		case !now.Before(b.quotaUntil):
			// Reset: the usual rules again, and the expiry counts from
			// now (no event came while it was out).
			b.quotaUntil = time.Time{}
			if now.After(b.lastSeen) {
				b.lastSeen = now
			}
			continue
		case b.state == fleetwatch.StateOpen && !b.openUntil.Before(b.quotaUntil):
			continue
		}
		reason := fmt.Sprintf("out of quota until %s (in %s): the backend's retry hint",
			b.quotaUntil.UTC().Format(time.RFC3339), fmtDur(b.quotaUntil.Sub(now)))
		b.holdReason = ""
		if b.state == fleetwatch.StateOpen {
			b.openUntil, b.stateReason, b.tripCause = b.quotaUntil, reason, CauseQuota
			continue
		}
		a.transition(p, b, fleetwatch.StateOpen, now, CauseQuota, reason, out)
		b.tripCause = CauseQuota
		b.openUntil = b.quotaUntil
		b.weight, b.weightSet, b.weightAt = 0, true, now
		b.halfOpenOK, b.halfOpen4xx, b.verdict, b.verdictWait = 0, 0, verdictNone, 0
		a.stats.trips[CauseQuota]++
	}
}

// openDuration is OpenBase x trips, jittered by +-OpenJitter, capped at
// OpenMax, rounded to the millisecond.
func openDuration(s *Settings, trips int, rng *rand.Rand) time.Duration {
	n := min(int64(trips), int64(s.OpenMax/s.OpenBase)+1)
	d := float64(s.OpenBase) * float64(n)
	if s.OpenJitter > 0 {
		d *= 1 + s.OpenJitter*(2*rng.Float64()-1)
	}
	d = min(d, float64(s.OpenMax))
	return time.Duration(d).Round(time.Millisecond)
}

// transition moves b to state and records it.
func (a *Analyzer) transition(p *pool, b *backend, to fleetwatch.State, now time.Time, cause, reason string, out *Evaluation) {
	from := b.state
	b.enter(to, now, reason)
	out.Transitions = append(out.Transitions, Transition{
		Pool: p.id, Backend: b.id, From: from, To: to, At: now,
		Reason: reason, Generation: b.generation, Cause: cause,
	})
}

// expire drops the backends that are not configured and sent no event for
// longer than Expiry, but for one out of quota until later.
func (a *Analyzer) expire(p *pool, now time.Time, out *Evaluation) {
	var gone []*backend
	for _, b := range p.sorted() {
		// A backend out of quota gets no traffic, so no event, until its
		// reset: it is kept (and stays open) until then.
		if !b.configured && now.Sub(b.lastSeen) > p.settings.Expiry && b.quotaUntil.IsZero() {
			gone = append(gone, b)
		}
	}
	for _, b := range gone {
		delete(p.backends, b.id)
		p.order = nil
		a.stats.Expired++
		reason := fmt.Sprintf("no event for %s (expiry %s)", fmtDur(now.Sub(b.lastSeen)), fmtDur(p.settings.Expiry))
		out.Transitions = append(out.Transitions, Transition{
			Pool: p.id, Backend: b.id, From: b.state, To: "", At: now,
			Reason: reason, Generation: b.generation + 1, Cause: CauseExpired,
		})
	}
	if len(gone) > 0 {
		a.lastPool, a.lastBackend = nil, nil
	}
}

// peers holds the sorted EWMAs of a pool's backends that are not open, the
// reference of the slowness rule.
type peers []float64

// recentBuckets is the number of newest buckets a rate trip is confirmed
// on: a quarter of the window, at least one bucket.
func recentBuckets(s *Settings) int64 {
	return max(1, int64(s.Window/s.Bucket)/4)
}

// peerRecent429 is the median 429 rate of the newest n buckets of b's
// peers (the other backends that are not open and have counted requests
// there); ok is false when no peer has any.
func peerRecent429(b *backend, bs []*backend, n int64) (float64, bool) {
	var rates [16]float64
	v := rates[:0]
	for _, o := range bs {
		if o == b || o.state == fleetwatch.StateOpen {
			continue
		}
		st := o.win.recent(n)
		if r, ok := st.rate429(); ok {
			v = append(v, r)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	sort.Float64s(v)
	return median(v), true
}

// peerMax429 is the highest 429 rate over the newest n buckets among b's
// peers (the other backends that are not open and have counted requests
// there); ok is false when no peer has any.
func peerMax429(b *backend, bs []*backend, n int64) (float64, bool) {
	top, ok := 0.0, false
	for _, o := range bs {
		if o == b || o.state == fleetwatch.StateOpen {
			continue
		}
		st := o.win.recent(n)
		if r, has := st.rate429(); has {
			top, ok = max(top, r), true
		}
	}
	return top, ok
}

// slowConfirmed compares b's window median TTFT with the median of the
// other non-open backends' window medians, and reports whether it is more
// than factor times that.
func slowConfirmed(b *backend, bs []*backend, factor float64) (own, peerMedian float64, ok bool) {
	own, _, ok = b.win.ttftQuantiles()
	if !ok {
		return 0, 0, false
	}
	var meds peers
	for _, o := range bs {
		if o == b || o.state == fleetwatch.StateOpen {
			continue
		}
		if m, _, ok := o.win.ttftQuantiles(); ok {
			meds = append(meds, m)
		}
	}
	if len(meds) == 0 {
		return own, 0, false
	}
	sort.Float64s(meds)
	peerMedian = median(meds)
	return own, peerMedian, own > factor*peerMedian
}

// peerEWMAs appends the peers of bs to v and sorts them.
func peerEWMAs(v peers, bs []*backend) peers {
	for _, b := range bs {
		if b.hasEWMA && b.state != fleetwatch.StateOpen {
			v = append(v, b.ewma)
		}
	}
	sort.Float64s(v)
	return v
}

// medianWithout returns the median of the peers after removing one value
// equal to own (the backend's own EWMA): the median of the other backends.
// ok is false when no other backend has an EWMA.
func (v peers) medianWithout(own float64) (float64, bool) {
	m := len(v)
	if m < 2 {
		return 0, false
	}
	k := sort.SearchFloat64s(v, own)
	if k == m || v[k] != own {
		return median(v), true // own is not a peer (an open backend): all others count
	}
	at := func(i int) float64 { // the i-th value of v without index k
		if i < k {
			return v[i]
		}
		return v[i+1]
	}
	r := m - 1
	if r%2 == 1 {
		return at(r / 2), true
	}
	return (at(r/2-1) + at(r/2)) / 2, true
}

// median of sorted values; 0 for none.
func median(v []float64) float64 {
	m := len(v)
	switch {
	case m == 0:
		return 0
	case m%2 == 1:
		return v[m/2]
	}
	return (v[m/2-1] + v[m/2]) / 2
}

// setWeights computes every backend's weight at now.
//
// A closed backend's observed weight is 1 - rate_429/ThrottleRate (clipped to
// [0, 1]); it is shrunk toward the pool prior (the mean observed weight of the
// closed backends with at least MinRequests counted requests, 1 when there is
// none) as w = (n*w_obs + k*prior)/(n + k) with n its counted requests and
// k = max(1, MinRequests/4), and floored at HalfOpenWeight so that a closed
// backend keeps a trickle to show its recovery. Open and quarantined backends
// get 0 and half-open and cap-held ones HalfOpenWeight at once; a closed
// backend's weight moves toward its target on the pool's heartbeat, by
// MaxWeightStep per Heartbeat of time elapsed since it last moved
// (dampedWeight), whatever the pool's beat.
func (a *Analyzer) setWeights(p *pool, bs []*backend, now time.Time, beat bool) {
	s := &p.settings
	prior := weightPrior(s, bs)
	for _, b := range bs {
		target, immediate := 0.0, true
		switch {
		case b.state == fleetwatch.StateOpen:
		case a.quarantine && b.drift == fleetwatch.DriftDrifted:
		case b.state == fleetwatch.StateHalfOpen, b.holdReason != "":
			target = s.HalfOpenWeight
		default:
			target = shrunkWeight(s, &b.view, prior)
			immediate = !b.weightSet
		}
		w := target
		if !immediate {
			if !beat {
				// Damped weights move on the pool's beats only (its
				// heartbeat and load beats), however often the caller
				// evaluates, so that a ramp neither speeds up nor
				// republishes the pool at every tick.
				continue
			}
			w = dampedWeight(s, b.weight, target, b.weightAt, now)
		}
		b.weight = roundWeight(w)
		b.weightSet, b.weightAt = true, now
	}
}

// observedWeight is 1 - rate_429/ThrottleRate, clipped to [0, 1]; 1 with no
// counted request.
func observedWeight(s *Settings, v *windowStats) float64 {
	r, ok := v.rate429()
	if !ok {
		return 1
	}
	return min(max(1-r/s.ThrottleRate, 0), 1)
}

// maxRetryAfter bounds the retry-after a 429 trip honours: a backend that
// asks for a day is open for an hour, then probed.
const maxRetryAfter = time.Hour

// msDuration converts milliseconds to a Duration, rounded to the
// millisecond, at most maxRetryAfter.
func msDuration(ms float64) time.Duration {
	if !(ms > 0) {
		return 0
	}
	return time.Duration(math.Round(min(ms, float64(maxRetryAfter/time.Millisecond)))) * time.Millisecond
}

// fmtDur formats a duration for reasons: "30s", "1m30s", "250ms".
func fmtDur(d time.Duration) string {
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}
