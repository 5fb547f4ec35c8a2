package analyzer

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

func fptr(v float64) *float64 { return &v }

// loadEvent is an ok event of backend b at ts from source src carrying
// the load fields given (negative: absent).
func loadEvent(b, src string, ts time.Time, running, waiting int64, kv float64) fleetwatch.Event {
	e := event("p", b, ok, ts, 100)
	e.Source = src
	if running >= 0 {
		e.Running, e.HasRunning = running, true
	}
	if waiting >= 0 {
		e.Waiting, e.HasWaiting = waiting, true
	}
	if kv >= 0 {
		e.KVCacheUsage, e.HasKVCache = kv, true
	}
	return e
}

func loadOf(t *testing.T, a *Analyzer, b string, now time.Time) *fleetwatch.Load {
	t.Helper()
	d := backendOf(t, a, "p", b, now)
	return d.Load
}

// TestLoadFromEvents: an event's load fields are published with their age
// at the snapshot's time and source "event", in Evaluate's snapshots too,
// and left out once older than LoadMaxAge.
func TestLoadFromEvents(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: Settings{LoadMaxAge: 2 * time.Second}})
	a.Evaluate(at(0))
	a.Observe([]fleetwatch.Event{loadEvent("a", "r1", at(300*time.Millisecond), 7, 2, 0.25), event("p", "b", ok, at(300*time.Millisecond), 100)})

	want := &fleetwatch.Load{Running: 7, Waiting: 2, KVCacheUsage: fptr(0.25), AgeMs: 700, Source: fleetwatch.LoadSourceEvent}
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(time.Second))); diff != "" {
		t.Errorf("load at 1s (-want +got):\n%s", diff)
	}
	if l := loadOf(t, a, "b", at(time.Second)); l != nil {
		t.Errorf("backend b reported no load, got %+v", l)
	}
	ev := a.Evaluate(at(time.Second))
	if len(ev.Snapshots) != 1 {
		t.Fatalf("Evaluate returned %d snapshots, want the heartbeat", len(ev.Snapshots))
	}
	if diff := cmp.Diff(want, ev.Snapshots[0].Find("a").Load); diff != "" {
		t.Errorf("Evaluate's load (-want +got):\n%s", diff)
	}
	if err := ev.Snapshots[0].Validate(); err != nil {
		t.Errorf("snapshot with load fails Validate: %v", err)
	}
	// Exactly LoadMaxAge old is still published; a millisecond later not.
	if l := loadOf(t, a, "a", at(2300*time.Millisecond)); l == nil || l.AgeMs != 2000 {
		t.Errorf("load at max age = %+v, want age 2000", l)
	}
	if l := loadOf(t, a, "a", at(2301*time.Millisecond)); l != nil {
		t.Errorf("stale load published: %+v", l)
	}
	if l := a.Evaluate(at(3 * time.Second)).Snapshots[0].Find("a").Load; l != nil {
		t.Errorf("Evaluate published a stale load: %+v", l)
	}
}

