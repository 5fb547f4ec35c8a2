package analyzer

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

func TestForgetAndAdopt(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{}), Epoch: "main",
		Pools: []PoolConfig{{ID: "conf", Backends: []BackendConfig{{ID: "x"}}}}}
	main := newAnalyzer(t, cfg)
	main.Observe(series("p", "a", ok, 10, t0, 10*time.Second, 100))
	main.Observe(series("q", "a", ok, 10, t0, 10*time.Second, 100))
	ev := main.Evaluate(at(10 * time.Second))
	seqQ := map[string]uint64{}
	for _, s := range ev.Snapshots {
		seqQ[s.Pool] = s.Seq
	}

	if got := main.Forget(func(p string) bool { return p != "p" }); !cmp.Equal(got, []string{"conf", "q"}) {
		t.Errorf("Forget = %v, want [conf q]", got)
	}
	if got := poolsOf(main.Snapshots(at(11 * time.Second))); !cmp.Equal(got, []string{"p"}) {
		t.Errorf("after Forget the analyzer has %v, want [p]", got)
	}

	// A scratch analyzer of the same configuration rebuilds q with a
	// tripped breaker, at the events' own time.
	cfg.Epoch = "scratch"
	scratch := newAnalyzer(t, cfg)
	scratch.Observe(series("q", "bad", fail, 5, at(9*time.Second), time.Second, 0))
	scratch.Evaluate(at(10 * time.Second))
	want, _ := scratch.Snapshot("q", at(12*time.Second))

	if got := main.Adopt(scratch, func(p string) bool { return p == "q" || p == "conf" }); !cmp.Equal(got, []string{"conf", "q"}) {
		t.Errorf("Adopt = %v, want [conf q]", got)
	}
	if got := poolsOf(scratch.Snapshots(at(12 * time.Second))); len(got) != 0 {
		t.Errorf("scratch still has %v after Adopt", got)
	}
	ev = main.Evaluate(at(12 * time.Second))
	got := map[string]fleetwatch.Snapshot{}
	for _, s := range ev.Snapshots {
		got[s.Pool] = s
	}
	q, okQ := got["q"]
	if !okQ {
		t.Fatalf("the adopted pool q was not published by the next Evaluate: %v", poolsOf(ev.Snapshots))
	}
	if q.Epoch != "main" || q.Seq <= seqQ["q"] {
		t.Errorf("q published in epoch %s seq %d, want main's epoch and a seq above %d", q.Epoch, q.Seq, seqQ["q"])
	}
	bad, wantBad := q.Find("bad"), want.Find("bad")
	if bad == nil || bad.State != fleetwatch.StateOpen || !bad.OpenUntil.Equal(wantBad.OpenUntil.Time) {
		t.Errorf("adopted bad = %+v, want open until %v", bad, wantBad.OpenUntil)
	}
	if _, okC := got["conf"]; !okC {
		t.Errorf("the configured pool did not come back")
	}
	if n := main.Stats().Backends; n != 3 {
		t.Errorf("backends = %d, want 3 (p/a, q/bad, conf/x)", n)
	}
}

func poolsOf(snaps []fleetwatch.Snapshot) []string {
	var ids []string
	for _, s := range snaps {
		ids = append(ids, s.Pool)
	}
	return ids
}

// TestRestoreKeepsTheSnapshotsOpenUntilOverAReplayedTrip: the replay
// re-trips a breaker from the same events at a later evaluation time than
// the live analyzer did; the snapshot, which decided on those events, sets
// open_until. A trip on events after the snapshot keeps its later one.
func TestRestoreKeepsTheSnapshotsOpenUntilOverAReplayedTrip(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{}), Epoch: "live"}
	snap, bad := restoreFixture(t, cfg) // tripped at t0+10s, snapshot at t0+12s
	until := bad.OpenUntil.Time

	replayed := func(evalAt time.Time) *Analyzer {
		cfg.Epoch = "next"
		a := newAnalyzer(t, cfg)
		a.Observe(series("p", "good", ok, 40, t0, 10*time.Second, 100))
		a.Observe(series("p", "bad", fail, 5, at(9*time.Second), time.Second, 0))
		a.Evaluate(evalAt)
		return a
	}
	// Replayed and evaluated 1 s later than live, before the snapshot.
	a := replayed(at(11 * time.Second))
	a.Restore([]fleetwatch.Snapshot{snap}, at(13*time.Second))
	if b := backendOf(t, a, "p", "bad", at(13*time.Second)); b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(until) {
		t.Errorf("after a replayed trip before the snapshot: %s until %v, want open until the snapshot's %v", b.State, b.OpenUntil, until)
	}
	// Tripped on events after the snapshot: the later open_until stays.
	a = replayed(at(15 * time.Second))
	a.Restore([]fleetwatch.Snapshot{snap}, at(16*time.Second))
	if b := backendOf(t, a, "p", "bad", at(16*time.Second)); b.State != fleetwatch.StateOpen || !b.OpenUntil.After(until) {
		t.Errorf("after a trip later than the snapshot: %s until %v, want open until after %v", b.State, b.OpenUntil, until)
	}
}
