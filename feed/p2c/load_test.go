package p2c

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// withLoad gives b a published load of total requests (running), ageMs old
// at the snapshot.
func withLoad(b fleetwatch.Backend, total float64, ageMs int64) fleetwatch.Backend {
	b.Load = &fleetwatch.Load{Running: total, AgeMs: ageMs, Source: "event"}
	return b
}

// earlier is pool(seq, bs...) taken a second before t0: the first snapshot
// of a test whose loads are reported at t0, after it.
func earlier(seq uint64, bs ...fleetwatch.Backend) *fleetwatch.Snapshot {
	s := pool(seq, bs...)
	s.At = fleetwatch.At(t0.Add(-time.Second))
	return s
}

// The load score ranks by published load + R x the router's change since
// the snapshot, R x its own count for a backend with no load or a stale
// one, and only its own count with the in-flight score.
func TestLoadEstimate(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{Score: LoadScore})
	p.Update(earlier(1, backend("a", 200), backend("b", 200), backend("c", 200)))
	busy(t, p, "a") // one before the snapshot: not part of the change
	snap := pool(2, withLoad(backend("a", 200), 10, 0), withLoad(backend("b", 200), 4, 1500), backend("c", 200))
	snap.Routers = 4
	p.Update(snap)
	busy(t, p, "a")
	busy(t, p, "b")
	busy(t, p, "c")
	busy(t, p, "c")
	st := p.state.Load()
	load := func(id string, stale bool) float64 {
		return p.loadOf(st, &st.entries[st.byID[id]], stale, c.now.UnixNano())
	}
	check := func(when string, want map[string]float64, stale bool) {
		t.Helper()
		for id, w := range want {
			if got := load(id, stale); math.Abs(got-w) > 1e-9 {
				t.Errorf("%s: load of %s = %v, want %v", when, id, got, w)
			}
		}
	}
	// a: 10 + 4 x (2 - 1) = 14, its report fresh; b: 4 + 4 x 1 = 8, its
	// report 1.5 s old, so blended with 4 x its own count (4) with the
	// share e^(-1.5/2); c has no load: 4 x 2.
	wb := math.Exp(-0.75)
	check("fresh", map[string]float64{"a": 14, "b": wb*8 + (1-wb)*4, "c": 8}, false)
	// 0.6 s later b's report is past LoadStale (2.1 s): 4 x its own count.
	c.Advance(600 * time.Millisecond)
	wa := math.Exp(-0.3)
	check("b stale", map[string]float64{"a": wa*14 + (1-wa)*8, "b": 4, "c": 8}, false)
	// A stale snapshot: every backend by R x its own count.
	check("stale snapshot", map[string]float64{"a": 8, "b": 4, "c": 8}, true)

	// The change may be negative, the estimate not.
	p2 := newPicker(&clock{now: t0}, Settings{Score: LoadScore})
	p2.Update(earlier(1, backend("a", 200)))
	h := busy(t, p2, "a")
	snap2 := pool(2, withLoad(backend("a", 200), 1, 0))
	snap2.Routers = 16
	p2.Update(snap2)
	h.Done(fleetwatch.OutcomeOK, 100, false)
	st2 := p2.state.Load()
	if got := p2.loadOf(st2, &st2.entries[0], false, t0.UnixNano()); got != 0 {
		t.Errorf("after a finish: load %v, want 0 (1 + 16 x -1, floored)", got)
	}
	// The in-flight score ignores the published load.
	p3 := newPicker(&clock{now: t0}, Settings{Score: InFlightScore})
	p3.Update(snap2)
	busy(t, p3, "a")
	st3 := p3.state.Load()
	if got := p3.loadOf(st3, &st3.entries[0], false, t0.UnixNano()); got != 1 {
		t.Errorf("in-flight score: load %v, want 1", got)
	}
}

// With published loads, the picker sends to the backend the fleet has left
// emptiest, although this router's own counts are equal.
func TestLoadScoreFollowsPublishedLoad(t *testing.T) {
	for _, tt := range []struct {
		score Score
		want  float64 // share of "idle"
	}{{LoadScore, 0.5}, {InFlightScore, 0.2}} {
		t.Run(tt.score.Name, func(t *testing.T) {
			p := newPicker(&clock{now: t0}, Settings{Score: tt.score, RetryRatio: -1})
			snap := pool(1, withLoad(backend("idle", 200), 0, 0), withLoad(backend("b", 200), 20, 0),
				withLoad(backend("c", 200), 20, 0), withLoad(backend("d", 200), 20, 0), withLoad(backend("e", 200), 20, 0))
			snap.Routers = 8
			p.Update(snap)
			got := counts(p, seeded(3), Request{}, 4000)
			share := float64(got["idle"]) / 4000
			t.Logf("%s: share of the idle backend %.3f", tt.score.Name, share)
			if tt.score.FleetLoad && share < tt.want {
				t.Errorf("load score: idle backend's share %.3f, want >= %.2f (it is in 3 of 5 samples of 3)", share, tt.want)
			}
			if !tt.score.FleetLoad && math.Abs(share-tt.want) > 0.05 {
				t.Errorf("in-flight score: idle backend's share %.3f, want about %.2f (blind to the load)", share, tt.want)
			}
		})
	}
}

