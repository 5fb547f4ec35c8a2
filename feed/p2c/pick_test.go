package p2c

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

func newPicker(c *clock, s Settings) *Picker {
	s.Now = c.Now
	return New(s)
}

// The seed's design note: four in flight at 200 ms is a better bet than two
// in flight at 3 s. The in-flight-only score disagrees, by construction.
func TestSeedExample(t *testing.T) {
	tests := []struct {
		name  string
		score Score
		want  string
	}{
		{"seed score", SeedScore, "fast"},
		{"sqrt score", SqrtScore, "fast"},
		{"power 1 equals seed", PowerScore(1), "fast"},
		{"in-flight score", InFlightScore, "slow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{Score: tt.score})
			p.Update(pool(1, backend("fast", 200), backend("slow", 3000)))
			for range 4 {
				busy(t, p, "fast")
			}
			for range 2 {
				busy(t, p, "slow")
			}
			// With two backends both are always the candidates; draw them
			// in both orders.
			for _, u := range [][]uint64{{at(0.1), at(0.9)}, {at(0.9), at(0.1)}} {
				got, err := pickDone(p, &scripted{vals: u}, Request{})
				if err != nil {
					t.Fatal(err)
				}
				if got.Backend != tt.want {
					t.Errorf("draw %v: picked %s, want %s", u, got.Backend, tt.want)
				}
			}
		})
	}
}

func TestScoreValues(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name  string
		score Score
		n     int
		ewma  float64
		cost  float64
		cw    float64
		want  float64
	}{
		{"seed pure latency", SeedScore, 4, 200, 0.6, inf, 1000},
		{"seed with cost", SeedScore, 4, 200, 0.6, 0.001, 1600},
		{"in-flight pure latency", InFlightScore, 4, 200, 0.6, inf, 5},
		{"in-flight with cost in slots", InFlightScore, 4, 200, 0.6, 0.001, 8},
		{"sqrt", SqrtScore, 3, 400, 0, inf, 80},
		{"power 0 equals in-flight", PowerScore(0), 4, 200, 0.6, 0.001, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.score.Rank(float64(tt.n), tt.ewma, tt.cost, tt.cw)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("score = %v, want %v", got, tt.want)
			}
		})
	}
}

// Scripted draws: the first candidate is the weight-proportional position
// of the first draw; the second is drawn from the rest.
func TestSampleScripted(t *testing.T) {
	bs := []fleetwatch.Backend{backend("a", 100), backend("b", 100), backend("c", 100)}
	bs[2].Weight = 0.5 // cumulative: a [0,1) b [1,2) c [2,2.5)
	tests := []struct {
		name string
		u    []uint64
		want string
	}{
		// Equal scores: the first candidate wins the tie.
		{"first in a", []uint64{at(0.1), at(0.5)}, "a"},
		{"first in b", []uint64{at(0.5), at(0.1)}, "b"},
		{"first in c", []uint64{at(0.9), at(0.1)}, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			p.Update(pool(1, bs...))
			got, err := pickDone(p, &scripted{vals: tt.u}, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Backend != tt.want {
				t.Errorf("picked %s, want %s", got.Backend, tt.want)
			}
		})
	}
}

// The two candidates are distinct even when the random source repeats
// itself: with one backend loaded, a source that always returns the same
// value still yields the other one as second candidate.
func TestCandidatesDistinct(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, backend("a", 100), backend("b", 100), backend("c", 100)))
	busy(t, p, "a")
	got, err := pickDone(p, &scripted{vals: []uint64{at(0.0)}}, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Backend == "a" {
		t.Errorf("picked the loaded backend a; the second candidate must differ from the first")
	}
}

func TestWeightZeroNeverChosen(t *testing.T) {
	bs := ids(8)
	bs[3].Weight = 0
	bs[6].Weight = 0
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, bs...))
	got := counts(p, seeded(1), Request{}, 20000)
	for _, id := range []string{bs[3].Backend, bs[6].Backend} {
		if got[id] != 0 {
			t.Errorf("%s has weight 0 and was chosen %d times", id, got[id])
		}
	}
	if len(got) != 6 {
		t.Errorf("chosen backends: %v, want the 6 with positive weight", got)
	}
}

