package analyzer

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// reloadConfig is the configuration the reload tests start from: pool p
// with backends a, b (which trips) and c, and pool gone with one backend.
func reloadConfig() Config {
	return Config{
		Settings: noJitter(Settings{}),
		Epoch:    "e",
		Pools: []PoolConfig{
			{ID: "p", Backends: []BackendConfig{{ID: "a"}, {ID: "b", Priority: 1}, {ID: "c"}}},
			{ID: "gone", Backends: []BackendConfig{{ID: "x"}}},
		},
	}
}

// tripB feeds p traffic in which b fails five times in a row (the
// consecutive trip) and evaluates at 10s: b is open.
func tripB(t *testing.T, a *Analyzer) fleetwatch.Backend {
	t.Helper()
	a.Observe(series("p", "a", ok, 20, t0, 10*time.Second, 100))
	a.Observe(series("p", "c", ok, 20, t0, 10*time.Second, 120))
	a.Observe(series("p", "b", fail, 5, at(9*time.Second), time.Second, 0))
	a.Evaluate(at(10 * time.Second))
	b := backendOf(t, a, "p", "b", at(10*time.Second))
	if b.State != fleetwatch.StateOpen {
		t.Fatalf("b = %s, want open after five failures", b.State)
	}
	return b
}

func TestReconfigureKeepsStateOfWhatStays(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	before := tripB(t, a)
	seqBefore := snapshotOf(t, a, "p", at(10*time.Second)).Seq
	aBefore := backendOf(t, a, "p", "a", at(10*time.Second))

	a.Observe(series("gone", "x", fail, 3, at(9*time.Second), time.Second, 0))
	a.Evaluate(at(10 * time.Second))

	cfg := reloadConfig()
	cfg.Pools[0].Settings.FailureRate = 0.3 // a threshold of p changes
	cfg.Pools[0].Backends[0].Priority = 2
	cfg.Pools[1].Settings.ConsecutiveFailures = 3
	got, err := a.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := Reconfigured{PoolsChanged: []string{"gone", "p"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Reconfigure (-want +got):\n%s", diff)
	}
	ev := a.Evaluate(at(11 * time.Second))
	snap := findSnapshot(t, ev.Snapshots, "p")
	if snap.Seq <= seqBefore || snap.Epoch != "e" {
		t.Errorf("p published seq %d epoch %s, want above %d in epoch e", snap.Seq, snap.Epoch, seqBefore)
	}
	b := snap.Find("b")
	if b == nil || b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(before.OpenUntil.Time) || b.Trips != before.Trips || b.Reason != before.Reason {
		t.Errorf("b after the reload = %+v, want open until %v with reason %q", b, before.OpenUntil, before.Reason)
	}
	ab := snap.Find("a")
	if ab.Requests != aBefore.Requests || *ab.EWMATTFTMs != *aBefore.EWMATTFTMs || ab.Priority != 2 {
		t.Errorf("a after the reload: %d requests, ewma %v, priority %d; want %d requests, ewma %v, priority 2",
			ab.Requests, *ab.EWMATTFTMs, ab.Priority, aBefore.Requests, *aBefore.EWMATTFTMs)
	}
	// gone/x had three failures in a row before the reload, below the
	// old consecutive_failures (5): one more trips it at the new 3, the
	// run kept across the reload.
	x := backendOf(t, a, "gone", "x", at(11*time.Second))
	if x.State != fleetwatch.StateClosed {
		t.Fatalf("x = %s before its fourth failure, want closed", x.State)
	}
	a.Observe([]fleetwatch.Event{event("gone", "x", fail, at(11*time.Second), 0)})
	a.Evaluate(at(12 * time.Second))
	if x := backendOf(t, a, "gone", "x", at(12*time.Second)); x.State != fleetwatch.StateOpen {
		t.Errorf("x = %s (%s) after four failures in a row with consecutive_failures 3, want open", x.State, x.Reason)
	}
}

func TestReconfigureAddsAPool(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	tripB(t, a)
	// A pool already tracked from events becomes configured and keeps
	// its windows.
	a.Observe(series("seen", "s1", ok, 10, t0, 10*time.Second, 50))
	a.Evaluate(at(10 * time.Second))
	seenBefore := backendOf(t, a, "seen", "s1", at(10*time.Second))

	cfg := reloadConfig()
	cfg.Pools = append(cfg.Pools,
		PoolConfig{ID: "new", Mode: fleetwatch.ModeFailover, Backends: []BackendConfig{{ID: "n1"}, {ID: "n2", Priority: 1}}},
		PoolConfig{ID: "seen", Backends: []BackendConfig{{ID: "s1"}, {ID: "s2"}}})
	got, err := a.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := Reconfigured{
		PoolsAdded:    []string{"new", "seen"},
		BackendsAdded: []string{"new/n1", "new/n2", "seen/s1", "seen/s2"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Reconfigure (-want +got):\n%s", diff)
	}
	ev := a.Evaluate(at(11 * time.Second))
	n := findSnapshot(t, ev.Snapshots, "new")
	if n.Mode != fleetwatch.ModeFailover || len(n.Backends) != 2 || n.Find("n2").Priority != 1 {
		t.Errorf("new pool snapshot = %+v, want failover with n1 and n2 (priority 1)", n)
	}
	seen := findSnapshot(t, ev.Snapshots, "seen")
	if s1 := seen.Find("s1"); s1 == nil || s1.Requests != seenBefore.Requests {
		t.Errorf("seen/s1 after it became configured = %+v, want its %d requests kept", s1, seenBefore.Requests)
	}
	// Configured backends never expire, even without events.
	a.Evaluate(at(11*time.Second + DefaultExpiry + time.Minute))
	if s := snapshotOf(t, a, "new", at(12*time.Second+DefaultExpiry+time.Minute)); len(s.Backends) != 2 {
		t.Errorf("the new pool's configured backends expired: %+v", s.Backends)
	}
}

func TestReconfigureRemovesPoolsAndBackends(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	before := tripB(t, a)

	// b (open, with traffic) and c leave p; pool gone (never seen) leaves.
	cfg := reloadConfig()
	cfg.Pools = cfg.Pools[:1]
	cfg.Pools[0].Backends = cfg.Pools[0].Backends[:1]
	got, err := a.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := Reconfigured{
		PoolsRemoved:    []string{"gone"},
		BackendsRemoved: []string{"gone/x", "p/b", "p/c"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Reconfigure (-want +got):\n%s", diff)
	}
	// The next Evaluate drops what never had an event (gone/x, and with it
	// the pool, after an empty snapshot); b and c, which had traffic,
	// stay as unconfigured backends with their state.
	ev := a.Evaluate(at(11 * time.Second))
	g := findSnapshot(t, ev.Snapshots, "gone")
	if len(g.Backends) != 0 {
		t.Errorf("pool gone's last snapshot has %+v, want no backends", g.Backends)
	}
	if _, found := a.Snapshot("gone", at(12*time.Second)); found {
		t.Errorf("pool gone is still tracked after its last snapshot")
	}
	b := backendOf(t, a, "p", "b", at(11*time.Second))
	if b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(before.OpenUntil.Time) || b.Priority != 0 {
		t.Errorf("removed b = %+v, want still open until %v with priority 0", b, before.OpenUntil)
	}
	// Without events they expire like any unconfigured backend.
	late := at(10*time.Second + DefaultExpiry + time.Second)
	ev = a.Evaluate(late)
	var expired []string
	for _, tr := range ev.Transitions {
		if tr.Cause == CauseExpired {
			expired = append(expired, tr.Pool+"/"+tr.Backend)
		}
	}
	if diff := cmp.Diff([]string{"p/b", "p/c"}, expired); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	if s := snapshotOf(t, a, "p", late); len(s.Backends) != 1 || s.Backends[0].Backend != "a" {
		t.Errorf("p after expiry = %+v, want only a", s.Backends)
	}
	if pools, backends := a.Tracked(); pools != 1 || backends != 1 {
		t.Errorf("Tracked = %d pools, %d backends, want 1, 1", pools, backends)
	}
}

func TestReconfigureResizesWindows(t *testing.T) {
	for _, tc := range []struct {
		name           string
		window, bucket time.Duration
		wantRequests   int64
	}{
		{"same", 30 * time.Second, time.Second, 40},
		{"longer", 60 * time.Second, time.Second, 40},
		// The head is the bucket of 20s (the last Evaluate), so a 10s
		// window holds (10s, 20s]: 18 events.
		{"shorter", 10 * time.Second, time.Second, 18},
		{"coarser", 30 * time.Second, 2 * time.Second, 40},
		{"coarser and shorter", 10 * time.Second, 5 * time.Second, 10}, // [15s, 25s)
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Settings: noJitter(Settings{}), Pools: []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "a"}}}}}
			a := newAnalyzer(t, cfg)
			// 40 events over [0, 20s): 20 of them in [10s, 20s).
			a.Observe(series("p", "a", ok, 40, t0, 20*time.Second, 100))
			a.Evaluate(at(20 * time.Second))
			p50Before := backendOf(t, a, "p", "a", at(20*time.Second)).P50TTFTMs
			cfg.Pools[0].Settings.Window, cfg.Pools[0].Settings.Bucket = tc.window, tc.bucket
			cfg.Pools[0].Settings.Expiry = time.Hour
			if _, err := a.Reconfigure(cfg); err != nil {
				t.Fatal(err)
			}
			now := at(20*time.Second - time.Nanosecond)
			got := backendOf(t, a, "p", "a", now)
			if got.Requests != tc.wantRequests || got.WindowMs != tc.window.Milliseconds() {
				t.Errorf("after resizing: %d requests over %d ms, want %d over %d", got.Requests, got.WindowMs, tc.wantRequests, tc.window.Milliseconds())
			}
			if got.P50TTFTMs == nil || *got.P50TTFTMs != *p50Before {
				t.Errorf("p50 after resizing = %v, want %v", got.P50TTFTMs, *p50Before)
			}
			// The window goes on counting and evicting at the new size.
			a.Observe(series("p", "a", ok, 1, at(20*time.Second), time.Second, 100))
			later := at(20*time.Second + tc.window + tc.bucket)
			if got := backendOf(t, a, "p", "a", later); got.Requests != 0 {
				t.Errorf("one window after the last event: %d requests, want 0", got.Requests)
			}
		})
	}
}