// TestLoadNewestWins: reports from events and metrics replace each other by
// time whatever their source; an older report arriving late changes
// nothing; a field a report lacks keeps its earlier value while that is
// fresh.
func TestLoadNewestWins(t *testing.T) {
	a := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "a"}}}}})
	a.Evaluate(at(0))
	if !a.ObserveLoad("p", "a", LoadReport{Running: 4, HasRunning: true, Waiting: 1, HasWaiting: true, KVCacheUsage: 0.5, HasKVCache: true}, at(time.Second)) {
		t.Fatal("ObserveLoad of a configured backend returned false")
	}
	want := &fleetwatch.Load{Running: 4, Waiting: 1, KVCacheUsage: fptr(0.5), AgeMs: 500, Source: fleetwatch.LoadSourceMetrics}
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(1500*time.Millisecond))); diff != "" {
		t.Errorf("metrics load (-want +got):\n%s", diff)
	}

	// A newer event with waiting and kv only (vLLM's ORCA header): running
	// is kept from the metrics, the source is the newest report's.
	a.Observe([]fleetwatch.Event{loadEvent("a", "r1", at(2*time.Second), -1, 9, 0.75)})
	want = &fleetwatch.Load{Running: 4, Waiting: 9, KVCacheUsage: fptr(0.75), AgeMs: 100, Source: fleetwatch.LoadSourceEvent}
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(2100*time.Millisecond))); diff != "" {
		t.Errorf("after the event (-want +got):\n%s", diff)
	}

	// A late metrics report, older than the event: waiting keeps the
	// event's value and the source stays the event's; only running, last
	// reported at 1s, takes the report's (1.5s is newer).
	a.ObserveLoad("p", "a", LoadReport{Running: 40, HasRunning: true, Waiting: 40, HasWaiting: true}, at(1500*time.Millisecond))
	want.Running = 40
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(2100*time.Millisecond))); diff != "" {
		t.Errorf("after a late report (-want +got):\n%s", diff)
	}

	// Running was last reported at 1.5s: at 4.6s it is older than the 3s
	// default and published as 0, while the event's fields (2s) are not.
	want = &fleetwatch.Load{Running: 0, Waiting: 9, KVCacheUsage: fptr(0.75), AgeMs: 2600, Source: fleetwatch.LoadSourceEvent}
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(4600*time.Millisecond))); diff != "" {
		t.Errorf("with running stale (-want +got):\n%s", diff)
	}
}

// TestObserveLoadRefuses: unknown pools and backends, reports without a
// valid field, and a zero time are not recorded.
func TestObserveLoadRefuses(t *testing.T) {
	a := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "a"}}}}})
	valid := LoadReport{Running: 1, HasRunning: true}
	for _, tt := range []struct {
		name          string
		pool, backend string
		r             LoadReport
		at            time.Time
	}{
		{"unknown pool", "q", "a", valid, at(0)},
		{"unknown backend", "p", "z", valid, at(0)},
		{"no field", "p", "a", LoadReport{Running: 1}, at(0)},
		{"negative", "p", "a", LoadReport{Running: -1, HasRunning: true}, at(0)},
		{"NaN", "p", "a", LoadReport{Waiting: math.NaN(), HasWaiting: true}, at(0)},
		{"kv beyond 1", "p", "a", LoadReport{KVCacheUsage: 1.5, HasKVCache: true}, at(0)},
		{"no time", "p", "a", valid, time.Time{}},
	} {
		if a.ObserveLoad(tt.pool, tt.backend, tt.r, tt.at) {
			t.Errorf("%s: ObserveLoad recorded it", tt.name)
		}
	}
	if l := loadOf(t, a, "a", at(0)); l != nil {
		t.Errorf("load published from refused reports: %+v", l)
	}
}

// TestLoadEventOutOfRange: an event whose kv_cache_usage is out of range
// (a caller that bypassed the decoder) does not publish it.
func TestLoadEventOutOfRange(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Evaluate(at(0))
	e := loadEvent("a", "r", at(0), 3, -1, -1)
	e.KVCacheUsage, e.HasKVCache = math.NaN(), true
	a.Observe([]fleetwatch.Event{e})
	want := &fleetwatch.Load{Running: 3, AgeMs: 0, Source: fleetwatch.LoadSourceEvent}
	if diff := cmp.Diff(want, loadOf(t, a, "a", at(0))); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestLoadMaxAgeOverrideAndValidation: a pool's load_max_age overrides the
// global one, and a negative one is refused with its key.
func TestLoadMaxAgeOverrideAndValidation(t *testing.T) {
	a := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "p", Settings: Settings{LoadMaxAge: 10 * time.Second}}}})
	a.Evaluate(at(0))
	a.Observe([]fleetwatch.Event{loadEvent("a", "r", at(0), 1, 1, -1)})
	if l := loadOf(t, a, "a", at(9*time.Second)); l == nil || l.AgeMs != 9000 {
		t.Errorf("pool load_max_age 10s: load at 9s = %+v", l)
	}
	_, err := New(Config{Settings: Settings{LoadMaxAge: -time.Second}})
	var se *SettingError
	if !errors.Is(err, ErrInvalidSettings) || !errors.As(err, &se) || se.Key != "analyzer.load_max_age" {
		t.Errorf("negative load_max_age: err = %v", err)
	}
}

