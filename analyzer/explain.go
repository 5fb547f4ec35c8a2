package analyzer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Explanation is why a backend is in its state and has its weight: the
// window's counts, every rule's value against its threshold, what held a
// rule back, the parts of the weight, and the state an evaluation at At
// would leave it in. Explain builds it by running the pool's evaluation
// (evaluatePool, the code that makes the decisions) on a copy of the pool,
// so the verdict is the decision, not a second implementation of it.
type Explanation struct {
	Pool    string          `json:"pool"`
	Backend string          `json:"backend"`
	At      fleetwatch.Time `json:"at"`

	// State, Since, Reason and Weight are the current decision (as of the
	// latest Evaluate); Reason is the snapshot's.
	State  fleetwatch.State `json:"state"`
	Since  fleetwatch.Time  `json:"since,omitzero"`
	Reason string           `json:"reason"`
	Weight float64          `json:"weight"`
	// OpenUntil is when an open breaker becomes half-open (zero unless
	// open); Trips counts its consecutive trips.
	OpenUntil fleetwatch.Time `json:"open_until,omitzero"`
	Trips     int             `json:"trips"`
	// QuotaUntil is when an open backend's spent quota resets (zero
	// unless it is out of quota: then OpenUntil is the same time).
	QuotaUntil fleetwatch.Time `json:"quota_until,omitzero"`

	// Verdict is the state an Evaluate at At leaves the backend in, with
	// the cause and reason of the transition it makes ("" when none), and
	// VerdictWeight the weight it publishes.
	Verdict       fleetwatch.State `json:"verdict"`
	VerdictCause  string           `json:"verdict_cause,omitempty"`
	VerdictReason string           `json:"verdict_reason,omitempty"`
	VerdictWeight float64          `json:"verdict_weight"`

	// WindowMs is the sliding window; Counts its events by outcome name,
	// Requests all of them and Counted those the rates and the gate count
	// (ok, error, timeout, throttled). Recent is the newest quarter of the
	// window, on which the rate rules are confirmed.
	WindowMs int64             `json:"window_ms"`
	Counts   map[string]uint64 `json:"counts"`
	Requests uint64            `json:"requests"`
	Counted  uint64            `json:"counted"`
	Recent   RecentWindow      `json:"recent"`

	// Evaluated is false while the min_requests gate keeps every rate rule
	// from opening the backend ("not evaluated": Counted < MinRequests, and
	// Counted plus the client errors below it too while the client-error
	// rule is on, since that rule's gate counts them).
	Evaluated   bool `json:"evaluated"`
	MinRequests int  `json:"min_requests"`

	// Rules are the trip rules in the order they are tried. They apply to
	// a closed backend; for an open or half-open one they show the numbers
	// only.
	Rules []RuleCheck `json:"rules"`
	// CapHeld is the ejection cap's hold ("" when it does not hold the
	// backend at At).
	CapHeld string `json:"cap_held,omitempty"`
	// HalfOpenOK counts the ok events in a row of a half-open backend,
	// of HalfOpenSuccesses needed to close it.
	HalfOpenOK        int `json:"half_open_ok,omitempty"`
	HalfOpenSuccesses int `json:"half_open_successes,omitempty"`

	// WeightParts are the parts of VerdictWeight.
	WeightParts WeightParts `json:"weight_parts"`

	// Override is the operator override in force at At (nil when none):
	// snapshots publish the backend as it says, while everything above is
	// the analyzer's own judgement underneath (override.go).
	Override *fleetwatch.Override `json:"override,omitempty"`
	// Shadow is the pool's shadow mode ("" when off): the decision is
	// advisory (shadow.go).
	Shadow fleetwatch.Shadow `json:"shadow,omitempty"`
}

// RecentWindow is the newest quarter of the window (at least one bucket).
type RecentWindow struct {
	SpanMs   int64  `json:"span_ms"`
	Requests uint64 `json:"requests"`
	Counted  uint64 `json:"counted"`
}