func TestReconfigureRefusesInvalidAndChangesNothing(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	before := tripB(t, a)
	cfg := reloadConfig()
	cfg.Pools = append(cfg.Pools, PoolConfig{ID: "p"}) // duplicate id
	if _, err := a.Reconfigure(cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Reconfigure with a duplicate pool: %v, want ErrInvalidConfig", err)
	}
	cfg = reloadConfig()
	cfg.Settings.FailureRate = 2
	var se *SettingError
	if _, err := a.Reconfigure(cfg); !errors.As(err, &se) || se.Key != "analyzer.failure_rate" {
		t.Fatalf("Reconfigure with failure_rate 2: %v, want a SettingError on analyzer.failure_rate", err)
	}
	if b := backendOf(t, a, "p", "b", at(10*time.Second)); !cmp.Equal(b, before) {
		t.Errorf("a refused configuration changed b: %s", cmp.Diff(before, b))
	}
	if pools, _ := a.Tracked(); pools != 2 {
		t.Errorf("tracked pools = %d, want 2", pools)
	}
}

func TestReconfigureQuarantine(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	a.Observe(series("p", "a", ok, 20, t0, 10*time.Second, 100))
	a.SetDrift("p", "a", fleetwatch.DriftDrifted)
	a.Evaluate(at(10 * time.Second))
	if w := backendOf(t, a, "p", "a", at(10*time.Second)).Weight; w == 0 {
		t.Fatalf("weight %v without quarantine, want > 0", w)
	}
	cfg := reloadConfig()
	cfg.Quarantine = true
	if _, err := a.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	a.Evaluate(at(11 * time.Second))
	if w := backendOf(t, a, "p", "a", at(11*time.Second)).Weight; w != 0 {
		t.Errorf("weight %v of a drifted backend once quarantine is on, want 0", w)
	}
}