// TestRouters: the snapshot counts the distinct sources of the pool's
// events within its window; events without a source are not counted; a
// source silent for a window no longer counts.
func TestRouters(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: Settings{Window: 10 * time.Second}})
	a.Evaluate(at(0))
	a.Observe([]fleetwatch.Event{
		loadEvent("a", "r1", at(time.Second), -1, -1, -1),
		loadEvent("b", "r2", at(time.Second), -1, -1, -1),
		loadEvent("a", "r1", at(2*time.Second), -1, -1, -1),
		loadEvent("a", "", at(2*time.Second), -1, -1, -1),
	})
	snapAt := func(d time.Duration) fleetwatch.Snapshot {
		s, _ := a.Snapshot("p", at(d))
		return s
	}
	if got := snapAt(3 * time.Second).Routers; got != 2 {
		t.Errorf("routers with r1 and r2 = %d, want 2", got)
	}
	a.Evaluate(at(8 * time.Second))
	a.Observe([]fleetwatch.Event{loadEvent("a", "r1", at(8*time.Second), -1, -1, -1)})
	if got := snapAt(11500 * time.Millisecond).Routers; got != 1 {
		t.Errorf("routers once r2 is a window old = %d, want 1", got)
	}
	if got := snapAt(30 * time.Second).Routers; got != 0 {
		t.Errorf("routers after silence = %d, want 0", got)
	}
}

// TestRoutersSaturate: more sources than MaxRouters count MaxRouters, and a
// slot of a source silent for a window is reused.
func TestRoutersSaturate(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: Settings{Window: 10 * time.Second}})
	a.Evaluate(at(0))
	var batch []fleetwatch.Event
	for i := range MaxRouters + 5 {
		batch = append(batch, loadEvent("a", fmt.Sprintf("r%02d", i), at(time.Second), -1, -1, -1))
	}
	a.Observe(batch)
	if s, _ := a.Snapshot("p", at(2*time.Second)); s.Routers != MaxRouters {
		t.Errorf("routers = %d, want the cap %d", s.Routers, MaxRouters)
	}
	a.Evaluate(at(12 * time.Second)) // so that the event is not clamped into the past's future
	a.Observe([]fleetwatch.Event{loadEvent("a", "late", at(12*time.Second), -1, -1, -1)})
	if s, _ := a.Snapshot("p", at(12*time.Second)); s.Routers != 1 {
		t.Errorf("routers after the others went silent = %d, want 1", s.Routers)
	}
}

// TestThousandRoutersCounted: a fleet of 1,000 routers is counted as
// 1,000 (the picker's fleet-load term scales the router's own count by it),
// whatever the order of their events.
func TestThousandRoutersCounted(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Evaluate(at(0))
	var batch []fleetwatch.Event
	for round := range 3 {
		for i := range 1000 {
			batch = append(batch, loadEvent("a", fmt.Sprintf("router-%04d", (i*7+round)%1000), at(time.Second), -1, -1, -1))
		}
	}
	a.Observe(batch)
	if s, _ := a.Snapshot("p", at(2*time.Second)); s.Routers != 1000 {
		t.Errorf("routers = %d, want 1000", s.Routers)
	}
}

