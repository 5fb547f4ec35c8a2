package analyzer

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// verdict is what the events seen while half-open decided, waiting for the
// next Evaluate to apply it. The first decisive event wins.
type verdict uint8

const (
	verdictNone        verdict = iota
	verdictClose               // HalfOpenSuccesses ok events in a row
	verdictFailure             // an error or timeout
	verdictThrottled           // a 429: the backend is not ready for traffic
	verdictClientError         // HalfOpenSuccesses client errors after a client_error_rate trip
)

// backend is the analyzer's state of one backend of one pool.
type backend struct {
	id         string
	configured bool
	priority   int
	cost       *float64

	win  window
	view windowStats // the window as of the latest Evaluate or Snapshots
	tpot *window     // time per output token samples (tpot.go); nil until the first

	// EWMA of TTFT over ok, non-cold samples (the seed's observe).
	ewma    float64
	hasEWMA bool

	// seen is false until the first event; lastSeen is the newest event
	// time, for the idle gap and expiry.
	seen     bool
	lastSeen time.Time

	// Breaker state machine.
	state      fleetwatch.State
	since      time.Time // when state was entered; zero until the first Evaluate
	generation uint64    // +1 per transition
	genStart   time.Time // events older than this belong to an older generation
	openUntil  time.Time
	// quotaUntil is when the backend's quota resets, by the latest
	// quota_reset_ms of a 429 (zero when none is ahead): it stays open
	// until then (rules.go openForQuota).
	quotaUntil time.Time
	trips      int    // consecutive trips since the backend last closed
	tripCause  string // the cause of the last opening

	run         int // failures in a row while closed
	runLatched  int // run length that reached ConsecutiveFailures, until Evaluate applies it
	stalls      int // stalled outcomes in the current run
	stallLatch  int // stalls that reached ConsecutiveStalls, until Evaluate applies it
	run429      int // 429s in a row (an ok ends the run)
	latch429    int // run429 when it reached ConsecutiveThrottled, until Evaluate looks at it
	halfOpenOK  int // ok events in a row while half-open
	halfOpen4xx int // client errors while half-open after a client_error_rate trip
	verdict     verdict
	verdictWait float64 // retry_after_ms of a half-open 429

	// Decision.
	weight      float64
	weightSet   bool
	weightAt    time.Time
	stateReason string // the reason of the last state change
	holdReason  string // set while the ejection cap holds a trip back
	drift       fleetwatch.DriftStatus

	// load is the latest load report (load.go).
	load loadState

	// Edge detection for the held-back counters.
	gateHeld [numCauses]bool
	// tripping: a rule wants to open b at the current Evaluate.
	tripping bool
}

func newBackend(id string, s *Settings) *backend {
	return &backend{
		id:    id,
		win:   newWindow(int(s.Window/s.Bucket), s.Bucket),
		state: fleetwatch.StateClosed,
		drift: fleetwatch.DriftUnknown,
	}
}

// reason is the snapshot's reason: the cap's hold while it lasts, else the
// last state change's.
func (b *backend) reason() string {
	if b.holdReason != "" {
		return b.holdReason
	}
	return b.stateReason
}

// observeOne applies one event (its time already clamped, its outcome
// valid) and reports whether it may have decided a breaker transition.
func (a *Analyzer) observeOne(p *pool, b *backend, ev *fleetwatch.Event, outcome fleetwatch.Outcome, ts time.Time) (urgent bool) {
	s := &p.settings
	num := b.win.bucketOf(ts)
	if !b.win.accepts(num) {
		// Older than the window: it says nothing about now, not even that
		// the backend is alive.
		a.stats.DroppedOld++
		return false
	}
	tsNs := ts.UnixNano()
	if ev.HasLoad() {
		b.observeEventLoad(ev, tsNs)
	}
	p.routers.observe(ev.Source, tsNs, int64(s.Window))
	first := !b.seen
	idle := !first && ts.Sub(b.lastSeen) > s.IdleGap
	if first || ts.After(b.lastSeen) {
		b.lastSeen = ts
	}
	b.seen = true

	if ts.Before(b.genStart) {
		// A late result from an older breaker generation: it must not
		// re-trip or close the current one (gobreaker's generations).
		a.stats.StaleGeneration++
		return false
	}

	// An ok TTFT outside the protocol's bounds (NaN, negative, beyond an
	// hour) is no sample: one would poison the EWMA for good.
	sample := outcome == fleetwatch.OutcomeOK && ev.TTFTKnown() &&
		ev.TTFTMs >= 0 && ev.TTFTMs <= fleetwatch.MaxDurationMs
	latency := sample && !ev.Cold
	switch {
	case sample && ev.Cold:
		a.stats.LatencySamplesDiscounted.Cold++
	case latency && first:
		a.stats.LatencySamplesDiscounted.First++
		latency = false
	case latency && idle:
		a.stats.LatencySamplesDiscounted.Idle++
		latency = false
	}
	var bin uint16
	if latency {
		if b.hasEWMA {
			b.ewma = s.EWMAAlpha*ev.TTFTMs + (1-s.EWMAAlpha)*b.ewma
		} else {
			b.ewma, b.hasEWMA = ev.TTFTMs, true
		}
		bin = binOf(ev.TTFTMs)
	}
	b.win.add(num, outcome, latency, bin, ev.RetryAfterMs)
	if outcome == fleetwatch.OutcomeClientError {
		b.win.addClientStatus(num, ev.Status)
	}
	if outcome.Counted() || outcome == fleetwatch.OutcomeClientError {
		sent := num
		if ev.DurationMs > 0 && ev.DurationMs <= fleetwatch.MaxDurationMs {
			sent = b.win.bucketOfNanos(tsNs - int64(ev.DurationMs*float64(time.Millisecond)))
		}
		b.win.addSent(sent, outcome == fleetwatch.OutcomeClientError)
	}
	if ms, ok := tpotSample(ev, outcome); ok {
		b.observeTPOT(num, ms)
	}
	quota := false
	if outcome == fleetwatch.OutcomeThrottled && ev.QuotaResetMs > 0 {
		if until := ts.Add(time.Duration(ev.QuotaResetMs * float64(time.Millisecond))).Round(time.Millisecond); until.After(b.quotaUntil) {
			b.quotaUntil, quota = until, true // out of quota: open it now
		}
	}
	return b.step(s, outcome, ev.RetryAfterMs) || quota
}

