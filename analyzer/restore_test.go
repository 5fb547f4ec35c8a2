package analyzer

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// restoreFixture trips "bad" with five failures in a row at t0+10s in a
// first analyzer and returns that analyzer's snapshot of the pool at
// t0+12s, as the KV would hold it.
func restoreFixture(t *testing.T, cfg Config) (fleetwatch.Snapshot, fleetwatch.Backend) {
	t.Helper()
	first := newAnalyzer(t, cfg)
	evs := series("p", "good", ok, 40, t0, 10*time.Second, 100)
	evs = append(evs, series("p", "bad", fail, 5, at(9*time.Second), time.Second, 0)...)
	first.Observe(evs)
	first.Evaluate(at(10 * time.Second))
	first.SetDrift("p", "good", fleetwatch.DriftDrifted)
	snap, ok := first.Snapshot("p", at(12*time.Second))
	if !ok {
		t.Fatal("no snapshot of p")
	}
	bad := snap.Find("bad")
	if bad == nil || bad.State != fleetwatch.StateOpen || bad.OpenUntil == nil || bad.Trips != 1 {
		t.Fatalf("the first analyzer did not open bad: %+v", bad)
	}
	return snap, *bad
}

func TestRestoreKeepsAnOpenBreakerUntilItsOpenUntil(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{}), Quarantine: true, Epoch: "first"}
	snap, bad := restoreFixture(t, cfg)
	until := bad.OpenUntil.Time

	cfg.Epoch = "second"
	second := newAnalyzer(t, cfg)
	got := second.Restore([]fleetwatch.Snapshot{snap}, at(20*time.Second))
	if got.Open != 1 || got.Drift != 1 {
		t.Errorf("Restore = %+v, want 1 open and 1 drift status", got)
	}
	second.Evaluate(at(20 * time.Second))
	b := backendOf(t, second, "p", "bad", at(20*time.Second))
	if b.State != fleetwatch.StateOpen || b.OpenUntil == nil || !b.OpenUntil.Equal(until) || b.Weight != 0 || b.Trips != 1 {
		t.Errorf("after the restart bad is %s until %v (weight %v, trips %d), want open until %v, weight 0, trips 1",
			b.State, b.OpenUntil, b.Weight, b.Trips, until)
	}
	if b.Reason != bad.Reason {
		t.Errorf("reason %q, want the first analyzer's %q", b.Reason, bad.Reason)
	}
	// The quarantined backend stays at weight 0 until the probes report.
	if g := backendOf(t, second, "p", "good", at(20*time.Second)); g.Drift != fleetwatch.DriftDrifted || g.Weight != 0 {
		t.Errorf("good after the restart: drift %s weight %v, want drifted at weight 0", g.Drift, g.Weight)
	}

	// Still open a moment before open_until, half-open at it.
	second.Evaluate(until.Add(-time.Millisecond))
	if s := backendOf(t, second, "p", "bad", until.Add(-time.Millisecond)).State; s != fleetwatch.StateOpen {
		t.Errorf("bad is %s just before its open_until, want open", s)
	}
	second.Evaluate(until)
	if s := backendOf(t, second, "p", "bad", until).State; s != fleetwatch.StateHalfOpen {
		t.Fatalf("bad is %s at its open_until, want half_open", s)
	}
	// The trip count came along: a failure while half-open opens it for
	// twice the base open time (second trip), not for the first trip's.
	failAt := until.Add(time.Second)
	second.Observe([]fleetwatch.Event{event("p", "bad", fail, failAt, 0)})
	second.Evaluate(failAt)
	b = backendOf(t, second, "p", "bad", failAt)
	if want := failAt.Add(2 * DefaultOpenBase); b.State != fleetwatch.StateOpen || b.OpenUntil == nil || !b.OpenUntil.Equal(want) || b.Trips != 2 {
		t.Errorf("after a half-open failure bad is %s until %v (trips %d), want open until %v (trips 2)", b.State, b.OpenUntil, b.Trips, want)
	}
}

func TestRestoreAfterOpenUntilHalfOpens(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{})}
	snap, bad := restoreFixture(t, cfg)
	second := newAnalyzer(t, cfg)
	now := bad.OpenUntil.Add(time.Minute)
	if got := second.Restore([]fleetwatch.Snapshot{snap}, now); got.HalfOpen != 1 || got.Open != 0 {
		t.Errorf("Restore = %+v, want 1 half-open", got)
	}
	second.Evaluate(now)
	if b := backendOf(t, second, "p", "bad", now); b.State != fleetwatch.StateHalfOpen || b.Weight != DefaultHalfOpenWeight {
		t.Errorf("bad is %s at weight %v, want half_open at %v: it never closes on a restart alone", b.State, b.Weight, DefaultHalfOpenWeight)
	}
}

func TestRestoreKeepsALongerReplayedTrip(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{})}
	snap, bad := restoreFixture(t, cfg)
	second := newAnalyzer(t, cfg)
	// The replay re-tripped bad later than the snapshot did: the later
	// open_until stands.
	second.Observe(series("p", "bad", fail, 5, at(14*time.Second), time.Second, 0))
	second.Evaluate(at(15 * time.Second))
	replayed := backendOf(t, second, "p", "bad", at(15*time.Second)).OpenUntil.Time
	if !replayed.After(bad.OpenUntil.Time) {
		t.Fatalf("fixture: replayed trip until %v is not after the snapshot's %v", replayed, bad.OpenUntil)
	}
	second.Restore([]fleetwatch.Snapshot{snap}, at(16*time.Second))
	if b := backendOf(t, second, "p", "bad", at(16*time.Second)); !b.OpenUntil.Equal(replayed) {
		t.Errorf("open until %v after Restore, want the replay's later %v", b.OpenUntil, replayed)
	}
}

func TestRestoreSkipsInvalidSnapshots(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{})}
	snap, _ := restoreFixture(t, cfg)
	snap.Pool = "a..b" // not a valid pool id
	second := newAnalyzer(t, cfg)
	if got := second.Restore([]fleetwatch.Snapshot{snap}, at(20*time.Second)); got != (Restored{}) {
		t.Errorf("Restore of an invalid snapshot = %+v, want nothing", got)
	}
	if _, ok := second.Snapshot("a..b", at(20*time.Second)); ok {
		t.Error("an invalid snapshot created a pool")
	}
}