// TestObserveLoadAllocatesNothing: events with load fields and sources add
// no allocation to Observe.
func TestObserveLoadAllocatesNothing(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Evaluate(at(0))
	batch := []fleetwatch.Event{
		loadEvent("a", "r1", at(time.Second), 3, 1, 0.5),
		loadEvent("b", "r2", at(time.Second), 2, 0, 0.25),
		loadEvent("a", "r3", at(time.Second), -1, 4, -1),
	}
	a.Observe(batch)
	if n := testing.AllocsPerRun(100, func() { a.Observe(batch) }); n != 0 {
		t.Errorf("Observe with load allocates %v times per batch", n)
	}
}

// BenchmarkLoadHotPath is what an event with load fields and a source adds
// to Observe: the report's update and the router count, with four sources
// in runs of a batch (the previous slot hits) and, as the worst case,
// interleaved event by event among 32.
func BenchmarkLoadHotPath(b *testing.B) {
	for _, tt := range []struct {
		name    string
		sources int
		run     int
	}{{"4-sources-batched", 4, benchBatch}, {"32-sources-interleaved", 32, 1}} {
		b.Run(tt.name, func(b *testing.B) {
			names := make([]string, tt.sources)
			for i := range names {
				names[i] = fmt.Sprintf("router-%02d", i)
			}
			var rs routerSet
			var bk backend
			ev := loadEvent("a", "", at(0), 3, 1, 0.5)
			window := int64(30 * time.Second)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				ts := at(time.Duration(i) * time.Microsecond)
				ev.Source = names[(i/tt.run)%tt.sources]
				bk.observeEventLoad(&ev, ts.UnixNano())
				rs.observe(ev.Source, ts.UnixNano(), window)
			}
		})
	}
}

// TestRoutersNotInterned: equal sources in different strings (not
// interned) are one router, whatever the order of their events.
func TestRoutersNotInterned(t *testing.T) {
	var rs routerSet
	window := int64(time.Minute)
	for i := range 200 {
		src := strings.Clone([]string{"alpha", "beta", "gamma"}[i%3])
		rs.observe(src, int64(i), window)
	}
	if got := rs.count(200, window); got != 3 {
		t.Errorf("count = %d, want 3", got)
	}
}

// TestRetryBudgetFollowsLoad: the snapshot carries the fleet-wide retry
// budget once a backend's load says how busy the pool is, free while at
// least half its KV cache is idle and budgeted when requests wait; without
// load it is absent and routers keep their own budgets.
func TestRetryBudgetFollowsLoad(t *testing.T) {
	a := newAnalyzer(t, Config{})
	for i := range 30 {
		a.Observe([]fleetwatch.Event{event("p", "a", ok, at(time.Duration(i)*100*time.Millisecond), 100)})
	}
	s, _ := a.Snapshot("p", at(3*time.Second))
	if s.RetryBudget != nil {
		t.Fatalf("retry_budget = %+v without any load, want none", s.RetryBudget)
	}
	a.ObserveLoad("p", "a", LoadReport{KVCacheUsage: 0.2, HasKVCache: true}, at(3*time.Second))
	s, _ = a.Snapshot("p", at(3*time.Second))
	if s.RetryBudget == nil || !s.RetryBudget.Free || s.RetryBudget.Spare == nil || *s.RetryBudget.Spare < 0.79 {
		t.Fatalf("retry_budget = %+v at 20%% KV cache, want free with spare 0.8", s.RetryBudget)
	}
	a.ObserveLoad("p", "a", LoadReport{KVCacheUsage: 0.7, HasKVCache: true, Waiting: 4, HasWaiting: true}, at(4*time.Second))
	s, _ = a.Snapshot("p", at(4*time.Second))
	if s.RetryBudget == nil || s.RetryBudget.Free || !(s.RetryBudget.PerSec > DefaultRetryBudgetFloor) {
		t.Fatalf("retry_budget = %+v with requests waiting, want budgeted above the floor (30 attempts in the window)", s.RetryBudget)
	}
}

