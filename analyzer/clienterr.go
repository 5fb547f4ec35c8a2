package analyzer

import (
	"fmt"
	"sort"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The client-error rule (docs/PROTOCOL.md "Client errors against the
// peers"; docs/DECISIONS.md "Backend faults versus request faults").
//
// A client_error (a 4xx other than 408, 429 and 499) is the request's
// fault when every backend of the pool answers it alike, and the backend's
// when the backend answers it and its peers do not: a replica restarted
// with another model answers 404 to every request its peers serve, a
// deployment whose key was revoked answers 401 or 403. So the rule compares
// a backend's client-error rate, client_error / (counted + client_error),
// with the median rate of its peers on the same traffic, and never with a
// fixed number alone: a flood of bad requests raises every backend's rate
// together and opens nothing (the opposite mistake, sglang's router opening
// every worker on bad client requests, sgl-project/sglang#25811).
//
// It opens a closed backend when
//
//   - its window holds at least MinRequests answered requests (counted plus
//     client errors: a backend answering nothing but 404s is evaluated),
//   - at least one peer (another backend of the pool, not open, with at
//     least MinRequests answered requests of its own) is there to compare
//     with: a pool of one cannot tell the backend's fault from the
//     requests',
//   - its rate is at least ClientErrorRate and at least ClientErrorMargin
//     above the peers' median,
//   - and the newest quarter of the window, when it has answered requests,
//     says the same against the peers' median over their newest quarter.
//
// As the failure-rate rule, it may also trip on the newest quarter alone
// (RecentMinRequests answered requests there, past both thresholds) when
// the whole window is at least half of both.

// clientPeerRates are the client-error rates of the pool's backends that
// may be peers (peerEligible), sorted: over the window and over the newest
// quarter (those with answered requests there).
type clientPeerRates struct {
	window, recent peers
	recentOf       map[*backend]float64 // the newest quarter's rate of each eligible backend that has one
}

// peerEligible reports whether o may be a peer of the client-error rule.
func peerEligible(s *Settings, o *backend) bool {
	return o.state != fleetwatch.StateOpen && o.view.answered() >= uint64(s.MinRequests)
}

// clientRuleNeeded reports whether the rule has anything to look at in the
// pool: it is on and some closed backend has a client error in its window.
// The peers' rates are computed only then, so a pool without 4xx pays
// nothing for the rule.
func clientRuleNeeded(s *Settings, bs []*backend) bool {
	if s.ClientErrorRate <= 0 {
		return false
	}
	for _, b := range bs {
		if b.state == fleetwatch.StateClosed && b.view.clientErrors() > 0 {
			return true
		}
	}
	return false
}

// buildClientPeers computes the rates of bs's eligible peers; the views
// must be current.
func buildClientPeers(s *Settings, bs []*backend, recentLen int64) clientPeerRates {
	c := clientPeerRates{recentOf: map[*backend]float64{}}
	for _, o := range bs {
		if !peerEligible(s, o) {
			continue
		}
		r, _ := o.view.clientErrorRate()
		c.window = append(c.window, r)
		st := o.win.recent(recentLen)
		if rr, ok := st.clientErrorRate(); ok {
			c.recent = append(c.recent, rr)
			c.recentOf[o] = rr
		}
	}
	sort.Float64s(c.window)
	sort.Float64s(c.recent)
	return c
}

// medianOfOthers is the median of v without one value equal to own when
// ownIn (own is one of v's values); ok is false when no other value is
// left.
func medianOfOthers(v peers, own float64, ownIn bool) (float64, bool) {
	if !ownIn {
		if len(v) == 0 {
			return 0, false
		}
		return median(v), true
	}
	return v.medianWithout(own)
}

// clientErrorCheck is the client-error rule's numbers for one backend.
type clientErrorCheck struct {
	rate    float64 // over the window
	n       uint64  // answered requests in the window
	hasRate bool

	recent    float64 // over the newest quarter
	recentN   uint64
	hasRecent bool

	peerMedian       float64 // the peers' median over the window
	peerRecentMedian float64 // over their newest quarter (the window's when none has one)
	hasPeers         bool

	// fires: the window's rate is past both thresholds (the gate aside);
	// heldByRecency: it fires but the newest quarter does not confirm it;
	// recentFires: the newest-quarter trip.
	fires, heldByRecency, recentFires bool

	reason   string
	severity float64
}

// opens reports whether the check opens the backend, the gate aside.
func (c *clientErrorCheck) opens() bool { return (c.fires && !c.heldByRecency) || c.recentFires }

// checkClientErrors applies the rule to b (its view and recent the newest
// quarter of its window) against the peers' rates.
func checkClientErrors(s *Settings, b *backend, recent *windowStats, cp *clientPeerRates) clientErrorCheck {
	v := &b.view
	var c clientErrorCheck
	c.rate, c.hasRate = v.clientErrorRate()
	c.n = v.answered()
	c.recent, c.hasRecent = recent.clientErrorRate()
	c.recentN = recent.answered()
	if !c.hasRate || s.ClientErrorRate <= 0 {
		return c
	}
	own := peerEligible(s, b)
	c.peerMedian, c.hasPeers = medianOfOthers(cp.window, c.rate, own)
	if !c.hasPeers {
		return c
	}
	ownRecent, ownRecentIn := cp.recentOf[b]
	c.peerRecentMedian = c.peerMedian
	if m, ok := medianOfOthers(cp.recent, ownRecent, ownRecentIn); ok {
		c.peerRecentMedian = m
	}
	threshold, margin := s.ClientErrorRate, s.ClientErrorMargin
	recentPast := c.hasRecent && c.recent >= threshold && c.recent-c.peerRecentMedian >= margin
	window := fmtDur(s.Window)
	recentSpan := fmtDur(time.Duration(recentBuckets(s)) * s.Bucket)
	switch {
	case c.rate >= threshold && c.rate-c.peerMedian >= margin:
		c.fires = true
		if c.hasRecent && !recentPast {
			c.heldByRecency = true
			return c
		}
		c.reason = fmt.Sprintf("%s vs pool median %.2f over %d requests in %s",
			clientErrorLabel(&b.win.statusTotal, c.rate), c.peerMedian, c.n, window)
		c.severity = c.rate / threshold
	case s.RecentMinRequests > 0 && recentPast && c.recentN >= uint64(s.RecentMinRequests) &&
		c.rate >= threshold/2 && c.rate-c.peerMedian >= margin/2:
		c.recentFires = true
		c.reason = fmt.Sprintf("%s vs pool median %.2f over the newest %s (%d requests; %.2f vs %.2f over %s)",
			clientErrorLabel(&b.win.statusTotal, c.recent), c.peerRecentMedian, recentSpan, c.recentN, c.rate, c.peerMedian, window)
		c.severity = c.recent / threshold
	}
	return c
}
