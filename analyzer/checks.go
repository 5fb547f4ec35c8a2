package analyzer

import (
	"cmp"
	"fmt"
	"time"
)

// The trip rules, one function each. A rule reads one closed backend and
// adds what it would open it for (before the min_requests gate and the
// ejection cap, which findTrips and evaluatePool apply); given rows, it
// also appends the rows explain prints, from the same values and the same
// conditions, so that the table of reasons cannot say something the
// decision did not do. findTrips passes no rows: the hot path formats only
// the reasons of the trips it takes.

// ruleInput is what the rules read of one closed backend.
type ruleInput struct {
	s *Settings
	// latch holds the consecutive run (explain: the real backend, whose
	// latches the dry run consumed on its copy); b the window and EWMA.
	latch, b  *backend
	bs        []*backend
	peers     peers            // the pool's TTFT EWMAs (peerEWMAs)
	client    *clientPeerRates // nil: the client-error rule has nothing to do in the pool
	recentLen int64

	recent    windowStats // the newest quarter, once hasRecent
	hasRecent bool
}

// recentStats is the newest quarter of b's window, read once.
func (in *ruleInput) recentStats() *windowStats {
	if !in.hasRecent {
		in.recent, in.hasRecent = in.b.win.recent(in.recentLen), true
	}
	return &in.recent
}

// ruleResult is what the rules found for one backend: the trips they want,
// in the rules' order, the gates they want (backend.gateHeld), and the
// holds findTrips counts in Stats.
type ruleResult struct {
	cand          [5]trip
	n             int
	want          [numCauses]bool
	heldByRecency uint64
	heldByMedian  uint64
}

func (r *ruleResult) add(t trip) {
	r.cand[r.n] = t
	r.n++
}

func (r *ruleResult) trips() []trip { return r.cand[:r.n] }

// apply runs every rule in the order findTrips prefers them.
func (in *ruleInput) apply(rows *[]RuleCheck) ruleResult {
	var r ruleResult
	in.consecutive(rows, &r)
	in.failureRate(rows, &r)
	in.throttled(rows, &r)
	in.slow(rows, &r)
	in.clientErrors(rows, &r)
	return r
}

// row appends c to rows (when there are rows), recording the reason of
// the trip it stands for.
func row(rows *[]RuleCheck, c RuleCheck, t *trip) {
	if rows == nil {
		return
	}
	if t != nil {
		c.TripReason = t.reason
	}
	*rows = append(*rows, c)
}

// consecutive: a run of ConsecutiveFailures failures, or of
// ConsecutiveStalls stalls, latched when it happened.
func (in *ruleInput) consecutive(rows *[]RuleCheck, r *ruleResult) {
	s, b := in.s, in.latch
	var t *trip
	switch {
	case b.stallLatch > 0:
		t = &trip{b: in.b, cause: CauseConsecutive,
			reason:   fmt.Sprintf("%d stalls in a run of %d failures (no first token within the router's deadline)", b.stallLatch, b.runLatched),
			severity: float64(b.stallLatch) / float64(s.ConsecutiveStalls)}
	case b.runLatched > 0:
		t = &trip{b: in.b, cause: CauseConsecutive,
			reason:   fmt.Sprintf("%d consecutive failures", b.runLatched),
			severity: float64(b.runLatched) / float64(s.ConsecutiveFailures)}
	}
	if t != nil {
		r.add(*t)
	}
	if rows == nil {
		return
	}
	run := max(b.run, b.runLatched)
	c := RuleCheck{Rule: CauseConsecutive, Value: float64(run), Threshold: float64(s.ConsecutiveFailures), HasValue: true, Fires: t != nil}
	c.Detail = fmt.Sprintf("%d failures in a row (opens at %d)", run, s.ConsecutiveFailures)
	if stalls := max(b.stalls, b.stallLatch); stalls > 0 {
		c.Detail += fmt.Sprintf("; %d of them stalls (opens at %d stalls)", stalls, s.ConsecutiveStalls)
	}
	if b.stallLatch > 0 {
		c.Value, c.Threshold = float64(b.stallLatch), float64(s.ConsecutiveStalls)
		c.Detail = fmt.Sprintf("%d stalls in a run of %d failures (opens at %d stalls, or %d failures)",
			b.stallLatch, run, s.ConsecutiveStalls, s.ConsecutiveFailures)
	}
	row(rows, c, t)
}