// step is the breaker's reaction to one outcome: the consecutive run of a
// closed backend, the verdict of a half-open one. urgent reports a run
// just latched or a verdict reached: the pool should be evaluated now.
func (b *backend) step(s *Settings, outcome fleetwatch.Outcome, retryAfterMs float64) (urgent bool) {
	switch b.state {
	case fleetwatch.StateClosed:
		switch {
		case outcome.IsFailure():
			b.run++
			if outcome == fleetwatch.OutcomeStalled {
				b.stalls++
			}
			if (b.run >= s.ConsecutiveFailures || b.stalls >= s.ConsecutiveStalls) && b.runLatched == 0 {
				b.runLatched = b.run
				if b.stalls >= s.ConsecutiveStalls {
					b.stallLatch = b.stalls
				}
				// A backend the ejection cap holds is looked at again at
				// the heartbeat, not at every failure.
				return b.holdReason == ""
			}
		case outcome == fleetwatch.OutcomeThrottled && retryAfterMs <= 0 && s.ThrottledRunCounts != RunCountsAll:
			b.run429 = 0 // a bare 429: a full queue, not a quota
		case outcome == fleetwatch.OutcomeThrottled:
			b.run429++
			if s.ConsecutiveThrottled > 0 && b.run429 >= s.ConsecutiveThrottled && b.latch429 == 0 {
				b.latch429 = b.run429
				return b.holdReason == ""
			}
		case outcome == fleetwatch.OutcomeOK:
			b.run, b.stalls, b.run429 = 0, 0, 0
		}
		// throttled, canceled and client_error neither extend nor reset
		// the run of failures; failures, canceled and client_error neither
		// extend nor reset the run of 429s (a 429 without a retry hint
		// ends it, unless ThrottledRunCounts is RunCountsAll).
	case fleetwatch.StateHalfOpen:
		if b.verdict != verdictNone {
			return false
		}
		switch {
		case outcome.IsFailure():
			b.verdict = verdictFailure
			return true
		case outcome == fleetwatch.OutcomeThrottled:
			b.verdict, b.verdictWait = verdictThrottled, retryAfterMs
			return true
		case outcome == fleetwatch.OutcomeClientError && b.tripCause == CauseClientError:
			// Opened for answering 4xx that its peers did not: its probe
			// must show ok answers, and as many 4xx as the ok needed to
			// close reopen it (one alone may be the request's fault).
			b.halfOpenOK = 0
			b.halfOpen4xx++
			if b.halfOpen4xx >= s.HalfOpenSuccesses {
				b.verdict = verdictClientError
				return true
			}
		case outcome == fleetwatch.OutcomeOK:
			b.halfOpenOK++
			if b.halfOpenOK >= s.HalfOpenSuccesses {
				b.verdict = verdictClose
				return true
			}
		}
	}
	return false
}

// enter moves b to state at now, starting a new generation.
func (b *backend) enter(state fleetwatch.State, now time.Time, reason string) {
	b.state = state
	b.since = now
	b.generation++
	b.genStart = now
	b.stateReason = reason
	b.holdReason = ""
	b.run, b.runLatched, b.stalls, b.stallLatch, b.run429, b.latch429 = 0, 0, 0, 0, 0, 0
	b.halfOpenOK, b.halfOpen4xx, b.verdict, b.verdictWait = 0, 0, verdictNone, 0
	if state != fleetwatch.StateOpen {
		b.openUntil = time.Time{}
	}
	if state == fleetwatch.StateHalfOpen {
		// The probe is judged on its own traffic only.
		b.win.reset()
	}
}