// Rule names of RuleCheck: the causes, and the newest-quarter variants of
// the rate rules.
const (
	RuleFailureRateRecent = "failure_rate_recent"
	RuleThrottledRecent   = "throttled_recent"
	RuleThrottledRun      = "throttled_consecutive"
	RuleThrottledRefuse   = "throttled_refuse"
	RuleClientErrorRecent = "client_error_rate_recent"
)

// Holds of RuleCheck.HeldBy: what kept a rule that fired from opening the
// backend.
const (
	HeldByGate         = "gate"          // fewer than min_requests counted requests
	HeldByRecency      = "recency"       // the newest quarter of the window is below the threshold
	HeldByMedian       = "median"        // the window median TTFT does not confirm the EWMA
	HeldByPoolThrottle = "pool_throttle" // the peers answer 429 too: the pool is saturated
	HeldByCap          = "cap"           // the ejection cap
)

// RuleCheck is one trip rule's value against its threshold.
type RuleCheck struct {
	// Rule is a Cause* constant or a Rule* constant.
	Rule string `json:"rule"`
	// Value and Threshold are the rule's numbers (a rate, a count, or TTFT
	// milliseconds for slow); HasValue is false when the window has nothing
	// to compute it from.
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	HasValue  bool    `json:"has_value"`
	// Fires is true when the value is past the threshold; HeldBy names
	// what kept it from opening the backend ("" when nothing did).
	Fires  bool   `json:"fires"`
	HeldBy string `json:"held_by,omitempty"`
	// Detail is a sentence with the numbers.
	Detail string `json:"detail"`
	// TripReason is the reason the rule opens the backend with when it
	// fires and nothing holds it (the transition's reason, word for word;
	// "" when the rule does not open it).
	TripReason string `json:"trip_reason,omitempty"`
}

// WeightParts are the parts of a backend's weight.
type WeightParts struct {
	// Fixed names a weight set by state rather than computed: "open",
	// "half_open", "cap_held", "quarantine", or "" for a closed backend's
	// computed weight.
	Fixed string `json:"fixed,omitempty"`
	// Rate429 and Observed: the 429 pressure, observed weight
	// 1 - rate_429/throttle_rate clipped to [0, 1].
	Rate429  float64 `json:"rate_429"`
	Observed float64 `json:"observed"`
	// Prior, N and K: the shrinkage toward the pool prior,
	// (N*Observed + K*Prior)/(N + K).
	Prior float64 `json:"prior"`
	N     uint64  `json:"n"`
	K     int     `json:"k"`
	// Target is the shrunk weight after the HalfOpenWeight floor (Floored
	// when the floor applied).
	Target  float64 `json:"target"`
	Floored bool    `json:"floored,omitempty"`
	// Damped is true when the weight moves toward Target by at most Step
	// per heartbeat and has not reached it.
	Damped bool    `json:"damped,omitempty"`
	Step   float64 `json:"step,omitempty"`
	// Reason is the sentence the snapshot carries ("" for a weight of 1
	// with nothing lowering it).
	Reason string `json:"reason,omitempty"`
}

// Explain explains backendID of poolID at now; ok is false when the
// analyzer does not know them. It changes nothing the analyzer decides: the
// verdict comes from the pool's evaluation run on a copy of the pool. It
// is meant for an operator's question, not for every tick: the copy costs
// about as much as one evaluation of the pool.
func (a *Analyzer) Explain(poolID, backendID string, now time.Time) (Explanation, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil || p.backends[backendID] == nil {
		return Explanation{}, false
	}
	return a.explain(p, []*backend{p.backends[backendID]}, now)[0], true
}

// ExplainPool is Explain for every backend of poolID, sorted by backend,
// from one evaluation of a copy of the pool; ok is false for an unknown
// pool.
func (a *Analyzer) ExplainPool(poolID string, now time.Time) (_ []Explanation, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[poolID]
	if p == nil {
		return nil, false
	}
	return a.explain(p, slices.Clone(p.sorted()), now), true
}