// failureRate: the window's error rate at FailureRate, confirmed by the
// newest quarter when it has requests; or the newest quarter alone with
// RecentMinRequests there and the window at half the threshold.
func (in *ruleInput) failureRate(rows *[]RuleCheck, r *ruleResult) {
	s, v := in.s, &in.b.view
	fr, frOK := v.failureRate()
	var rf float64
	var rfOK bool
	var n uint64
	if frOK && fr >= s.FailureRate/2 || rows != nil {
		rec := in.recentStats()
		rf, rfOK = rec.failureRate()
		n = rec.ok() + rec.failures()
	}
	windowFires := frOK && fr >= s.FailureRate
	var tw, tq *trip
	switch {
	case windowFires && (!rfOK || rf >= s.FailureRate):
		tw = &trip{b: in.b, cause: CauseFailureRate,
			reason:   fmt.Sprintf("error rate %.2f >= %.2f over %d requests in %s", fr, s.FailureRate, v.ok()+v.failures(), fmtDur(s.Window)),
			severity: fr / s.FailureRate}
	case windowFires:
		r.heldByRecency++
	case frOK && fr >= s.FailureRate/2 && s.RecentMinRequests > 0 && rfOK && rf >= s.FailureRate && n >= uint64(s.RecentMinRequests):
		tq = &trip{b: in.b, cause: CauseFailureRate,
			reason: fmt.Sprintf("error rate %.2f >= %.2f over the newest %s (%d requests; %.2f over %s)",
				rf, s.FailureRate, fmtDur(in.recentSpan()), n, fr, fmtDur(s.Window)),
			severity: rf / s.FailureRate}
	}
	if t := cmp.Or(tw, tq); t != nil { // at most one of them
		r.want[gateFailureRate] = true
		r.add(*t)
	}
	if rows == nil {
		return
	}
	span := fmtDur(in.recentSpan())
	c := RuleCheck{Rule: CauseFailureRate, Value: fr, Threshold: s.FailureRate, HasValue: frOK, Fires: windowFires}
	c.Detail = "no ok, error or timeout in the window"
	if frOK {
		c.Detail = fmt.Sprintf("error rate %.2f over %d requests in %s (opens at %.2f)", fr, v.ok()+v.failures(), fmtDur(s.Window), s.FailureRate)
		if windowFires && tw == nil {
			c.HeldBy = HeldByRecency
			c.Detail += fmt.Sprintf("; the newest %s is at %.2f", span, rf)
		}
	}
	row(rows, c, tw)
	c = RuleCheck{Rule: RuleFailureRateRecent, Value: rf, Threshold: s.FailureRate, HasValue: rfOK, Fires: tq != nil}
	c.Detail = fmt.Sprintf("no ok, error or timeout in the newest %s", span)
	if rfOK {
		c.Detail = fmt.Sprintf("error rate %.2f over %d requests in the newest %s", rf, n, span) + recentRule(s, s.FailureRate)
	}
	row(rows, c, tq)
}

// recentSpan is how long the newest quarter is.
func (in *ruleInput) recentSpan() time.Duration {
	return time.Duration(in.recentLen) * in.s.Bucket
}