// A half-open backend gets about its weight's share: 0.05 / 3.05.
func TestHalfOpenTrickle(t *testing.T) {
	bs := []fleetwatch.Backend{backend("a", 200), backend("b", 200), backend("c", 200), backend("h", 200)}
	bs[3].State = fleetwatch.StateHalfOpen
	bs[3].Weight = 0.05
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, bs...))
	const n = 100000
	got := counts(p, seeded(2), Request{}, n)
	share := float64(got["h"]) / n
	want := 0.05 / 3.05
	if share < want*0.8 || share > want*1.2 {
		t.Errorf("half-open share = %.4f, want about %.4f", share, want)
	}
}

// In a pool of two, the half-open backend is always the other candidate;
// its empty queue must not win every comparison: it gets at most about
// twice its weight's share even when it looks best.
func TestHalfOpenInPoolOfTwo(t *testing.T) {
	bs := []fleetwatch.Backend{backend("a", 200), backend("h", 200)}
	bs[1].State, bs[1].Weight = fleetwatch.StateHalfOpen, 0.05
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, bs...))
	for range 5 {
		busy(t, p, "a") // a is busy; h looks idle (it fails instantly)
	}
	const n = 100000
	got := counts(p, seeded(9), Request{}, n)
	share := float64(got["h"]) / n
	if share < 0.04 || share > 0.11 {
		t.Errorf("half-open share in a pool of two = %.4f, want between 0.04 and 0.11 (weight share 0.048)", share)
	}
}

func TestOpenNeverChosen(t *testing.T) {
	bs := ids(5)
	bs[1].State, bs[1].Weight, bs[1].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(30*time.Second)))
	bs[2].State, bs[2].Weight = fleetwatch.StateOpen, 1 // a weight on an open backend is ignored
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, bs...))
	got := counts(p, seeded(3), Request{}, 5000)
	if got[bs[1].Backend]+got[bs[2].Backend] != 0 {
		t.Errorf("open backends chosen: %v", got)
	}
}

func TestInFlightSteersAway(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{Score: InFlightScore})
	p.Update(pool(1, backend("a", 100), backend("b", 100)))
	var held []*Choice
	for range 3 {
		held = append(held, busy(t, p, "a"))
	}
	got := counts(p, seeded(4), Request{}, 100)
	if diff := cmp.Diff(map[string]int{"b": 100}, got); diff != "" {
		t.Errorf("picks (-want +got):\n%s", diff)
	}
	for _, c := range held {
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}
	if got := p.InFlight("a"); got != 0 {
		t.Errorf("in flight after Done = %d, want 0", got)
	}
}

// A backend the feed has no EWMA for is scored with the router's own EWMA
// when it has one, else with the pool median.
func TestLocalEWMAForNewBackend(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{Score: SeedScore})
	p.Update(pool(1, backend("known", 100), backend("new", 0)))
	// No local sample yet: new is scored at the median (100), a tie that
	// the first candidate wins.
	got, err := pickDone(p, &scripted{vals: []uint64{at(0.9), at(0.1)}}, Request{})
	if err != nil || got.Backend != "new" {
		t.Fatalf("Pick = %v, %v; want new on a tie", got, err)
	}
	// The router saw new answer slowly; failures and cold samples do not
	// count.
	busy(t, p, "new").Done(fleetwatch.OutcomeOK, 1000, false)
	busy(t, p, "new").Done(fleetwatch.OutcomeError, 1, false)
	busy(t, p, "new").Done(fleetwatch.OutcomeOK, 1, true)
	got, err = pickDone(p, &scripted{vals: []uint64{at(0.9), at(0.1)}}, Request{})
	if err != nil || got.Backend != "known" {
		t.Fatalf("Pick = %v, %v; want known (new's local EWMA is 1000 ms)", got, err)
	}
}

