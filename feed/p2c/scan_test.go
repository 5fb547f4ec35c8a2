package p2c

import (
	"fmt"
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
// candidate, so the one idle backend of 16 takes every pick; beyond it, or
// with ScanRouters < 0, three are sampled and the idle one wins only the
// picks it is sampled into (about 3 in 16).
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
		{4, -1, false},
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

// A down-weighted candidate joins a scan with probability weight / largest
// weight: the idle backend at weight 0.25 wins about a quarter of the
// picks, not every one.
func TestScanDownWeighted(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	snap := scanPool(16, 11, 4)
	snap.Backends[11].Weight = 0.25
	p.Update(snap)
	if got := counts(p, seeded(9), Request{}, 4000)["b0011"]; got < 800 || got > 1200 {
		t.Errorf("the idle backend at weight 0.25 got %d of 4000 picks, want about 1000", got)
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
