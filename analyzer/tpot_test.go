package analyzer

import (
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

// decodeEvent returns an ok event of backend b in pool "p" at ts with the
// given TTFT, duration and output tokens (a negative time is absent).
func decodeEvent(b string, ts time.Time, ttftMs, durationMs float64, tokens int64) fleetwatch.Event {
	e := fleetwatch.Event{Pool: "p", Backend: b, TS: ts, Outcome: ok, OutputTokens: tokens}
	if ttftMs >= 0 {
		e.TTFTMs, e.HasTTFT = ttftMs, true
	}
	if durationMs >= 0 {
		e.DurationMs, e.HasDuration = durationMs, true
	}
	return e
}

// reported is what the window's histogram reports for a sample of ms.
func reported(ms float64) float64 { return binValue(int(binOf(ms))) }

func TestTPOTQuantiles(t *testing.T) {
	cold := decodeEvent("a", at(time.Second), 100, 5100, 11) // 500 ms/token, but cold
	cold.Cold = true
	failed := decodeEvent("a", at(time.Second), 100, 5100, 11)
	failed.Outcome = fail
	tests := []struct {
		name     string
		events   []fleetwatch.Event
		now      time.Time
		p50, p95 float64 // the true quantiles; 0 when none is published
	}{
		{"one sample", []fleetwatch.Event{decodeEvent("a", at(time.Second), 200, 1200, 101)}, at(2 * time.Second), 10, 10},
		{"median and p95 of twenty", func() []fleetwatch.Event {
			var evs []fleetwatch.Event
			for i := range 20 { // (i+1) ms per token over 11 tokens
				evs = append(evs, decodeEvent("a", at(time.Duration(i)*time.Second), 50, 50+10*float64(i+1), 11))
			}
			return evs
		}(), at(20 * time.Second), 10, 19},
		{"cold, non-ok, one-token, missing and inconsistent times excluded", []fleetwatch.Event{
			cold, failed,
			decodeEvent("a", at(time.Second), 100, 600, 1),  // one token: no decode time
			decodeEvent("a", at(time.Second), 100, 600, 0),  // no token count
			decodeEvent("a", at(time.Second), 100, -1, 11),  // no duration
			decodeEvent("a", at(time.Second), -1, 600, 11),  // no TTFT
			decodeEvent("a", at(time.Second), 700, 600, 11), // duration below the TTFT
			decodeEvent("a", at(time.Second), 100, 4e6, 11), // duration beyond an hour
			decodeEvent("a", at(time.Second), 100, 300, 11), // the only sample: 20 ms/token
		}, at(2 * time.Second), 20, 20},
		{"none excluded leaves no sample", []fleetwatch.Event{cold, failed, decodeEvent("a", at(time.Second), 100, 600, 1)}, at(2 * time.Second), 0, 0},
		{"samples older than the window expire", []fleetwatch.Event{
			decodeEvent("a", at(time.Second), 100, 1100, 11),   // 100 ms/token, expires
			decodeEvent("a", at(25*time.Second), 100, 300, 11), // 20 ms/token
		}, at(40 * time.Second), 20, 20},
		{"all samples expired", []fleetwatch.Event{decodeEvent("a", at(time.Second), 100, 1100, 11)}, at(40 * time.Second), 0, 0},
		{"zero decode time", []fleetwatch.Event{decodeEvent("a", at(time.Second), 100, 100, 5)}, at(2 * time.Second), 0.01, 0.01}, // 0 ms: the underflow bin, as 0.01 ms is
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{})
			a.Observe(tt.events)
			d := backendOf(t, a, "p", "a", tt.now)
			if tt.p50 == 0 {
				if d.P50TPOTMs != nil || d.P95TPOTMs != nil {
					t.Fatalf("TPOT = %v, %v, want none", fmtPtr(d.P50TPOTMs), fmtPtr(d.P95TPOTMs))
				}
				return
			}
			if d.P50TPOTMs == nil || d.P95TPOTMs == nil {
				t.Fatalf("TPOT = %v, %v, want %v, %v", fmtPtr(d.P50TPOTMs), fmtPtr(d.P95TPOTMs), tt.p50, tt.p95)
			}
			want := [2]float64{reported(tt.p50), reported(tt.p95)}
			if diff := cmp.Diff(want, [2]float64{*d.P50TPOTMs, *d.P95TPOTMs}); diff != "" {
				t.Errorf("TPOT p50, p95 (-want +got):\n%s", diff)
			}
			// The histogram's error bound against the true quantiles
			// (0.125 ms absolute below 0.25 ms).
			for i, v := range [2]float64{tt.p50, tt.p95} {
				if got := want[i]; math.Abs(got-v) > max(v/33, 0.125) {
					t.Errorf("quantile %d reported as %v, true %v: beyond the error bound", i, got, v)
				}
			}
		})
	}
}

