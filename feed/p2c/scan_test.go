package p2c

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// scanPool is a pool of n backends with scraped loads of 5, except backend
// idle with 0, counting routers. (Scraped: a router alone ranks a load that
// came on its own outcome events by its own counts; see
// TestAloneRanksByOwnCounts.)
func scanPool(n, idle, routers int) *fleetwatch.Snapshot {
	bs := ids(n)
	for i := range bs {
		load := 5.0
		if i == idle {
			load = 0
		}
		bs[i] = withLoad(bs[i], load, 100)
		bs[i].Load.Source = fleetwatch.LoadSourceMetrics
	}
	snap := pool(1, bs...)
	snap.Routers = routers
	return snap
}

// Up to ScanRouters routers (8 by default) a fresh pick compares every
// candidate, so the one idle backend of 16 takes every pick; beyond it
// three are sampled and the idle one wins only the picks it is sampled
// into (about 3 in 16). A negative ScanRouters is the default (it kept the
// sampled rule of before 2026-12-05 until 2026-12-06).
func TestScanComparesEveryCandidate(t *testing.T) {
	for _, tt := range []struct {
		routers, scanRouters int
		scan                 bool
	}{
		{1, 0, true},
		{4, 0, true},
		{8, 0, true},
		{9, 0, false},
		{16, 0, false},
		{0, 0, false}, // no router counted yet
		{4, -1, true},
		{12, 12, true},
	} {
		t.Run(fmt.Sprintf("routers %d scan_routers %d", tt.routers, tt.scanRouters), func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{RetryRatio: -1, ScanRouters: tt.scanRouters})
			p.Update(scanPool(16, 11, tt.routers))
			got := counts(p, seeded(3), Request{}, 2000)["b0011"]
			if tt.scan && got != 2000 {
				t.Errorf("the idle backend got %d of 2000 picks, want all", got)
			}
			if !tt.scan && (got < 200 || got > 900) {
				t.Errorf("the idle backend got %d of 2000 picks, want about 3 or 4 in 16 (sampled)", got)
			}
		})
	}
}

// A tie goes to any of the tied candidates with equal probability,
// whatever their place in the pool: with b0000 busy and the rest equal,
// b0001 (right after it) gets no more than the others.
func TestScanTiesSpreadEvenly(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	snap := pool(1, ids(4)...)
	snap.Routers = 2
	p.Update(snap)
	defer busy(t, p, "b0000").Done(fleetwatch.OutcomeOK, 100, false)
	got := counts(p, seeded(5), Request{}, 3000)
	if got["b0000"] != 0 {
		t.Errorf("the busy backend got %d picks, want 0", got["b0000"])
	}
	for _, id := range []string{"b0001", "b0002", "b0003"} {
		if got[id] < 850 || got[id] > 1150 {
			t.Errorf("picks %v: want about 1000 each for b0001..b0003", got)
		}
	}
}

// TestScanDownWeighted states what a scan promises an idle down-weighted
// backend: a share of the picks equal to its weight over the largest
// weight, whatever the pool's size. Each scan compares every candidate of
// the largest weight and lets a down-weighted one join with probability
// weight / largest weight (as a sampled candidate after the first joins a
// comparison: Pick's doc), and an idle candidate wins the comparison it
// joins. So an idle backend at weight 0.25 gets a quarter of the picks
// among 16 and among 64, four and sixteen times a healthy backend's share
// there, and a half-open one at the trickle weight 0.05 gets 5% in either
// pool.
//
// Why a share of the picks rather than of a healthy backend's share: the
// half-open trickle must reach a half-open backend at a rate that does not
// fall with the pool's size, or its breaker would need the pool's size
// times longer to see its half_open_successes (5 ok in a row) and close;
// sampled picks (beyond ScanRouters routers) give it weight / total weight
// of the picks instead, 0.08% among 64. The price is what a backend whose
// every answer is an instant failure gets while the analyzer has only
// lowered its weight: it holds nothing in flight, so it is idle whenever
// it is compared (TestScanInstantFailureShare). That is why the analyzer
// opens a backend that refuses everything (analyzer.Settings.
// ThrottleRefuseRate) rather than down-weighting it.
func TestScanDownWeighted(t *testing.T) {
	for _, tt := range []struct {
		n      int
		weight float64
	}{{16, 0.25}, {64, 0.25}, {16, 0.05}, {64, 0.05}} {
		t.Run(fmt.Sprintf("%d backends, weight %v", tt.n, tt.weight), func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{RetryRatio: -1})
			snap := scanPool(tt.n, 11, 4)
			snap.Backends[11].Weight = tt.weight
			p.Update(snap)
			const picks = 20000
			got := float64(counts(p, seeded(9), Request{}, picks)["b0011"]) / picks
			if math.Abs(got-tt.weight) > 0.15*tt.weight {
				t.Errorf("the idle backend at weight %v got %.4f of the picks among %d, want %v (weight / largest weight)", tt.weight, got, tt.n, tt.weight)
			}
		})
	}
}