func TestExclude(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, backend("a", 100), backend("b", 100), backend("c", 100)))
	got := counts(p, seeded(5), Request{Exclude: "b"}, 3000)
	if got["b"] != 0 || got["a"] == 0 || got["c"] == 0 {
		t.Errorf("picks with b excluded: %v", got)
	}
	p.Update(pool(2, backend("only", 100)))
	c2, err := pickDone(p, seeded(6), Request{Exclude: "only"})
	if err != nil || c2.Backend != "only" {
		t.Errorf("Pick with the only backend excluded = %v, %v; want it anyway", c2, err)
	}
}

func TestNoBackends(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	if _, err := pickDone(p, seeded(1), Request{}); !errors.Is(err, ErrNoBackends) {
		t.Errorf("Pick before Update: err = %v, want ErrNoBackends", err)
	}
	p.Update(pool(1))
	if _, err := pickDone(p, seeded(1), Request{}); !errors.Is(err, ErrNoBackends) {
		t.Errorf("Pick on an empty pool: err = %v, want ErrNoBackends", err)
	}
}

func TestUpdateIgnoresOlderSnapshot(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(5, backend("new", 100)))
	p.Update(pool(4, backend("old", 100)))
	got, err := pickDone(p, seeded(1), Request{})
	if err != nil || got.Backend != "new" {
		t.Errorf("Pick = %v, %v; want new (seq 4 must not replace seq 5)", got, err)
	}
	next := pool(1, backend("restarted", 100))
	next.Epoch = "e2"
	next.At = fleetwatch.At(t0.Add(time.Second))
	p.Update(next)
	if got, _ := pickDone(p, seeded(1), Request{}); got.Backend != "restarted" {
		t.Errorf("Pick = %v; a newer epoch must replace the old one", got)
	}
}

// A fenced snapshot of a partition's new owner is not replaced by a later
// snapshot of the stale owner, whose lease (fence) is older.
func TestUpdateIgnoresStaleFence(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	owner := pool(1, backend("owner", 100))
	owner.Epoch, owner.Fence = "new-owner", 9
	p.Update(owner)
	stale := pool(7, backend("stale", 100))
	stale.Epoch, stale.Fence = "old-owner", 3
	stale.At = fleetwatch.At(t0.Add(time.Second))
	p.Update(stale)
	if got, _ := pickDone(p, seeded(1), Request{}); got.Backend != "owner" {
		t.Errorf("Pick = %v; a snapshot with a lower fence replaced the new owner's", got)
	}
}

// In-flight counts survive snapshots, and a removed backend's count still
// balances when its requests finish.
func TestLocalsCarryOver(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, backend("a", 100), backend("b", 100)))
	busy(t, p, "a")
	onB := busy(t, p, "b")
	p.Update(pool(2, backend("a", 100)))
	if got := p.InFlight("a"); got != 1 {
		t.Errorf("a in flight = %d, want 1", got)
	}
	p.Update(pool(3, backend("a", 100), backend("b", 100)))
	if got := p.InFlight("b"); got != 1 {
		t.Errorf("b in flight after leaving and returning = %d, want 1", got)
	}
	onB.Done(fleetwatch.OutcomeOK, 100, false)
	if got := p.InFlight("b"); got != 0 {
		t.Errorf("b in flight = %d, want 0", got)
	}
}

func TestFailover(t *testing.T) {
	open := func(b fleetwatch.Backend) fleetwatch.Backend {
		b.State, b.Weight, b.OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
		return b
	}
	prio := func(b fleetwatch.Backend, p int) fleetwatch.Backend { b.Priority = p; return b }
	a, b, c, d := prio(backend("a", 100), 0), prio(backend("b", 100), 1), prio(backend("c", 100), 1), prio(backend("d", 100), 2)
	tests := []struct {
		name     string
		backends []fleetwatch.Backend
		want     []string // the backends that get traffic
	}{
		{"primary healthy", []fleetwatch.Backend{a, b, c, d}, []string{"a"}},
		{"primary open: balance the next tier", []fleetwatch.Backend{open(a), b, c, d}, []string{"b", "c"}},
		{"two tiers open", []fleetwatch.Backend{open(a), open(b), open(c), d}, []string{"d"}},
		{"half of tier 1 open", []fleetwatch.Backend{open(a), open(b), c, d}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: t0}
			p := newPicker(clk, Settings{})
			snap := pool(1, tt.backends...)
			snap.Mode = fleetwatch.ModeFailover
			p.Update(snap)
			got := counts(p, seeded(7), Request{}, 2000)
			var chosen []string
			for _, id := range []string{"a", "b", "c", "d"} {
				if got[id] > 0 {
					chosen = append(chosen, id)
				}
			}
			if diff := cmp.Diff(tt.want, chosen); diff != "" {
				t.Errorf("backends with traffic (-want +got):\n%s\ncounts %v", diff, got)
			}
		})
	}
}

