package analyzer

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// t0 is the start of every scenario: a whole second, so that bucket edges
// fall on whole seconds.
var t0 = time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

const (
	ok        = fleetwatch.OutcomeOK
	fail      = fleetwatch.OutcomeError
	timeout   = fleetwatch.OutcomeTimeout
	throttled = fleetwatch.OutcomeThrottled
	canceled  = fleetwatch.OutcomeCanceled
	clientErr = fleetwatch.OutcomeClientError
	stalled   = fleetwatch.OutcomeStalled
)

// event returns an event of backend b in pool p at ts; ok events carry
// ttftMs as their TTFT.
func event(p, b string, o fleetwatch.Outcome, ts time.Time, ttftMs float64) fleetwatch.Event {
	e := fleetwatch.Event{Pool: p, Backend: b, TS: ts, Outcome: o}
	if o == fleetwatch.OutcomeOK {
		e.TTFTMs, e.HasTTFT = ttftMs, true
	}
	return e
}

// series returns n events of backend b spread evenly over [from, from+span).
func series(p, b string, o fleetwatch.Outcome, n int, from time.Time, span time.Duration, ttftMs float64) []fleetwatch.Event {
	out := make([]fleetwatch.Event, n)
	for i := range out {
		out[i] = event(p, b, o, from.Add(span*time.Duration(i)/time.Duration(n)), ttftMs)
	}
	return out
}

func newAnalyzer(t testing.TB, cfg Config) *Analyzer {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

// noJitter are settings whose open times are exact.
// bareRate has the 429 rate count every 429 (ThrottleRateCounts
// RunCountsAll) unless s says otherwise: the tests of the rate rule's
// mechanics send bare 429s (TestBare429sLowerTheWeight covers the default,
// which counts only hinted ones toward opening).
func bareRate(s Settings) Settings {
	if s.ThrottleRateCounts == "" {
		s.ThrottleRateCounts = RunCountsAll
	}
	return s
}

func noJitter(s Settings) Settings {
	s.OpenJitter = -1
	return s
}

// backendOf returns the decision for backend b of pool p at now, failing the
// test when it is missing.
func backendOf(t testing.TB, a *Analyzer, p, b string, now time.Time) fleetwatch.Backend {
	t.Helper()
	snap, found := a.Snapshot(p, now)
	if !found {
		t.Fatalf("pool %q not found", p)
	}
	d := snap.Find(b)
	if d == nil {
		t.Fatalf("backend %q not in pool %q", b, p)
	}
	return *d
}

func transitionsOf(ev Evaluation, backend string) []Transition {
	var out []Transition
	for _, tr := range ev.Transitions {
		if tr.Backend == backend {
			out = append(out, tr)
		}
	}
	return out
}