// throttled: the window's 429 rate at ThrottleRate, confirmed by the
// newest quarter when it has requests; or the newest quarter alone with
// RecentMinRequests there and the window (or, while the window is below
// half the threshold, its newest half) at half the threshold. Held when
// the peers answer 429 too (PoolThrottleHold). A trip lasts at least the
// largest retry-after of the window.
func (in *ruleInput) throttled(rows *[]RuleCheck, r *ruleResult) {
	s, v := in.s, &in.b.view
	r429, r429OK := v.tripRate429(s.ThrottleRateCounts)
	half429, halfOK := in.newestHalf429(r429, r429OK)
	considered := r429OK && (r429 >= s.ThrottleRate/2 || halfOK)
	var rr float64
	var rrOK bool
	var rn uint64
	if considered || rows != nil {
		rec := in.recentStats()
		rr, rrOK = rec.tripRate429(s.ThrottleRateCounts)
		rn = rec.counted
	}
	windowFires := r429OK && r429 >= s.ThrottleRate
	recentFires := considered && !windowFires && s.RecentMinRequests > 0 && rrOK && rr >= s.ThrottleRate && rn >= uint64(s.RecentMinRequests)
	span := in.recentSpan()
	var reason string
	severity := r429 / s.ThrottleRate
	label := rate429Label(s)
	switch {
	case windowFires && (!rrOK || rr >= s.ThrottleRate):
		reason = fmt.Sprintf("%s %.2f >= %.2f over %d requests", label, r429, s.ThrottleRate, v.counted)
	case windowFires:
		r.heldByRecency++
	case recentFires && halfOK:
		reason = fmt.Sprintf("%s %.2f >= %.2f over the newest %s (%d requests; %.2f over the newest %s)",
			label, rr, s.ThrottleRate, fmtDur(span), rn, half429, fmtDur(2*span))
		severity = rr / s.ThrottleRate
	case recentFires:
		reason = fmt.Sprintf("%s %.2f >= %.2f over the newest %s (%d requests; %.2f over %s)",
			label, rr, s.ThrottleRate, fmtDur(span), rn, r429, fmtDur(s.Window))
		severity = rr / s.ThrottleRate
	}
	// 429s of every kind over the newest quarter (ThrottleRefuseRate): a
	// backend refusing nearly everything, bare 429s included.
	ref := in.refusing()
	byRefuse := reason == "" && ref.fires
	if byRefuse {
		reason = fmt.Sprintf("429 rate %.2f >= %.2f over the newest %s (%d requests), bare 429s included",
			ref.rate, s.ThrottleRefuseRate, fmtDur(span), ref.n)
		severity = ref.rate / s.ThrottleRefuseRate
	}
	// A run of ConsecutiveThrottled 429s, latched when it happened.
	runFires := s.ConsecutiveThrottled > 0 && in.latch.latch429 > 0
	byRun := reason == "" && runFires
	if byRun {
		reason = fmt.Sprintf("%d consecutive 429s", in.latch.latch429)
		severity = float64(in.latch.latch429) / float64(s.ConsecutiveThrottled)
	}
	var peer429 float64
	poolHold := false
	if (reason != "" || rows != nil) && s.PoolThrottleHold > 0 {
		peer429, poolHold = in.poolThrottleHold(byRun, byRefuse)
	}
	var t *trip
	if reason != "" && !poolHold {
		r.want[gateThrottled] = true
		wait := msDuration(v.maxRetryMs)
		if wait > 0 {
			reason += "; retry-after " + fmtDur(wait)
		}
		t = &trip{b: in.b, cause: CauseThrottled, reason: reason, minOpen: wait, severity: severity}
		r.add(*t)
	}
	if rows == nil {
		return
	}
	var tw, tq, tref, trun *trip
	switch {
	case byRun:
		trun = t
	case byRefuse:
		tref = t
	case windowFires:
		tw = t
	default:
		tq = t
	}
	in.throttledRows(rows, throttledView{r429: r429, ok: r429OK, rr: rr, rrOK: rrOK, rn: rn, half429: half429, halfOK: halfOK,
		windowFires: windowFires, recentFires: recentFires, peer429: peer429, poolHold: poolHold}, tw, tq)
	in.throttledRefuseRow(rows, ref, byRefuse, poolHold, peer429, tref)
	in.throttledRunRow(rows, runFires, byRun, poolHold, peer429, trun)
}

// poolThrottleHold is the pool-wide hold of a 429 trip, and the peer rate
// it read.
//
// Every backend answering 429 is a saturated pool, not a broken backend:
// opening one moves its load onto the others, which then 429 more.
//
// A run of 429s is weaker evidence than a rate over the newest quarter,
// and it comes sooner: at the start of an overload the first backends
// whose queues fill answer five 429s in a row before the peers' newest
// quarter shows any (the simulator's overload opened two backends per
// seed with the quarter's hold). So a run is taken only while no peer
// answered more than a fifth of the hold in 429s over the newest two
// buckets, the run's own time scale (peerMax429).
//
// The refusal rule counts bare 429s, a full queue's, so it takes the same
// strict hold over its own quarter: a backend refuses while its peers
// serve, not while any of them answers 429s too (with the median's hold it
// opened a slow backend of an overloaded unequal fleet on the Mooncake
// trace, and the errors rose 5-7%). The rate rules hold on the peers'
// median over the newest quarter.
func (in *ruleInput) poolThrottleHold(byRun, byRefuse bool) (peer429 float64, hold bool) {
	s := in.s
	var ok bool
	switch {
	case byRun:
		peer429, ok = peerMax429(in.b, in.bs, min(2, in.recentLen))
		return peer429, ok && peer429 >= s.PoolThrottleHold/5
	case byRefuse:
		peer429, ok = peerMax429(in.b, in.bs, in.recentLen)
		return peer429, ok && peer429 >= s.PoolThrottleHold/5
	}
	peer429, ok = peerRecent429(in.b, in.bs, in.recentLen)
	return peer429, ok && peer429 >= s.PoolThrottleHold
}