func fmtPtr(v *float64) any {
	if v == nil {
		return "nil"
	}
	return *v
}

// TestTPOTSurvivesHalfOpen: TPOT is no breaker signal, so the window of
// samples is not emptied when the backend trips and turns half-open, unlike
// the TTFT quantiles.
func TestTPOTSurvivesHalfOpen(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{OpenBase: 5 * time.Second})})
	a.Observe([]fleetwatch.Event{decodeEvent("a", at(time.Second), 100, 300, 11)})
	a.Observe(series("p", "a", fail, 40, at(2*time.Second), time.Second, 0))
	var states []fleetwatch.State
	for s := 3; s <= 20; s++ {
		a.Evaluate(at(time.Duration(s) * time.Second))
		d := backendOf(t, a, "p", "a", at(time.Duration(s)*time.Second))
		if len(states) == 0 || states[len(states)-1] != d.State {
			states = append(states, d.State)
		}
		if d.State == fleetwatch.StateHalfOpen {
			if d.P50TTFTMs != nil {
				t.Errorf("half-open p50_ttft_ms = %v, want the TTFT window emptied", *d.P50TTFTMs)
			}
			if d.P50TPOTMs == nil || *d.P50TPOTMs != reported(20) {
				t.Errorf("half-open p50_tpot_ms = %v, want %v", fmtPtr(d.P50TPOTMs), reported(20))
			}
			return
		}
	}
	t.Fatalf("states %v: the backend never turned half-open", states)
}

// TestObserveTPOTAllocatesNothing: once a backend has its TPOT window,
// events with TPOT samples add no allocation to Observe.
func TestObserveTPOTAllocatesNothing(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Evaluate(at(0))
	batch := []fleetwatch.Event{
		decodeEvent("a", at(time.Second), 100, 1100, 51),
		decodeEvent("b", at(time.Second), 120, 900, 40),
		decodeEvent("a", at(time.Second), 90, 2000, 200),
	}
	a.Observe(batch)
	if n := testing.AllocsPerRun(100, func() { a.Observe(batch) }); n != 0 {
		t.Errorf("Observe with TPOT samples allocates %v times per batch", n)
	}
}

// withTPOT gives ok events what a proxy that times the whole response
// sends: a duration and an output token count (2 to 513 tokens at 5 to 45
// ms per token).
func withTPOT(i int, e *fleetwatch.Event) {
	if e.Outcome != fleetwatch.OutcomeOK {
		return
	}
	e.OutputTokens = int64(2 + i%512)
	e.DurationMs, e.HasDuration = e.TTFTMs+float64(e.OutputTokens-1)*float64(5+i%41), true
}

// BenchmarkObserveWithTPOT is BenchmarkObserveVsBaseline on events that
// carry a duration and output tokens: the cost of the TPOT window on the
// hot path.
func BenchmarkObserveWithTPOT(b *testing.B) { observeVsBaseline(b, withTPOT) }