func TestAllOpen(t *testing.T) {
	bs := ids(3)
	for i := range bs {
		bs[i].State, bs[i].Weight, bs[i].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	}
	t.Run("shed", func(t *testing.T) {
		c := &clock{now: t0}
		p := newPicker(c, Settings{})
		p.Update(pool(1, bs...))
		if _, err := pickDone(p, seeded(1), Request{}); !errors.Is(err, ErrShed) {
			t.Errorf("err = %v, want ErrShed", err)
		}
	})
	t.Run("spread", func(t *testing.T) {
		c := &clock{now: t0}
		p := newPicker(c, Settings{})
		snap := pool(1, bs...)
		snap.AllOpen = fleetwatch.AllOpenSpread
		p.Update(snap)
		got := counts(p, seeded(1), Request{}, 3000)
		if len(got) != 3 {
			t.Errorf("spread picks: %v, want all three backends", got)
		}
	})
}

// A stale snapshot keeps honouring breakers whose open_until is in the
// future and otherwise spreads with equal weights.
func TestStaleSnapshot(t *testing.T) {
	bs := []fleetwatch.Backend{backend("long", 100), backend("short", 100), backend("light", 100), backend("full", 100)}
	bs[0].State, bs[0].Weight, bs[0].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	bs[1].State, bs[1].Weight, bs[1].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(8*time.Second)))
	bs[2].Weight = 0.01

	tests := []struct {
		name  string
		after time.Duration
		want  []string // backends with a fair share
	}{
		{"fresh: weights apply", 2 * time.Second, []string{"full"}},
		{"stale, short breaker still open", 6 * time.Second, []string{"light", "full"}},
		{"stale, short breaker expired", 9 * time.Second, []string{"short", "light", "full"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			p.Update(pool(1, bs...))
			c.Advance(tt.after)
			const n = 30000
			got := counts(p, seeded(8), Request{}, n)
			if got["long"] != 0 {
				t.Errorf("the breaker open for a minute was not honoured: %v", got)
			}
			var fair []string
			for _, id := range []string{"long", "short", "light", "full"} {
				if float64(got[id]) > 0.2*n {
					fair = append(fair, id)
				}
			}
			if diff := cmp.Diff(tt.want, fair); diff != "" {
				t.Errorf("backends with a fair share (-want +got):\n%s\ncounts %v", diff, got)
			}
		})
	}
}

// Stale: the router's own EWMA replaces the feed's.
func TestStaleUsesLocalEWMA(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{Score: SeedScore})
	p.Update(pool(1, backend("a", 100), backend("b", 100)))
	busy(t, p, "a").Done(fleetwatch.OutcomeOK, 5000, false)
	// Fresh: the feed says both are at 100 ms; a tie, the first wins.
	if got, _ := pickDone(p, &scripted{vals: []uint64{at(0.1), at(0.9)}}, Request{}); got.Backend != "a" {
		t.Errorf("fresh pick = %s, want a (feed EWMAs tie)", got.Backend)
	}
	c.Advance(10 * time.Second)
	if got, _ := pickDone(p, &scripted{vals: []uint64{at(0.1), at(0.9)}}, Request{}); got.Backend != "b" {
		t.Errorf("stale pick = %s, want b (a's local EWMA is 5000 ms)", got.Backend)
	}
}

