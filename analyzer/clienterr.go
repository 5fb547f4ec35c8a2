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
//   - and the newest quarter of the window confirms it on the same
//     traffic: over the requests sent (ts - duration_ms) in each of its
//     buckets, to the backend and to its peers, the backend's client-error
//     rate is at least ClientErrorRate and at least ClientErrorMargin above
//     the rate it would have at its peers' rate of each bucket
//     (checkClientErrors).
//
// The newest quarter is counted by sending time, bucket by bucket,
// because "the same traffic" is the requests sent in the same second.
// Counted by answer, a peer's newest quarter at the start of a flood of
// bad requests is mostly the long generations it accepted before the
// flood, finishing ok, while the backend that rejects the bad requests
// fastest has the fewest in flight and draws most of the new ones: in the
// simulator (docs/EVALUATION.md "Client errors") that opened backends 48
// times in 20 runs of a flood of 100% bad requests at one router, and a
// quarter counted by sending time but not bucket by bucket still did, 15
// times (the quarter straddles the onset, and the backend drawing the new
// requests has more of them in it).
//
// As the failure-rate rule, it may also trip on the newest quarter alone
// (RecentMinRequests answered requests sent there, past both thresholds)
// when the whole window is at least half of both.

// clientPeerRates are what the rule compares a backend with: the
// client-error rates over the window of the pool's backends that may be
// peers (peerEligible), sorted, and the requests sent to them in each
// bucket of the newest quarter, summed (index 0 is the head bucket).
type clientPeerRates struct {
	window        peers
	sent, sentErr []uint64
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

// buildClientPeers computes the rates and sums of bs's eligible peers; the
// views must be current and the windows advanced to the same head.
func buildClientPeers(s *Settings, bs []*backend) clientPeerRates {
	n := recentBuckets(s)
	c := clientPeerRates{sent: make([]uint64, n), sentErr: make([]uint64, n)}
	for _, o := range bs {
		if !peerEligible(s, o) {
			continue
		}
		r, _ := o.view.clientErrorRate()
		c.window = append(c.window, r)
		for j := range n {
			sent, sentErr := o.win.sentIn(o.win.head - j)
			c.sent[j] += uint64(sent)
			c.sentErr[j] += uint64(sentErr)
		}
	}
	sort.Float64s(c.window)
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

	// Over the requests sent in the buckets of the newest quarter in which
	// a peer was sent requests too: the backend's rate, and the rate it
	// would have at its peers' rate of each of those buckets.
	recent, peerRecent float64
	recentN            uint64 // the backend's answered requests sent there
	hasRecent          bool

	peerMedian float64 // the peers' median over the window
	hasPeers   bool

	// fires: the window's rate is past both thresholds (the gate aside);
	// heldByRecency: it fires but the newest quarter does not confirm it;
	// recentFires: the newest-quarter trip.
	fires, heldByRecency, recentFires bool

	reason   string
	severity float64
}

// opens reports whether the check opens the backend, the gate aside.
func (c *clientErrorCheck) opens() bool { return (c.fires && !c.heldByRecency) || c.recentFires }

// checkClientErrors applies the rule to b against the peers' rates.
//
// The newest quarter is compared bucket by bucket of sending time, as a
// stratified comparison: in each bucket the peers' pooled rate times the
// backend's requests sent then is what the backend would show were it
// like its peers, and the sum over the buckets against its own client
// errors is its excess. A share of traffic that moves between backends
// as a flood starts (the backend that rejects fastest draws the most new
// requests) then shows no excess, while a backend rejecting what its
// peers serve in the same seconds does.
func checkClientErrors(s *Settings, b *backend, cp *clientPeerRates) clientErrorCheck {
	v := &b.view
	var c clientErrorCheck
	c.rate, c.hasRate = v.clientErrorRate()
	c.n = v.answered()
	if !c.hasRate || s.ClientErrorRate <= 0 {
		return c
	}
	own := peerEligible(s, b)
	c.peerMedian, c.hasPeers = medianOfOthers(cp.window, c.rate, own)
	if !c.hasPeers {
		return c
	}
	var ownErr uint64
	var expected float64
	for j := range cp.sent {
		sent, sentErr := b.win.sentIn(b.win.head - int64(j))
		peerSent, peerErr := cp.sent[j], cp.sentErr[j]
		if own {
			peerSent, peerErr = peerSent-uint64(sent), peerErr-uint64(sentErr)
		}
		if sent == 0 || peerSent == 0 {
			continue // nothing to compare in this bucket
		}
		c.recentN += uint64(sent)
		ownErr += uint64(sentErr)
		expected += float64(sent) * float64(peerErr) / float64(peerSent)
	}
	if c.hasRecent = c.recentN > 0; c.hasRecent {
		c.recent = float64(ownErr) / float64(c.recentN)
		c.peerRecent = expected / float64(c.recentN)
	}
	threshold, margin := s.ClientErrorRate, s.ClientErrorMargin
	// Without requests sent to the backend and to a peer in the same
	// buckets of the newest quarter there is nothing to confirm on.
	recentPast := c.hasRecent && c.recent >= threshold && c.recent-c.peerRecent >= margin
	switch {
	case c.rate >= threshold && c.rate-c.peerMedian >= margin:
		c.fires = true
		if !recentPast {
			c.heldByRecency = true
			return c
		}
		c.reason = fmt.Sprintf("%s vs pool median %.2f over %d requests in %s",
			clientErrorLabel(&b.win.statusTotal, c.rate), c.peerMedian, c.n, fmtDur(s.Window))
		c.severity = c.rate / threshold
	case s.RecentMinRequests > 0 && recentPast && c.recentN >= uint64(s.RecentMinRequests) &&
		c.rate >= threshold/2 && c.rate-c.peerMedian >= margin/2:
		c.recentFires = true
		c.reason = fmt.Sprintf("%s vs the peers' %.2f on the requests sent in the newest %s (%d requests; %.2f vs pool median %.2f over %s)",
			clientErrorLabel(&b.win.statusTotal, c.recent), c.peerRecent, fmtDur(time.Duration(recentBuckets(s))*s.Bucket), c.recentN, c.rate, c.peerMedian, fmtDur(s.Window))
		c.severity = c.recent / threshold
	}
	return c
}