// refusal is what the refusal rule (Settings.ThrottleRefuseRate) read:
// the 429 rate of every kind over the newest quarter and its requests.
type refusal struct {
	rate         float64
	n            uint64
	ok, on       bool // a rate over the quarter; the rule is on
	fires        bool // before the pool's hold
	minRequests  int  // the requests the quarter needs
	notEvaluated bool // the window holds too few 429s for the quarter to fire: not read
}

// refusing reads the refusal rule: every 429 (bare or hinted) over the
// newest quarter, at ThrottleRefuseRate with at least RecentMinRequests
// counted there (MinRequests when the quarter trip is off). The quarter
// is merged only when the window holds enough 429s for it to fire.
func (in *ruleInput) refusing() refusal {
	s := in.s
	r := refusal{on: s.ThrottleRefuseRate > 0, minRequests: s.RecentMinRequests}
	if r.minRequests <= 0 {
		r.minRequests = s.MinRequests
	}
	if !r.on {
		return r
	}
	if float64(in.b.view.throttled()) < s.ThrottleRefuseRate*float64(r.minRequests) {
		r.notEvaluated = true
		return r
	}
	rec := in.recentStats()
	r.rate, r.ok = rec.rate429()
	r.n = rec.counted
	r.fires = r.ok && r.rate >= s.ThrottleRefuseRate && r.n >= uint64(r.minRequests)
	return r
}

// throttledRefuseRow is the refusal rule's row (throttle_refuse_rate).
func (in *ruleInput) throttledRefuseRow(rows *[]RuleCheck, r refusal, byRefuse, poolHold bool, peer429 float64, t *trip) {
	if rows == nil {
		return
	}
	s := in.s
	span := fmtDur(in.recentSpan())
	if r.notEvaluated || (r.on && !r.ok) {
		// explain reads the quarter whatever the window holds.
		rec := in.recentStats()
		r.rate, r.ok = rec.rate429()
		r.n = rec.counted
	}
	c := RuleCheck{Rule: RuleThrottledRefuse, Value: r.rate, Threshold: s.ThrottleRefuseRate, HasValue: r.on && r.ok, Fires: r.fires}
	switch {
	case !r.on:
		c.Detail = "off (throttle_refuse_rate < 0)"
	case !r.ok:
		c.Detail = fmt.Sprintf("no counted request in the newest %s", span)
	default:
		c.Detail = fmt.Sprintf("429 rate %.2f over %d requests in the newest %s, bare 429s included (opens at %.2f with at least %d requests)",
			r.rate, r.n, span, s.ThrottleRefuseRate, r.minRequests)
	}
	switch {
	case r.fires && poolHold && byRefuse:
		c.HeldBy = HeldByPoolThrottle
		c.Detail += fmt.Sprintf("; a peer's 429 rate over the newest %s is %.2f (the rule needs every peer's under pool_throttle_hold / 5, %.2f)",
			span, peer429, s.PoolThrottleHold/5)
	case r.fires && !byRefuse && poolHold:
		c.HeldBy = HeldByPoolThrottle
		c.Detail += fmt.Sprintf("; the hinted 429 rate rule comes first, and a peer's 429 rate (%.2f) holds it", peer429)
	case r.fires && !byRefuse:
		c.Detail += "; the hinted 429 rate rule opens it first"
	}
	row(rows, c, t)
}