// explain explains targets, backends of p, at now.
func (a *Analyzer) explain(p *pool, targets []*backend, now time.Time) []Explanation {
	s := &p.settings
	// The windows are read as of now, as Snapshot reads them.
	p.advance(now)
	prior := weightPrior(s, p.sorted())
	cp, out := a.dryRun(p, now)
	bs := cp.sorted()
	cprior := weightPrior(s, bs)
	openedByTrip := map[*backend]bool{}
	for _, t := range out.Transitions {
		if t.From == fleetwatch.StateClosed && t.To == fleetwatch.StateOpen {
			openedByTrip[cp.backends[t.Backend]] = true
		}
	}
	recentLen := recentBuckets(s)
	es := make([]Explanation, len(targets))
	copies := make([]*backend, len(targets))
	closedAtTrips := make([]bool, len(targets))
	for i, b := range targets {
		cb := cp.backends[b.id]
		expired := cb == nil
		if expired {
			// The evaluation drops it (expiry): explain from the backend
			// as it is, with no verdict state.
			nb := *b
			cb = &nb
		}
		copies[i] = cb
		es[i] = a.explainState(p, cp, b, cb, expired, out, now, prior, cprior)
		// The rules ran on the backends closed when the trips were looked
		// for: the closed ones after the run and those a trip opened in it.
		closedAtTrips[i] = !expired && (cb.state == fleetwatch.StateClosed || openedByTrip[cb])
	}

	// The copy is put back in the state the trip rules saw (it is thrown
	// away), so that the rules' own helpers see the peers they saw.
	for o := range openedByTrip {
		o.state = fleetwatch.StateClosed
	}
	for i, b := range targets {
		e := &es[i]
		e.Rules = explainRules(s, b, copies[i], bs, copies[i].win.recent(recentLen))
		for j := range e.Rules {
			r := &e.Rules[j]
			if !closedAtTrips[i] {
				r.Fires, r.HeldBy, r.TripReason = false, "", ""
				continue
			}
			gated := copies[i].view.counted < uint64(s.MinRequests)
			if r.Rule == CauseClientError || r.Rule == RuleClientErrorRecent {
				// This rule's gate counts the client errors too.
				gated = copies[i].view.answered() < uint64(s.MinRequests)
			}
			if r.Fires && r.HeldBy == "" && r.Rule != CauseConsecutive && gated {
				r.HeldBy, r.TripReason = HeldByGate, ""
			}
		}
		// The cap holds the first rule that would open the backend, and
		// with it the backend: no rule opens it.
		if e.CapHeld != "" {
			held := false
			for j := range e.Rules {
				r := &e.Rules[j]
				if r.Fires && r.HeldBy == "" && !held {
					r.HeldBy, held = HeldByCap, true
				}
				r.TripReason = ""
			}
		}
	}
	return es
}