// TestScanInstantFailureShare: what a down-weighted backend whose answers
// are all instant failures (a bare 429, a fast 500) gets from a scan. It
// never holds a request in flight, and its failures leave no TTFT sample
// (Choice.Done takes TTFT from ok outcomes only; the analyzer's EWMA
// likewise), so it is scored with the load of an idle backend and the pool
// median's TTFT: neither penalised nor preferred. It joins a scan with
// probability weight / largest weight and then wins unless other idle
// candidates tie with it (a tie goes to one of the tied at random). Among
// 16 at weight 0.06 it therefore gets about 0.06 / 16 of the picks while
// every backend is idle, the case of the real-process measurement of
// issue 31 (0.77% among 16 behind 4 routers with little traffic), and the
// whole 6% when the others have requests in flight, the case of the
// simulator's bare-429 scenario before the refusal rule (2-12%).
func TestScanInstantFailureShare(t *testing.T) {
	const n, weight, picks = 16, 0.06, 40000
	for _, tt := range []struct {
		name     string
		load     float64 // the others' published load
		min, max float64
	}{
		{"every backend idle: it ties with them", 0, 0.5 * weight / n, 2 * weight / n},
		{"the others busy: it wins every scan it joins", 5, 0.85 * weight, 1.15 * weight},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{RetryRatio: -1})
			bs := ids(n)
			for i := range bs {
				bs[i] = withLoad(bs[i], tt.load, 100)
				bs[i].Load.Source = fleetwatch.LoadSourceMetrics
			}
			bs[3].Weight, bs[3].EWMATTFTMs, bs[3].Load.Running = weight, nil, 0 // no TTFT sample: only failures
			snap := pool(1, bs...)
			snap.Routers = 4
			p.Update(snap)
			r := seeded(21)
			failed := 0
			for range picks {
				ch, err := p.Pick(r, Request{})
				if err != nil {
					t.Fatal(err)
				}
				if ch.Backend == "b0003" {
					failed++
					ch.Done(fleetwatch.OutcomeThrottled, 0.2, false) // an instant bare 429
				} else {
					ch.Done(fleetwatch.OutcomeCanceled, 0, false)
				}
			}
			if got := float64(failed) / picks; got < tt.min || got > tt.max {
				t.Errorf("the failing backend got %.4f of the picks, want %.4f to %.4f", got, tt.min, tt.max)
			}
		})
	}
}

// A scan skips the excluded backend, open ones and those of weight 0; a
// retry whose drawn tier holds only the backend it excludes falls back to
// the other tiers, as a sampled pick does.
func TestScanSkips(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	snap := scanPool(8, 2, 4)
	snap.Backends[3].State = fleetwatch.StateOpen
	snap.Backends[3].Load.Running = 0
	snap.Backends[4].Weight = 0
	snap.Backends[4].Load.Running = 0
	p.Update(snap)
	got := counts(p, seeded(11), Request{Exclude: "b0002", Retry: true}, 1000)
	if got["b0002"]+got["b0003"]+got["b0004"] != 0 {
		t.Errorf("picks %v: the excluded, the open and the weight-0 backend must get none", got)
	}

	prio := scanPool(3, 0, 4)
	prio.Mode = fleetwatch.ModeFailover
	prio.Backends[1].Priority, prio.Backends[2].Priority = 1, 1
	p.Update(prio)
	got = counts(p, seeded(12), Request{Exclude: "b0000", Retry: true}, 1000)
	if got["b0000"] != 0 || got["b0001"]+got["b0002"] != 1000 {
		t.Errorf("failover retry: picks %v, want all on the lower priority's b0001 and b0002", got)
	}
}

// In a pool larger than ScanMax a scan compares a run of ScanMax entries
// from a random start, so the idle backend of 128 is in about half the
// comparisons, each backend as often as any other.
func TestScanMaxWindow(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(scanPool(128, 100, 4))
	if got := counts(p, seeded(13), Request{}, 4000)["b0100"]; got < 1800 || got > 2200 {
		t.Errorf("the idle backend of 128 got %d of 4000 picks, want about %d (ScanMax / 128)", got, 4000*ScanMax/128)
	}
}