// Choices: the pick compares that many distinct candidates and takes the
// lowest score.
func TestChoices(t *testing.T) {
	for _, choices := range []int{1, 2, 3, 4, 8, 20} {
		t.Run(fmt.Sprint(choices), func(t *testing.T) {
			p := newPicker(&clock{now: t0}, Settings{Score: InFlightScore, Choices: choices, RetryRatio: -1})
			p.Update(pool(1, ids(8)...))
			// Backend i has i requests in flight: the pick is the lowest
			// index among the sampled ones.
			for i, b := range ids(8) {
				for range i {
					busy(t, p, b.Backend)
				}
			}
			const n = 20000
			got := counts(p, seeded(uint64(choices)), Request{}, n)
			k := min(choices, 8)
			// P(b0000 chosen) = P(b0000 among k of 8) = k/8.
			share := float64(got["b0000"]) / n
			if want := float64(k) / 8; math.Abs(share-want) > 0.02 {
				t.Errorf("choices %d: least-loaded backend's share %.3f, want %.3f", choices, share, want)
			}
		})
	}
}

// sampleSkip never draws a skipped entry, with a binary search (small pool)
// and the alias table (large pool), and returns -1 when all are skipped.
func TestSampleSkip(t *testing.T) {
	for _, n := range []int{5, aliasMin + 3} {
		w := make([]float64, n)
		for i := range w {
			w[i] = 1
		}
		tbl := newTable(w)
		r := seeded(5)
		for range 5000 {
			skip := []int{int(r.Uint64() % uint64(n)), -1, int(r.Uint64() % uint64(n)), int(r.Uint64() % uint64(n))}
			orig := append([]int(nil), skip...)
			i := tbl.sampleSkip(r.Uint64(), skip)
			if i < 0 || i >= n {
				t.Fatalf("n %d: drew %d", n, i)
			}
			for _, s := range orig {
				if i == s {
					t.Fatalf("n %d: drew skipped %d (skip %v)", n, i, orig)
				}
			}
		}
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		if i := tbl.sampleSkip(r.Uint64(), all); i != -1 {
			t.Errorf("n %d: everything skipped, drew %d", n, i)
		}
	}
}

// The snapshot's retry budget: free retries while the pool has spare
// capacity; otherwise the router's share of per_sec (per_sec / routers a
// second, about ten seconds of it at most); the per-router budget with a
// stale snapshot or none.
func TestFleetRetryBudget(t *testing.T) {
	retry := Request{Retry: true}
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryFloorPerSec: 1})
	snap := pool(1, ids(4)...)
	snap.Routers = 5
	snap.RetryBudget = &fleetwatch.RetryBudget{Free: true, PerSec: 10}
	p.Update(snap)
	for i := range 100 {
		if _, err := pickDone(p, seeded(1), retry); err != nil {
			t.Fatalf("free retry %d: %v", i, err)
		}
	}
	// Not free: 10 / 5 = 2 retries a second, one second's worth to start.
	snap = pool(2, ids(4)...)
	snap.Routers = 5
	snap.TTLMs = 120_000 // fresh for the two minutes below
	snap.RetryBudget = &fleetwatch.RetryBudget{PerSec: 10}
	p.Update(snap)
	allowed := func() int {
		n := 0
		for range 100 {
			if _, err := pickDone(p, seeded(1), retry); err == nil {
				n++
			} else if !errors.Is(err, ErrRetryBudget) {
				t.Fatal(err)
			}
		}
		return n
	}
	if got := allowed(); got != 2 {
		t.Errorf("at once: %d retries allowed, want 2 (one second of 10/s over 5 routers)", got)
	}
	c.Advance(time.Second)
	if got := allowed(); got != 1 { // 2 x (1 - e^-0.1) = 1.9: one whole token
		t.Errorf("after 1 s: %d retries allowed, want 1", got)
	}
	c.Advance(time.Minute)
	if got := allowed(); got != 19 { // the balance's ceiling: 2/s x 10 s x (1 - e^-6) = 19.95
		t.Errorf("after a minute: %d retries allowed, want 19", got)
	}
	// A stale snapshot: the per-router budget (1/s floor, 10 s of it).
	c.Advance(2 * time.Minute)
	if got := allowed(); got != 9 {
		t.Errorf("stale snapshot: %d retries allowed, want 9 (the per-router floor's 10 s ceiling)", got)
	}
}

