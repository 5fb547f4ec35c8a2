package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// quota429 is a 429 whose retry hint says the quota resets in reset (a
// spend limit: quota_reset_ms), with the hour retry_after_ms may carry.
func quota429(b string, ts time.Time, reset time.Duration) fleetwatch.Event {
	e := event("p", b, throttled, ts, 0)
	e.RetryAfterMs = fleetwatch.MaxDurationMs
	e.QuotaResetMs = float64(reset / time.Millisecond)
	return e
}

// A quota spent for days keeps its backend open until the stated reset,
// past open_max and past the hour a retry-after is capped at, labelled as
// a quota (snapshot quota_until, the transition's cause, the reason), not
// as a 429 trip: it does not count in the trips that grow the next open
// time. It half-opens only once the quota has reset.
func TestQuotaKeepsTheBackendOutUntilItResets(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	reset := 274_579 * time.Second // kandev #3811: 3.2 days
	a.Observe(concat(healthy(200, "a", "b", "c"), []fleetwatch.Event{quota429("x", at(time.Second), reset)}))
	ev := a.Evaluate(at(2 * time.Second))
	var tr *Transition
	for i := range ev.Transitions {
		if ev.Transitions[i].Backend == "x" {
			tr = &ev.Transitions[i]
		}
	}
	if tr == nil || tr.To != fleetwatch.StateOpen || tr.Cause != CauseQuota {
		t.Fatalf("transitions %+v: want x opened for its quota", ev.Transitions)
	}
	want := at(time.Second).Add(reset)
	for _, now := range []time.Time{at(3 * time.Second), at(2 * time.Hour), want.Add(-time.Second)} {
		a.Evaluate(now)
		d := backendOf(t, a, "p", "x", now)
		if d.State != fleetwatch.StateOpen || d.OpenUntil == nil || !d.OpenUntil.Equal(want) ||
			d.QuotaUntil == nil || !d.QuotaUntil.Equal(want) || d.Trips != 0 || !strings.HasPrefix(d.Reason, "out of quota until") {
			t.Fatalf("at %v: x %s until %v, quota %v, trips %d (%q); want open for its quota until %v, no trip",
				now.Sub(t0), d.State, d.OpenUntil, d.QuotaUntil, d.Trips, d.Reason, want)
		}
	}
	a.Evaluate(want)
	if d := backendOf(t, a, "p", "x", want); d.State != fleetwatch.StateHalfOpen || d.QuotaUntil != nil {
		t.Errorf("at the reset: x %s, quota %v; want half-open, no quota", d.State, d.QuotaUntil)
	}
}

// The ejection cap does not hold a quota back: a backend that cannot serve
// until its reset helps nobody by staying closed.
func TestQuotaIsNotHeldByTheCap(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{MaxOpenFraction: 0.5})})
	evs := concat(healthy(200, "a"),
		[]fleetwatch.Event{quota429("x", at(time.Second), 48*time.Hour), quota429("y", at(time.Second), 48*time.Hour)})
	a.Observe(evs)
	a.Evaluate(at(2 * time.Second))
	for _, b := range []string{"x", "y"} {
		if d := backendOf(t, a, "p", b, at(2*time.Second)); d.State != fleetwatch.StateOpen || d.QuotaUntil == nil {
			t.Errorf("%s: %s (%q), want open for its quota though the cap allows one of three", b, d.State, d.Reason)
		}
	}
}

// A 429 whose hint is an hour or less is no quota: the usual rules.
func TestShortRetryHintIsNoQuota(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	e := event("p", "x", throttled, at(time.Second), 0)
	e.RetryAfterMs = 30_000
	a.Observe(concat(healthy(200, "a", "b", "c"), []fleetwatch.Event{e}))
	a.Evaluate(at(2 * time.Second))
	if d := backendOf(t, a, "p", "x", at(2*time.Second)); d.State != fleetwatch.StateClosed || d.QuotaUntil != nil {
		t.Errorf("x: %s, quota %v; want closed (one hinted 429 trips nothing)", d.State, d.QuotaUntil)
	}
}

// A restarted analyzer keeps the quota it restores (Restore).
func TestQuotaSurvivesARestore(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(200, "a", "b", "c"), []fleetwatch.Event{quota429("x", at(time.Second), 48*time.Hour)}))
	a.Evaluate(at(2 * time.Second))
	snap, _ := a.Snapshot("p", at(2*time.Second))
	b := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	b.Observe(healthy(200, "a", "b", "c", "x"))
	b.Restore([]fleetwatch.Snapshot{snap}, at(3*time.Second))
	now := at(2 * time.Hour)
	b.Evaluate(now)
	if d := backendOf(t, b, "p", "x", now); d.State != fleetwatch.StateOpen || d.QuotaUntil == nil || d.Trips != 0 {
		t.Errorf("restored x at 2h: %s, quota %v, trips %d; want still open for its quota, no trip", d.State, d.QuotaUntil, d.Trips)
	}
}

// Sheds (a request refused in front of the backend) never count for or
// against it, and create no backend.
func TestShedsCountNothing(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	var evs []fleetwatch.Event
	for i := range 50 {
		for _, b := range []string{"x", "ghost"} {
			e := event("p", b, fail, at(time.Duration(i)*100*time.Millisecond), 0)
			e.Status, e.Shed = 503, "queue_full"
			evs = append(evs, e)
		}
	}
	a.Observe(concat(healthy(200, "a", "b", "x"), evs))
	a.Evaluate(at(6 * time.Second))
	snap, _ := a.Snapshot("p", at(6*time.Second))
	if snap.Find("ghost") != nil {
		t.Error("a backend named only by sheds was created")
	}
	d := backendOf(t, a, "p", "x", at(6*time.Second))
	if d.State != fleetwatch.StateClosed || d.SuccessRate == nil || *d.SuccessRate != 1 {
		t.Errorf("x: %s, success %v (%q); want closed, every counted request ok", d.State, d.SuccessRate, d.Reason)
	}
	if st := a.Stats(); st.Shed != 100 {
		t.Errorf("Stats.Shed = %d, want 100", st.Shed)
	}
}