// explainState is b's explanation but for its rules: its state and the
// verdict of the dry run out on cp (cb, b's copy there), the window, the
// gate and the weight's parts.
func (a *Analyzer) explainState(p, cp *pool, b, cb *backend, expired bool, out Evaluation, now time.Time, prior, cprior float64) Explanation {
	s := &p.settings
	e := Explanation{
		Pool: p.id, Backend: b.id, At: fleetwatch.At(now),
		State: b.state, Weight: b.weight, Trips: b.trips,
		Reason:  a.snapshotReason(p, b, prior),
		Verdict: cb.state, VerdictWeight: cb.weight,
		WindowMs: s.Window.Milliseconds(), Counts: map[string]uint64{},
		MinRequests: s.MinRequests,
	}
	if !b.weightSet {
		e.Weight = 1
	}
	if o, ok := a.overrideOf(p.id, b.id, now); ok {
		e.Override = &o
	}
	e.Shadow = p.shadow
	if !cb.weightSet {
		e.VerdictWeight = 1
	}
	if expired {
		e.Verdict = "" // the evaluation drops the backend (see VerdictCause)
	}
	if !b.since.IsZero() {
		e.Since = fleetwatch.At(b.since)
	}
	if b.state == fleetwatch.StateOpen {
		e.OpenUntil = fleetwatch.At(b.openUntil)
		if b.tripCause == CauseQuota && !b.quotaUntil.IsZero() {
			e.QuotaUntil = fleetwatch.At(b.quotaUntil)
		}
	}
	if b.state == fleetwatch.StateHalfOpen {
		e.HalfOpenOK, e.HalfOpenSuccesses = b.halfOpenOK, s.HalfOpenSuccesses
	}
	for _, t := range out.Transitions {
		if t.Backend == b.id {
			e.VerdictCause, e.VerdictReason = t.Cause, t.Reason
		}
	}
	// The window as the rules saw it in the run (a backend that
	// became half-open starts from an empty one).
	v := &cb.view
	for o, n := range v.counts {
		if n > 0 {
			e.Counts[fleetwatch.Outcome(o).String()] = n
		}
	}
	e.Requests, e.Counted = v.requests, v.counted
	recent := cb.win.recent(recentBuckets(s))
	e.Recent = RecentWindow{SpanMs: (time.Duration(recentBuckets(s)) * s.Bucket).Milliseconds(), Requests: recent.requests, Counted: recent.counted}
	e.Evaluated = v.counted >= uint64(s.MinRequests) || s.ClientErrorRate > 0 && v.answered() >= uint64(s.MinRequests)
	e.WeightParts = a.weightParts(cp, cb, cprior)
	if cb.holdReason != "" { // a trip, or a half-open verdict, the cap holds
		e.CapHeld = cb.holdReason
	}
	return e
}

// dryRun evaluates a copy of p at now with a scratch analyzer and returns
// the copy and what the evaluation did. p's windows must be advanced to now:
// the copy shares them (evaluation only reads a window, except that it
// empties the window of a backend turning half-open, which gets a fresh
// one here).
func (a *Analyzer) dryRun(p *pool, now time.Time) (*pool, Evaluation) {
	scratch := &Analyzer{
		global: a.global, quarantine: a.quarantine, epoch: a.epoch, seed: a.seed,
		rng:    rand.New(rand.NewPCG(a.seed, a.seed^0x9e3779b97f4a7c15)),
		limits: a.limits, hasNow: true, lastNow: now,
	}
	scratch.stats.init()
	cp := *p
	cp.backends = make(map[string]*backend, len(p.backends))
	cp.order, cp.signature, cp.spare, cp.peers = nil, nil, nil, nil
	for id, b := range p.backends {
		nb := *b
		if b.state == fleetwatch.StateOpen && !now.Before(b.openUntil) {
			nb.win = newWindow(len(b.win.buckets), time.Duration(b.win.bucketNanos))
		}
		cp.backends[id] = &nb
	}
	var out Evaluation
	beat := cp.beat(now)
	loads := cp.loadBeat(now)
	scratch.evaluatePool(&cp, now, beat || loads, &out)
	return &cp, out
}

// explainRules is every trip rule's row for b (the real backend, for the
// consecutive run) and cb (its copy after the run, for the window): the
// rules findTrips applies, given rows to fill (checks.go).
func explainRules(s *Settings, b, cb *backend, bs []*backend, recent windowStats) []RuleCheck {
	in := ruleInput{s: s, latch: b, b: cb, bs: bs, peers: peerEWMAs(nil, bs), recentLen: recentBuckets(s),
		recent: recent, hasRecent: true}
	rows := make([]RuleCheck, 0, 9)
	in.apply(&rows)
	return rows
}