// Choices unset: three while the snapshot counts at most 16 routers, two
// beyond (up to 8 routers a pick scans instead).
func TestDefaultChoicesByRouters(t *testing.T) {
	for _, tt := range []struct{ routers, want int }{{0, 3}, {1, 3}, {2, 3}, {16, 3}, {17, 2}, {64, 2}} {
		p := newPicker(&clock{now: t0}, Settings{})
		snap := pool(1, ids(8)...)
		snap.Routers = tt.routers
		p.Update(snap)
		if got := p.state.Load().choices; got != tt.want {
			t.Errorf("routers %d: %d choices, want %d", tt.routers, got, tt.want)
		}
	}
}

// A negative LoadStale never discards or discounts a published load.
func TestLoadNeverStale(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{LoadStale: -1})
	snap := pool(1, withLoad(backend("a", 200), 7, 60_000))
	snap.TTLMs = 3_600_000
	p.Update(snap)
	c.Advance(time.Minute)
	st := p.state.Load()
	if got := p.loadOf(st, &st.entries[0], false, c.now.UnixNano()); got != 7 {
		t.Errorf("a two-minute-old load: %v, want 7 as published", got)
	}
}

// Pick stays at 0 allocations with published loads, a fleet retry budget
// and every choice count.
func TestLoadPickAllocs(t *testing.T) {
	for _, choices := range []int{0, 2, 8} {
		c := &clock{now: t0}
		p := newPicker(c, Settings{Choices: choices})
		bs := ids(100)
		for i := range bs {
			bs[i] = withLoad(bs[i], float64(i%9), 100)
		}
		snap := pool(1, bs...)
		snap.Routers = 8
		snap.RetryBudget = &fleetwatch.RetryBudget{PerSec: 1000}
		p.Update(snap)
		r := seeded(1)
		for _, req := range []Request{{}, {Prefix: 42, HasPrefix: true}, {Exclude: "b0003"}} {
			if a := testing.AllocsPerRun(1000, func() {
				c, _ := p.Pick(r, req)
				c.Done(fleetwatch.OutcomeOK, 100, false)
			}); a != 0 {
				t.Errorf("choices %d: Pick(%+v) allocates %v times", choices, req, a)
			}
		}
	}
}

// A snapshot whose at is after the router's clock (skew) decays a published
// load by its exact age, the report's age minus the skew, never below 0:
// the decay computed at the snapshot does not apply before it.
func TestLoadDecayBeforeSnapshot(t *testing.T) {
	c := &clock{now: t0.Add(-300 * time.Millisecond)}
	p := newPicker(c, Settings{Score: LoadScore})
	snap := pool(1, withLoad(backend("a", 200), 10, 1000), withLoad(backend("b", 200), 6, 100))
	snap.Routers = 4
	p.Update(snap)
	busy(t, p, "a")
	st := p.state.Load()
	// a: 10 + 4 x 1 = 14 against 4 x 1, its report 0.7 s old; b: age
	// -0.2 s counts as 0, so its published 6 in full.
	wa := math.Exp(-0.35)
	for id, want := range map[string]float64{"a": wa*14 + (1-wa)*4, "b": 6} {
		if got := p.loadOf(st, &st.entries[st.byID[id]], false, c.now.UnixNano()); math.Abs(got-want) > 1e-9 {
			t.Errorf("load of %s = %v, want %v", id, got, want)
		}
	}
}