// throttledRunRow is the row of the run of 429s (consecutive_throttled).
func (in *ruleInput) throttledRunRow(rows *[]RuleCheck, runFires, byRun, poolHold bool, peer429 float64, t *trip) {
	s := in.s
	c := RuleCheck{Rule: RuleThrottledRun, Value: float64(max(in.latch.run429, in.latch.latch429)), Threshold: float64(s.ConsecutiveThrottled),
		HasValue: true, Fires: runFires}
	kind := "429s with a retry hint"
	if s.ThrottledRunCounts == RunCountsAll {
		kind = "429s"
	}
	c.Detail = fmt.Sprintf("%d %s in a row (opens at %d)", int(c.Value), kind, s.ConsecutiveThrottled)
	switch {
	case s.ConsecutiveThrottled <= 0:
		c.Detail, c.HasValue = "off (consecutive_throttled < 0)", false
	case runFires && poolHold:
		c.HeldBy = HeldByPoolThrottle
		c.Detail += fmt.Sprintf("; a peer's 429 rate over the newest 2 buckets is %.2f (a run needs every peer's under pool_throttle_hold / 5, %.2f)", peer429, s.PoolThrottleHold/5)
	case runFires && !byRun:
		c.Detail += "; the 429 rate rule opens it first"
	}
	row(rows, c, t)
}

// rate429Label names the 429 rate that opens a breaker in reasons: every
// 429's, or only the hinted ones' (Settings.ThrottleRateCounts).
func rate429Label(s *Settings) string {
	if s.ThrottleRateCounts == RunCountsAll {
		return "429 rate"
	}
	return "hinted 429 rate"
}

// newestHalf429 is the 429 rate of the newest half of the window, ok when
// it stands in for the whole (the window below half the threshold, the
// half at it or above). How long a window of earlier ok answers takes to
// dilute depends on how much traffic the throttling backend still draws,
// which falls with the number of routers (its instant 429s win fewer
// in-flight comparisons when each router has little in flight): at 16
// routers that alone held the trip to 11-13 s (docs/EVALUATION.md
// "Detection").
func (in *ruleInput) newestHalf429(r429 float64, r429OK bool) (float64, bool) {
	s, v := in.s, &in.b.view
	if !r429OK || v.throttled() == 0 || s.RecentMinRequests <= 0 || r429 >= s.ThrottleRate/2 {
		return 0, false
	}
	half := in.b.win.recent(2 * in.recentLen)
	h, ok := half.tripRate429(s.ThrottleRateCounts)
	return h, ok && h >= s.ThrottleRate/2
}

// throttledView is what the 429 rule computed, for its rows.
type throttledView struct {
	r429, rr, half429, peer429         float64
	ok, rrOK, halfOK                   bool
	rn                                 uint64
	windowFires, recentFires, poolHold bool
}

// throttledRows are the 429 rule's two rows: the window, and the newest
// quarter (with the newest half when it stands in for the window).
func (in *ruleInput) throttledRows(rows *[]RuleCheck, x throttledView, tw, tq *trip) {
	s, v := in.s, &in.b.view
	span := in.recentSpan()
	held := fmt.Sprintf("; the peers' median 429 rate is %.2f (pool_throttle_hold %.2f)", x.peer429, s.PoolThrottleHold)
	c := RuleCheck{Rule: CauseThrottled, Value: x.r429, Threshold: s.ThrottleRate, HasValue: x.ok, Fires: x.windowFires}
	c.Detail = "no counted request in the window"
	if x.ok {
		c.Detail = fmt.Sprintf("%s %.2f over %d requests (opens at %.2f)", rate429Label(s), x.r429, v.counted, s.ThrottleRate)
		switch {
		case x.windowFires && x.rrOK && x.rr < s.ThrottleRate:
			c.HeldBy = HeldByRecency
			c.Detail += fmt.Sprintf("; the newest %s is at %.2f", fmtDur(span), x.rr)
		case x.windowFires && x.poolHold:
			c.HeldBy = HeldByPoolThrottle
			c.Detail += held
		}
	}
	row(rows, c, tw)
	c = RuleCheck{Rule: RuleThrottledRecent, Value: x.rr, Threshold: s.ThrottleRate, HasValue: x.rrOK, Fires: x.recentFires}
	c.Detail = fmt.Sprintf("no counted request in the newest %s", fmtDur(span))
	if x.rrOK {
		c.Detail = fmt.Sprintf("%s %.2f over %d requests in the newest %s", rate429Label(s), x.rr, x.rn, fmtDur(span)) + recentRule(s, s.ThrottleRate)
		if x.halfOK {
			c.Detail += fmt.Sprintf("; the window is at %.2f, its newest %s at %.2f, which stands in for it", x.r429, fmtDur(2*span), x.half429)
		}
		if x.recentFires && x.poolHold {
			c.HeldBy = HeldByPoolThrottle
			c.Detail += held
		}
	}
	row(rows, c, tq)
}