// TestLoadBeat: every pool, whatever its routers, gets a snapshot every
// Heartbeat (1 s) and its loads every LoadBeat (250 ms) in between
// (Evaluation.Loads, three per second, with the last snapshot's seq and
// without reasons); a negative LoadBeat turns the load beats off. The
// caller ticks every 100 ms, as serve does.
func TestLoadBeat(t *testing.T) {
	for _, tt := range []struct {
		routers   int
		loadBeat  time.Duration
		snapshots int           // from 2 s to 4 s
		loads     int           // from 2 s to 4 s
		beat      time.Duration // Analyzer.Beat
	}{
		{1, 0, 2, 6, 250 * time.Millisecond},
		{fleetwatch.ManyRouters + 1, 0, 2, 6, 250 * time.Millisecond},
		{fleetwatch.ManyRouters + 1, -1, 2, 0, time.Second},
	} {
		t.Run(fmt.Sprintf("%d routers, %v", tt.routers, tt.loadBeat), func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: Settings{LoadBeat: tt.loadBeat}})
			a.Evaluate(at(0))
			var batch []fleetwatch.Event
			for r := range tt.routers {
				batch = append(batch, loadEvent("a", fmt.Sprintf("r%d", r), at(time.Second), -1, -1, -1))
			}
			a.Observe(batch)
			snaps, loads := 0, 0
			var seq uint64
			for d := time.Second; d < 4*time.Second; d += 100 * time.Millisecond {
				ev := a.Evaluate(at(d))
				for _, s := range ev.Snapshots {
					seq = s.Seq
				}
				for _, l := range ev.Loads {
					if l.Seq != seq || l.Backends[0].Reason != "" || l.Backends[0].P95TTFTMs != nil {
						t.Errorf("load beat at %v: seq %d (last snapshot's %d), reason %q, p95 %v", d, l.Seq, seq, l.Backends[0].Reason, l.Backends[0].P95TTFTMs)
					}
				}
				if d >= 2*time.Second {
					snaps += len(ev.Snapshots)
					loads += len(ev.Loads)
				}
			}
			if snaps != tt.snapshots || loads != tt.loads {
				t.Errorf("%d snapshots and %d load beats from 2 s to 4 s, want %d and %d", snaps, loads, tt.snapshots, tt.loads)
			}
			if got := a.Beat("p"); got != tt.beat {
				t.Errorf("Beat = %v, want %v", got, tt.beat)
			}
		})
	}
	fresh := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "p"}}})
	if got := fresh.Beat("nope"); got != 0 {
		t.Errorf("Beat of an unknown pool = %v, want 0", got)
	}
}

// TestHeartbeatsSpreadAcrossPools: pools that appear together beat apart
// (each at a phase of its own within the heartbeat), so a tick carries a
// fraction of them instead of all at once.
func TestHeartbeatsSpreadAcrossPools(t *testing.T) {
	const pools = 100
	var cfg Config
	for i := range pools {
		cfg.Pools = append(cfg.Pools, PoolConfig{ID: fmt.Sprintf("pool-%03d", i)})
	}
	a := newAnalyzer(t, cfg)
	if ev := a.Evaluate(at(0)); len(ev.Snapshots) != pools {
		t.Fatalf("first Evaluate: %d snapshots, want every pool's", len(ev.Snapshots))
	}
	most, total := 0, 0
	for d := 100 * time.Millisecond; d < 6*time.Second; d += 100 * time.Millisecond {
		n := len(a.Evaluate(at(d)).Snapshots)
		if d >= time.Second { // whole heartbeats after the first
			most, total = max(most, n), total+n
		}
	}
	if total != 5*pools {
		t.Errorf("%d snapshots over 5 s, want one per pool per second (%d)", total, 5*pools)
	}
	if most > pools/4 {
		t.Errorf("a tick carried %d of %d pools' heartbeats, want them spread (at most a quarter)", most, pools)
	}
}