// The scan computes the default load score inline; a copy of the score
// whose Rank is not recognised takes the general path (scoreOf). Over
// random pools (costs, loads fresh and stale, EWMAs missing, slow
// outliers, down-weighted backends, a snapshot from the future) the two
// pickers, fed the same draws and the same outcomes, pick alike.
func TestScanInlineScoreMatchesScoreOf(t *testing.T) {
	general := Score{Name: "load-general", FleetLoad: true,
		Rank: func(load, ewma, cost, cw float64) float64 { return inFlightRank(load, ewma, cost, cw) }}
	for seed := range uint64(40) {
		r := seeded(100 + seed)
		n := 2 + int(r.Uint64()%30)
		bs := ids(n)
		for i := range bs {
			if r.Uint64()%5 == 0 {
				bs[i].EWMATTFTMs = nil
			} else {
				bs[i].EWMATTFTMs = new(float64(50 + float64(r.Uint64()%2000)))
			}
			if r.Uint64()%3 != 0 {
				bs[i] = withLoad(bs[i], float64(r.Uint64()%12), int64(r.Uint64()%4000))
			}
			if r.Uint64()%4 == 0 {
				bs[i].Weight = 0.1 + float64(r.Uint64()%9)/10
			}
			if r.Uint64()%4 == 0 {
				bs[i].CostPerMTok = new(float64(float64(r.Uint64()%50) / 10))
			}
		}
		snap := pool(1, bs...)
		snap.Routers = 1 + int(r.Uint64()%8)
		skew := time.Duration(r.Uint64()%3000)*time.Millisecond - time.Second // -1 s (the snapshot from the future) to 2 s
		c := &clock{now: t0.Add(skew)}
		s := Settings{RetryRatio: -1, CostWeightPerMs: 0.01}
		inline, gen := newPicker(c, s), newPicker(c, Settings{RetryRatio: -1, CostWeightPerMs: 0.01, Score: general})
		inline.Update(snap)
		gen.Update(snap)
		if !inline.state.Load().scan {
			t.Fatalf("seed %d: %d routers, no scan", seed, snap.Routers)
		}
		ra, rb := seeded(seed), seeded(seed)
		var open []*Choice
		for k := range 300 {
			a, errA := inline.Pick(ra, Request{})
			b, errB := gen.Pick(rb, Request{})
			if a.Backend != b.Backend || (errA == nil) != (errB == nil) {
				t.Fatalf("seed %d, pick %d: inline %q (%v), general %q (%v)", seed, k, a.Backend, errA, b.Backend, errB)
			}
			open = append(open, &a, &b)
			if k%3 == 0 { // finish the oldest pair: loads go up and down
				open[0].Done(fleetwatch.OutcomeOK, float64(k%700), false)
				open[1].Done(fleetwatch.OutcomeOK, float64(k%700), false)
				open = open[2:]
			}
			c.Advance(7 * time.Millisecond)
		}
	}
}

// Compared says how many candidates a fresh pick compares: the pool's
// backends with a weight while it scans (at most ScanMax), else the
// sampled choices.
func TestCompared(t *testing.T) {
	for _, tt := range []struct {
		n, routers, choices, want int
	}{
		{4, 4, 0, 4},
		{100, 4, 0, ScanMax},
		{16, 12, 0, DefaultChoices},
		{16, 20, 0, DefaultChoicesMany},
		{16, 0, 0, DefaultChoices},
		{16, 4, 5, 5},
	} {
		c := &clock{now: t0}
		p := newPicker(c, Settings{Choices: tt.choices})
		if got := p.Compared(); got != 0 {
			t.Errorf("no snapshot: Compared() = %d, want 0", got)
		}
		snap := scanPool(tt.n, 0, tt.routers)
		snap.Backends[1].Weight = 0 // not a candidate
		p.Update(snap)
		want := tt.want
		if tt.want == tt.n {
			want = tt.n - 1
		}
		if got := p.Compared(); got != want {
			t.Errorf("%d backends, %d routers, choices %d: Compared() = %d, want %d", tt.n, tt.routers, tt.choices, got, want)
		}
	}
	// Every backend open: nothing to compare when the pool sheds, all of
	// them when it spreads.
	for _, allOpen := range []fleetwatch.AllOpen{fleetwatch.AllOpenShed, fleetwatch.AllOpenSpread} {
		p := newPicker(&clock{now: t0}, Settings{})
		snap := scanPool(6, 0, 2)
		for i := range snap.Backends {
			snap.Backends[i].State = fleetwatch.StateOpen
		}
		snap.AllOpen = allOpen
		p.Update(snap)
		want := 0
		if allOpen == fleetwatch.AllOpenSpread {
			want = 6
		}
		if got := p.Compared(); got != want {
			t.Errorf("all open, %s: Compared() = %d, want %d", allOpen, got, want)
		}
	}
}