func TestStaleAllOpen(t *testing.T) {
	bs := ids(2)
	for i := range bs {
		bs[i].State, bs[i].Weight, bs[i].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	}
	c := &clock{now: t0.Add(10 * time.Second)}
	p := newPicker(c, Settings{})
	p.Update(pool(1, bs...))
	if _, err := pickDone(p, seeded(1), Request{}); !errors.Is(err, ErrShed) {
		t.Errorf("err = %v, want ErrShed", err)
	}
	c.Advance(time.Minute) // the breakers' open_until passed: never send nothing
	if _, err := pickDone(p, seeded(1), Request{}); err != nil {
		t.Errorf("err = %v after open_until passed, want a pick", err)
	}
}

func TestStaleFailover(t *testing.T) {
	bs := []fleetwatch.Backend{backend("a", 100), backend("b", 100), backend("c", 100)}
	bs[0].State, bs[0].Weight, bs[0].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	bs[1].Priority, bs[2].Priority = 1, 1
	snap := pool(1, bs...)
	snap.Mode = fleetwatch.ModeFailover
	c := &clock{now: t0.Add(10 * time.Second)}
	p := newPicker(c, Settings{})
	p.Update(snap)
	got := counts(p, seeded(1), Request{}, 2000)
	if got["a"] != 0 || got["b"] == 0 || got["c"] == 0 {
		t.Errorf("stale failover picks: %v, want b and c", got)
	}
	c.Advance(time.Minute)
	got = counts(p, seeded(1), Request{}, 100)
	if got["a"] != 100 {
		t.Errorf("after a's open_until: %v, want all on the primary", got)
	}
}

func TestPickAllocs(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, ids(100)...))
	r := seeded(1)
	for _, req := range []Request{{}, {Prefix: 42, HasPrefix: true}, {Exclude: "b0003"}} {
		if a := testing.AllocsPerRun(1000, func() {
			c, _ := p.Pick(r, req)
			c.Done(fleetwatch.OutcomeOK, 100, false)
		}); a != 0 {
			t.Errorf("Pick(%+v) allocates %v times", req, a)
		}
	}
	c.Advance(time.Minute)
	if a := testing.AllocsPerRun(1000, func() {
		c, _ := p.Pick(r, Request{})
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}); a != 0 {
		t.Errorf("stale Pick allocates %v times", a)
	}
}

// The outlier guard: a candidate at or beyond 5x the pool median has its
// in-flight score scaled by EWMA / (5 x median); it still wins against a far
// busier candidate.
func TestSlowOutlierGuard(t *testing.T) {
	tests := []struct {
		name     string
		factor   float64
		fastBusy int // in flight on "fast"; "slow" has none
		slowEWMA float64
		wantSlow bool
	}{
		{"guard: 10x median scores double", 0, 1, 2000, false},  // fast 2 vs slow 1 x 2
		{"guard: far busier fast loses", 0, 2, 2000, true},      // fast 3 vs slow 2
		{"below the line: in-flight decides", 0, 1, 900, true},  // fast 2 vs slow 1
		{"guard off: in-flight decides", -1, 1, 2000, true},     // fast 2 vs slow 1
		{"factor 20: 10x is not an outlier", 20, 1, 2000, true}, // fast 2 vs slow 1
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{Score: InFlightScore, SlowOutlierFactor: tt.factor, Choices: 2}) // two scripted draws
			// The median of (200, 200, slow) is 200.
			p.Update(pool(1, backend("fast", 200), backend("other", 200), backend("slow", tt.slowEWMA)))
			for range tt.fastBusy {
				busy(t, p, "fast")
			}
			// fast is [0,1), slow is [2,3): draw fast, then slow.
			got, err := pickDone(p, &scripted{vals: []uint64{at(0.1), at(0.9)}}, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if (got.Backend == "slow") != tt.wantSlow {
				t.Errorf("picked %s, want slow=%v", got.Backend, tt.wantSlow)
			}
		})
	}
}

