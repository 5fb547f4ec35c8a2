package analyzer

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Time per output token (TPOT) is the decode speed beside TTFT:
//
//	tpot = (duration_ms - ttft_ms) / (output_tokens - 1)
//
// over the ok, non-cold events that carry both times, a duration not below
// the TTFT and at least two output tokens (one token has no decode time).
// Each backend keeps its samples in a second window of the same buckets as
// its outcome window (window.go; the same log-linear histogram, so a
// reported quantile is within 3.03% of the sample at its rank), made at its
// first sample: a backend whose events never carry a duration and token
// count pays one nil pointer. The snapshot publishes p50 and p95 over the
// window, no EWMA: TPOT informs people and pickers comparing backends and
// drives no breaker rule, so it needs no fast-reacting estimate.
//
// Unlike the TTFT window, the TPOT window is not emptied when a backend
// turns half-open: it is not a breaker signal, and the decode speed seen
// before a trip is still the backend's over the window.

// tpotSample returns ev's time per output token in ms; ok is false when ev
// is no TPOT sample.
func tpotSample(ev *fleetwatch.Event, outcome fleetwatch.Outcome) (ms float64, ok bool) {
	if outcome != fleetwatch.OutcomeOK || ev.Cold || !ev.TTFTKnown() || !ev.DurationKnown() || ev.OutputTokens < 2 {
		return 0, false
	}
	// Both times in the protocol's bounds and the duration not below the
	// TTFT (NaN fails every comparison).
	if !(ev.TTFTMs >= 0 && ev.DurationMs >= ev.TTFTMs && ev.DurationMs <= fleetwatch.MaxDurationMs) {
		return 0, false
	}
	return (ev.DurationMs - ev.TTFTMs) / float64(ev.OutputTokens-1), true
}

// observeTPOT counts a TPOT sample of bucket num, which b.win accepted.
func (b *backend) observeTPOT(num int64, ms float64) {
	if b.tpot == nil {
		w := newWindow(len(b.win.buckets), time.Duration(b.win.bucketNanos))
		b.tpot = &w
	}
	b.tpot.add(num, fleetwatch.OutcomeOK, true, binOf(ms), 0)
}

// tpotQuantiles returns p50 and p95 of b's TPOT samples in the window as of
// now; ok is false when it has none.
func (b *backend) tpotQuantiles(now time.Time) (p50, p95 float64, ok bool) {
	if b.tpot == nil {
		return 0, 0, false
	}
	b.tpot.advance(b.tpot.bucketOf(now))
	return b.tpot.ttftQuantiles()
}