func snapshotOf(t *testing.T, a *Analyzer, pool string, now time.Time) fleetwatch.Snapshot {
	t.Helper()
	s, found := a.Snapshot(pool, now)
	if !found {
		t.Fatalf("pool %q not found", pool)
	}
	return s
}

func findSnapshot(t *testing.T, snaps []fleetwatch.Snapshot, pool string) fleetwatch.Snapshot {
	t.Helper()
	for _, s := range snaps {
		if s.Pool == pool {
			return s
		}
	}
	t.Fatalf("no snapshot of pool %q in %v", pool, poolsOf(snaps))
	return fleetwatch.Snapshot{}
}

// TestAdoptConformsToAReconfigure: a pool rebuilt by an analyzer made
// before a Reconfigure (an HA takeover's scratch analyzer during a reload)
// takes the adopting analyzer's configuration, and keeps its state.
func TestAdoptConformsToAReconfigure(t *testing.T) {
	old := reloadConfig()
	scratch := newAnalyzer(t, old)
	before := tripB(t, scratch)

	main := newAnalyzer(t, old)
	next := reloadConfig()
	next.Pools[0].Settings.Window = time.Minute
	next.Pools[0].Backends = []BackendConfig{{ID: "a", Priority: 3}, {ID: "d"}} // b and c leave, d comes
	if _, err := main.Reconfigure(next); err != nil {
		t.Fatal(err)
	}
	main.Adopt(scratch, func(pool string) bool { return pool == "p" })
	snap := snapshotOf(t, main, "p", at(10*time.Second))
	got := map[string]int{}
	for _, b := range snap.Backends {
		got[b.Backend] = b.Priority
		if b.WindowMs != time.Minute.Milliseconds() {
			t.Errorf("%s: window %d ms, want the reloaded 60000", b.Backend, b.WindowMs)
		}
	}
	if diff := cmp.Diff(map[string]int{"a": 3, "b": 0, "c": 0, "d": 0}, got); diff != "" {
		t.Errorf("adopted pool's backends and priorities (-want +got):\n%s", diff)
	}
	if b := snap.Find("b"); b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(before.OpenUntil.Time) {
		t.Errorf("adopted b = %+v, want still open until %v", b, before.OpenUntil)
	}
	// b and c are no longer configured: they expire; a and d stay.
	main.Evaluate(at(10*time.Second + DefaultExpiry + time.Minute))
	if s := snapshotOf(t, main, "p", at(11*time.Second+DefaultExpiry+time.Minute)); len(s.Backends) != 2 {
		t.Errorf("after expiry p has %+v, want a and d", s.Backends)
	}
}