// explainClientErrors is the client-error rule's two rows: the window
// (held by recency when the newest quarter does not confirm it) and the
// newest-quarter trip. Value is the backend's rate and Threshold
// ClientErrorRate; the detail names the peers' median and the margin.
func explainClientErrors(s *Settings, cb *backend, c *clientErrorCheck) (w, q RuleCheck) {
	recentSpan := fmtDur(time.Duration(recentBuckets(s)) * s.Bucket)
	w = RuleCheck{Rule: CauseClientError, Threshold: s.ClientErrorRate}
	q = RuleCheck{Rule: RuleClientErrorRecent, Threshold: s.ClientErrorRate}
	if s.ClientErrorRate <= 0 {
		w.Detail = "off (client_error_rate < 0): client errors never count"
		q.Detail = w.Detail
		return w, q
	}
	w.Value, w.HasValue = c.rate, c.hasRate
	q.Value, q.HasValue = c.recent, c.hasRecent
	opensAt := fmt.Sprintf("opens at %.2f and %.2f above the peers' median", s.ClientErrorRate, s.ClientErrorMargin)
	switch {
	case !c.hasRate:
		w.Detail = "no answered request in the window"
	case !c.hasPeers:
		w.Detail = fmt.Sprintf("%s over %d requests; no peer with %d requests to compare with (the rule needs one)",
			clientErrorLabel(&cb.win.statusTotal, c.rate), c.n, s.MinRequests)
	default:
		w.Detail = fmt.Sprintf("%s vs the peers' median %.2f over %d requests in %s (%s)",
			clientErrorLabel(&cb.win.statusTotal, c.rate), c.peerMedian, c.n, fmtDur(s.Window), opensAt)
		w.Fires = c.fires
		switch {
		case c.heldByRecency && c.hasRecent:
			w.HeldBy = HeldByRecency
			w.Detail += fmt.Sprintf("; the requests sent in the newest %s are at %.2f vs the peers' %.2f", recentSpan, c.recent, c.peerRecent)
		case c.heldByRecency:
			w.HeldBy = HeldByRecency
			w.Detail += fmt.Sprintf("; no requests sent to it and to a peer in the newest %s to confirm it", recentSpan)
		}
	}
	switch {
	case !c.hasPeers:
		q.Detail = fmt.Sprintf("no peer with %d requests to compare with", s.MinRequests)
	case !c.hasRecent:
		q.Detail = fmt.Sprintf("no request sent to it and to a peer in the same second of the newest %s", recentSpan)
	default:
		q.Detail = fmt.Sprintf("client-error rate %.2f vs the peers' %.2f over %d requests sent in the newest %s (second by second)", c.recent, c.peerRecent, c.recentN, recentSpan)
		if s.RecentMinRequests <= 0 {
			q.Detail += " (the newest-quarter trip is off: recent_min_requests < 0)"
		} else {
			q.Detail += fmt.Sprintf(" (%s with %d requests there and the window at half of both)", opensAt, s.RecentMinRequests)
		}
		q.Fires = c.recentFires
	}
	return w, q
}

// recentRule says when the newest quarter trips on its own.
func recentRule(s *Settings, threshold float64) string {
	if s.RecentMinRequests <= 0 {
		return " (the newest-quarter trip is off: recent_min_requests < 0)"
	}
	return fmt.Sprintf(" (opens at %.2f with %d requests there and the window at %.2f or more)", threshold, s.RecentMinRequests, threshold/2)
}

// weightParts explains cb's weight after the run.
func (a *Analyzer) weightParts(p *pool, cb *backend, prior float64) WeightParts {
	s := &p.settings
	var w WeightParts
	switch {
	case cb.state == fleetwatch.StateOpen:
		w.Fixed = "open"
	case a.quarantine && cb.drift == fleetwatch.DriftDrifted:
		w.Fixed = "quarantine"
	case cb.state == fleetwatch.StateHalfOpen:
		w.Fixed = "half_open"
	case cb.holdReason != "":
		w.Fixed = "cap_held"
	}
	v := &cb.view
	w.Rate429, _ = v.rate429()
	w.Observed = observedWeight(s, v)
	w.Prior, w.N, w.K = prior, v.counted, shrinkK(s)
	unfloored := (float64(w.N)*w.Observed + float64(w.K)*prior) / float64(w.N+uint64(w.K))
	w.Target = shrunkWeight(s, v, prior)
	w.Floored = unfloored < s.HalfOpenWeight
	weight := cb.weight
	if !cb.weightSet {
		weight = 1
	}
	if w.Fixed == "" && cb.weightSet && math.Abs(roundWeight(w.Target)-weight) >= 1e-4 {
		w.Damped, w.Step = true, s.MaxWeightStep
	}
	w.Reason = weightReason(s, &w, weight)
	return w
}