// A snapshot that counts one router: the load score ranks by the router's
// own counts where the load came on outcome events (its own traffic's
// echo), keeps a scraped load, and with two routers keeps both.
func TestAloneRanksByOwnCounts(t *testing.T) {
	withSource := func(b fleetwatch.Backend, total float64, source string) fleetwatch.Backend {
		b.Load = &fleetwatch.Load{Running: total, Source: source}
		return b
	}
	for _, tt := range []struct {
		routers int
		source  string
		want    float64 // the load "a" is ranked by
	}{
		{1, fleetwatch.LoadSourceEvent, 3},   // its own count
		{1, fleetwatch.LoadSourceMetrics, 9}, // the scrape: 9 + 1 x (3 - 3)
		{2, fleetwatch.LoadSourceEvent, 9},   // shared: 9 + 2 x (3 - 3)
		{1, "", 9},                           // an analyzer that names no source
	} {
		t.Run(fmt.Sprintf("%d-%s", tt.routers, tt.source), func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{Score: LoadScore, RetryRatio: -1})
			p.Update(earlier(1, ids(4)...))
			for range 3 {
				busy(t, p, "b0000")
			}
			bs := ids(4)
			for i := range bs {
				bs[i] = withSource(bs[i], 9, tt.source)
			}
			bs[1] = withSource(bs[1], 0, tt.source) // b0001 published idle
			snap := pool(2, bs...)
			snap.Routers = tt.routers
			p.Update(snap)
			st := p.state.Load()
			if got := p.loadOf(st, &st.entries[0], false, c.now.UnixNano()); got != tt.want {
				t.Errorf("load of b0000: %v, want %v", got, tt.want)
			}
			// Alone with event loads, b0000 (3 in flight) is never picked
			// and the rest share evenly: every candidate is compared, by
			// own counts, all 0. Otherwise b0001's published 0 wins every
			// pick it is sampled into.
			got := counts(p, seeded(7), Request{}, 4000)
			if tt.routers == 1 && tt.source == fleetwatch.LoadSourceEvent {
				if got["b0000"] != 0 || got["b0001"] > 1600 {
					t.Errorf("alone: picks %v, want none to b0000 and b0001 about a third", got)
				}
			} else if got["b0001"] < 2800 {
				t.Errorf("published load: picks %v, want b0001 in most (3 or 4 of 4 sampled)", got)
			}
		})
	}
}

// The baseline at the report: a load report older than an earlier snapshot
// does not include what this router sent since that snapshot, so by
// default the change is counted from the count at the first snapshot after
// the report; a report newer than every earlier snapshot counts it from
// the snapshot that carries the report.
func TestBaselineAtReport(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ageMs int64
		want  float64 // the load b0000 is ranked by
	}{
		{"old report", 1500, 15}, // 9 + 2 x (3 - 0): the report predates snapshot 1
		{"new report", 500, 9},   // 9 + 2 x (3 - 3): snapshot 2 is the first after it
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0.Add(time.Second)}
			p := newPicker(c, Settings{Score: LoadScore, RetryRatio: -1, LoadStale: -1})
			first := pool(1, ids(4)...)
			first.Routers = 2
			p.Update(first) // at t0, b0000 idle
			for range 3 {
				busy(t, p, "b0000")
			}
			bs := ids(4)
			bs[0].Load = &fleetwatch.Load{Running: 9, AgeMs: tt.ageMs, Source: fleetwatch.LoadSourceEvent}
			second := pool(2, bs...)
			second.Routers = 2
			second.At = fleetwatch.At(t0.Add(time.Second))
			p.Update(second)
			st := p.state.Load()
			if got := p.loadOf(st, &st.entries[0], false, c.now.UnixNano()); got != tt.want {
				t.Errorf("load of b0000 = %v, want %v", got, tt.want)
			}
		})
	}
}

// baselineAt keeps the last 8 snapshots' counts: a report older than all
// of them takes the oldest kept.
func TestBaselineAtKeepsEight(t *testing.T) {
	var l local
	var got int64
	for i := range int64(10) { // snapshots at 1..10 s with counts 10..19
		got = l.baselineAt((i+1)*1e9, 10+i, 5e9+1)
	}
	if got != 15 { // the first at or after 5 s + 1 ns is the one at 6 s
		t.Errorf("baseline of a report at 5 s: %d, want 15", got)
	}
	if got = l.baselineAt(11e9, 20, 0); got != 13 { // kept: 4..11 s
		t.Errorf("baseline of a report older than every kept snapshot: %d, want 13", got)
	}
	if got = l.baselineAt(12e9, 21, 13e9); got != 21 {
		t.Errorf("baseline of a report after the snapshot: %d, want its own count 21", got)
	}
}

// RunningWeight scales a published load's running sequences: waiting +
// w x running, 1 by default, 0 (a negative setting) for waiting only.
func TestRunningWeight(t *testing.T) {
	for _, tt := range []struct {
		weight, want float64
	}{{0, 10}, {1, 10}, {0.25, 4}, {-1, 2}} {
		c := &clock{now: t0}
		p := newPicker(c, Settings{RunningWeight: tt.weight})
		b := backend("a", 200)
		b.Load = &fleetwatch.Load{Running: 8, Waiting: 2, Source: fleetwatch.LoadSourceMetrics}
		snap := pool(1, b, backend("b", 200))
		snap.Routers = 2
		p.Update(snap)
		st := p.state.Load()
		if got := st.entries[0].pub.pubLoad(); got != tt.want {
			t.Errorf("RunningWeight %v: published load %v, want %v", tt.weight, got, tt.want)
		}
	}
}