// slow: the TTFT EWMA above SlowFactor times the peers' median EWMA (a
// cheap screen), confirmed by the window's median TTFT against the peers'
// window medians (TTFT is heavy-tailed: one slow sample moves an EWMA with
// alpha 0.2 by a fifth of its size, the median only when most requests
// are slow).
func (in *ruleInput) slow(rows *[]RuleCheck, r *ruleResult) {
	s, b := in.s, in.b
	c := RuleCheck{Rule: CauseSlow, Threshold: s.SlowFactor}
	c.Detail = "no TTFT sample yet"
	if !b.hasEWMA {
		row(rows, c, nil)
		return
	}
	median, ok := in.peers.medianWithout(b.ewma)
	if !ok {
		c.Detail = fmt.Sprintf("ewma ttft %.0fms; no peer with a TTFT to compare with", b.ewma)
		row(rows, c, nil)
		return
	}
	c.HasValue, c.Value = true, b.ewma/median
	c.Fires = b.ewma > s.SlowFactor*median
	var t *trip
	var own, peerMedian float64
	confirmed := false
	if c.Fires {
		own, peerMedian, confirmed = slowConfirmed(b, in.bs, s.SlowFactor)
		if confirmed {
			r.want[gateSlow] = true
			t = &trip{b: b, cause: CauseSlow,
				reason: fmt.Sprintf("median ttft %.0fms > %.1f x pool median %.0fms (ewma %.0fms) over %d requests",
					own, s.SlowFactor, peerMedian, b.ewma, b.view.counted),
				severity: own / (s.SlowFactor * peerMedian)}
			r.add(*t)
		} else {
			r.heldByMedian++
		}
	}
	if rows == nil {
		return
	}
	c.Detail = fmt.Sprintf("ewma ttft %.0fms is %.1f x the peers' median %.0fms (opens above %.1f x)", b.ewma, c.Value, median, s.SlowFactor)
	switch {
	case !c.Fires:
	case !confirmed && peerMedian > 0:
		c.HeldBy = HeldByMedian
		c.Detail += fmt.Sprintf("; the window median %.0fms is not above %.1f x the peers' %.0fms", own, s.SlowFactor, peerMedian)
	case !confirmed:
		c.HeldBy = HeldByMedian
		c.Detail += "; no window median to confirm it"
	default:
		c.Detail += fmt.Sprintf("; confirmed by the window median %.0fms against the peers' %.0fms", own, peerMedian)
	}
	row(rows, c, t)
}

// clientErrors: the client-error rate far above the peers' on the same
// traffic (clienterr.go's checkClientErrors decides; explainClientErrors
// prints the same check).
func (in *ruleInput) clientErrors(rows *[]RuleCheck, r *ruleResult) {
	s, b := in.s, in.b
	errs := b.view.clientErrors()
	if errs == 0 && rows == nil {
		return
	}
	if in.client == nil {
		// findTrips builds the peers' rates when a closed backend has
		// client errors; an operator's question is not the hot path, and
		// its rows show the peers anyway.
		built := buildClientPeers(s, in.bs)
		in.client = &built
	}
	c := checkClientErrors(s, b, in.client)
	var t *trip
	switch {
	case errs > 0 && c.opens():
		r.want[gateClientError] = true
		t = &trip{b: b, cause: CauseClientError, reason: c.reason, severity: c.severity}
		r.add(*t)
	case errs > 0 && c.heldByRecency:
		r.heldByRecency++
	}
	if rows == nil {
		return
	}
	w, q := explainClientErrors(s, b, &c)
	if c.fires && !c.heldByRecency {
		row(rows, w, t)
		row(rows, q, nil)
		return
	}
	row(rows, w, nil)
	row(rows, q, t)
}