// The alias table (pools of aliasMin and more) draws in proportion to the
// weights, never a weight of 0, never a skipped entry.
func TestAliasSampling(t *testing.T) {
	r := seeded(11)
	weights := make([]float64, 100)
	for i := range weights {
		if i%10 != 3 {
			weights[i] = 0.05 + r.Float64()
		}
	}
	tbl := newTable(weights)
	if tbl.alias == nil {
		t.Fatal("no alias table for a pool of 100")
	}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	const draws = 400000
	got := make([]int, len(weights))
	for range draws {
		i := tbl.sample(r.Uint64(), 7, 42)
		if i == 7 || i == 42 {
			t.Fatalf("drew skipped entry %d", i)
		}
		got[i]++
	}
	rest := total - weights[7] - weights[42]
	for i, w := range weights {
		if i == 7 || i == 42 {
			continue
		}
		if w == 0 {
			if got[i] != 0 {
				t.Errorf("entry %d has weight 0 and was drawn %d times", i, got[i])
			}
			continue
		}
		want := draws * w / rest
		if math.Abs(float64(got[i])-want) > 5*math.Sqrt(want) {
			t.Errorf("entry %d (weight %.3f): %d draws, want %.0f", i, w, got[i], want)
		}
	}
}

// When one entry holds nearly all the weight and is skipped, the alias
// draws give up and the exact search still finds the others.
func TestAliasFallback(t *testing.T) {
	weights := make([]float64, 20)
	weights[0] = 1
	weights[5], weights[9] = 1e-6, 1e-6
	tbl := newTable(weights)
	r := seeded(12)
	for range 1000 {
		if i := tbl.sample(r.Uint64(), 0, -1); i != 5 && i != 9 {
			t.Fatalf("drew %d, want 5 or 9", i)
		}
	}
	if i := tbl.sample(r.Uint64(), 5, 9); i != 0 {
		t.Errorf("drew %d with 5 and 9 skipped, want 0", i)
	}
}

// Pick counts the request in flight until Done on its Choice; a second Done
// on the same Choice is a no-op, and a copy finished after the original
// never drives the count below zero but is counted.
func TestChoiceDoneOnce(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, backend("a", 100)))
	ch, err := p.Pick(seeded(1), Request{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.InFlight("a"); got != 1 {
		t.Fatalf("in flight after Pick = %d, want 1", got)
	}
	copied := ch
	ch.Done(fleetwatch.OutcomeOK, 100, false)
	ch.Done(fleetwatch.OutcomeOK, 100, false)
	if got := p.InFlight("a"); got != 0 || p.UnbalancedDone() != 0 {
		t.Errorf("after Done twice: in flight %d, unbalanced %d; want 0, 0", got, p.UnbalancedDone())
	}
	if ch.Backend != "" {
		t.Errorf("Done left the Choice %+v, want it cleared", ch)
	}
	copied.Done(fleetwatch.OutcomeOK, 100, false)
	if got := p.InFlight("a"); got != 0 || p.UnbalancedDone() != 1 {
		t.Errorf("after a copy's Done: in flight %d, unbalanced %d; want 0, 1", got, p.UnbalancedDone())
	}
	var zero Choice
	zero.Done(fleetwatch.OutcomeOK, 1, false) // no-op
	if _, err := p.Choose("nope"); !errors.Is(err, ErrNoBackends) {
		t.Errorf("Choose(nope) = %v, want ErrNoBackends", err)
	}
	if _, err := New(Settings{}).Choose("a"); !errors.Is(err, ErrNoBackends) {
		t.Errorf("Choose before Update = %v, want ErrNoBackends", err)
	}
	// An error from Pick counts nothing.
	p.Update(&fleetwatch.Snapshot{V: 1, Pool: "p", Epoch: "e1", Seq: 2, At: fleetwatch.At(t0), TTLMs: 5000,
		AllOpen: fleetwatch.AllOpenShed, Backends: []fleetwatch.Backend{{Backend: "a", State: fleetwatch.StateOpen}}})
	if _, err := p.Pick(seeded(1), Request{}); !errors.Is(err, ErrShed) || p.InFlight("a") != 0 {
		t.Errorf("shed pick: %v, in flight %d", err, p.InFlight("a"))
	}
}