// weightReason is the sentence of a closed backend's weight; "" when
// nothing lowers it or the state fixes it.
func weightReason(s *Settings, w *WeightParts, weight float64) string {
	if w.Fixed == "quarantine" {
		return "weight 0: drift quarantine (drifted)"
	}
	if w.Fixed != "" {
		return "" // the state's reason says it
	}
	var parts []string
	if w.Rate429 > 0 {
		parts = append(parts, fmt.Sprintf("429 pressure (rate_429 %.2f of throttle_rate %.2f gives %.2f)", w.Rate429, s.ThrottleRate, w.Observed))
	}
	if math.Abs(roundWeight(w.Target)-roundWeight(w.Observed)) >= 1e-4 && !w.Floored {
		parts = append(parts, fmt.Sprintf("shrinkage toward the pool's %.2f over %d requests (k %d) gives %.2f", w.Prior, w.N, w.K, w.Target))
	}
	if w.Floored {
		parts = append(parts, fmt.Sprintf("floored at half_open_weight %.2f", s.HalfOpenWeight))
	}
	if w.Damped {
		parts = append(parts, fmt.Sprintf("damping toward %.2f by %.2f per heartbeat", w.Target, w.Step))
	}
	if len(parts) == 0 || (weight == 1 && !w.Damped) {
		return ""
	}
	return fmt.Sprintf("weight %.2f: %s", weight, strings.Join(parts, ", "))
}

// snapshotReason is the reason a snapshot gives for b: the last state
// change's (or the cap's hold), then for a closed backend whether the gate
// still holds its rate rules ("not evaluated: 3 of 20 requests") and what
// lowers its weight. prior is the pool's weightPrior.
func (a *Analyzer) snapshotReason(p *pool, b *backend, prior float64) string {
	reason := b.reason()
	if b.state != fleetwatch.StateClosed || b.holdReason != "" {
		return reason
	}
	s := &p.settings
	var parts []string
	if reason != "" {
		parts = append(parts, reason)
	}
	switch v := &b.view; {
	case v.counted >= uint64(s.MinRequests):
	case v.answered() >= uint64(s.MinRequests) && s.ClientErrorRate > 0:
		// Many requests, most of them 4xx: the client-error rule weighs
		// them, so the backend is evaluated, if by that rule alone.
		parts = append(parts, fmt.Sprintf("%d client errors of %d requests, weighed against the peers' by the client-error rule; the other rate rules wait for %d counted (%d so far)",
			v.clientErrors(), v.answered(), s.MinRequests, v.counted))
	case v.answered() >= uint64(s.MinRequests):
		parts = append(parts, fmt.Sprintf("%d client errors of %d requests, weighed by no rule (client_error_rate is off); the rate rules wait for %d counted (%d so far)",
			v.clientErrors(), v.answered(), s.MinRequests, v.counted))
	case v.clientErrors() > 0 && s.ClientErrorRate > 0:
		// The client-error rule's gate, the nearest to opening.
		parts = append(parts, fmt.Sprintf("not evaluated: %d of %d requests, %d of them client errors", v.answered(), s.MinRequests, v.clientErrors()))
	default:
		parts = append(parts, fmt.Sprintf("not evaluated: %d of %d requests", v.counted, s.MinRequests))
	}
	if w := a.weightParts(p, b, prior); w.Reason != "" {
		parts = append(parts, w.Reason)
	}
	return strings.Join(parts, "; ")
}