// TestReconfigureFinerBucket: from 2s buckets to 1s, each old bucket's
// counts land in the first new bucket of its span: nothing is lost, and
// the counts leave the window at most one old bucket early.
func TestReconfigureFinerBucket(t *testing.T) {
	cfg := Config{Settings: noJitter(Settings{Bucket: 2 * time.Second}), Pools: []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "a"}}}}}
	a := newAnalyzer(t, cfg)
	a.Observe(series("p", "a", ok, 40, t0, 20*time.Second, 100))
	a.Evaluate(at(20 * time.Second))
	before := backendOf(t, a, "p", "a", at(20*time.Second)).Requests
	cfg.Settings.Bucket = time.Second
	if _, err := a.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if got := backendOf(t, a, "p", "a", at(20*time.Second)).Requests; got != before {
		t.Errorf("after 2s -> 1s buckets: %d requests, want %d", got, before)
	}
	// The events of [0s, 2s) (4 of them) sit in the 0s bucket and leave
	// at 30s, as on the old grid; those of [2s, 4s) sit in the 2s bucket
	// and leave at 32s (an event at 3.5s seen with 1s buckets from the
	// start would stay until 33s).
	if got := backendOf(t, a, "p", "a", at(31*time.Second)).Requests; got != before-4 {
		t.Errorf("at 31s: %d requests, want %d", got, before-4)
	}
	if got := backendOf(t, a, "p", "a", at(32*time.Second)).Requests; got != before-8 {
		t.Errorf("at 32s: %d requests, want %d", got, before-8)
	}
}

// TestReconfigureShadow: a reload that puts a pool in shadow mode (and
// back) changes what its snapshots say, and keeps its breakers.
func TestReconfigureShadow(t *testing.T) {
	a := newAnalyzer(t, reloadConfig())
	before := tripB(t, a)
	cfg := reloadConfig()
	cfg.Pools[0].Shadow = fleetwatch.ShadowObserve
	got, err := a.Reconfigure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Reconfigured{PoolsChanged: []string{"p"}}, got); diff != "" {
		t.Errorf("Reconfigure (-want +got):\n%s", diff)
	}
	snap := snapshotOf(t, a, "p", at(11*time.Second))
	if snap.Shadow != fleetwatch.ShadowObserve {
		t.Errorf("shadow = %q after the reload, want %q", snap.Shadow, fleetwatch.ShadowObserve)
	}
	if b := snap.Find("b"); b == nil || b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(before.OpenUntil.Time) {
		t.Errorf("b in shadow mode = %+v, want still open until %v", b, before.OpenUntil)
	}
	if _, err := a.Reconfigure(reloadConfig()); err != nil {
		t.Fatal(err)
	}
	if snap := snapshotOf(t, a, "p", at(12*time.Second)); snap.Shadow != fleetwatch.ShadowOff {
		t.Errorf("shadow = %q after the reload back, want off", snap.Shadow)
	}
}
