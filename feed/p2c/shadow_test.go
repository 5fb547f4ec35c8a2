package p2c

import (
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// shadowFleet is a pool with one backend in each situation shadow mode
// treats differently, each with the same EWMA so that only the decisions
// tell them apart:
//
//	ok       closed, weight 1
//	low      closed, weight 0.25 (a 429 rate, say)
//	zero     closed, weight 0 (quarantined for drift)
//	open     open
//	half     half-open, the 0.05 trickle
//	drained  closed, weight 0, drained by an operator
func shadowFleet(mode fleetwatch.Shadow) *fleetwatch.Snapshot {
	until := fleetwatch.At(t0.Add(time.Hour))
	bs := []fleetwatch.Backend{backend("drained", 200), backend("half", 200), backend("low", 200),
		backend("ok", 200), backend("open", 200), backend("zero", 200)}
	bs[0].Weight, bs[0].Override = 0, &fleetwatch.Override{Kind: fleetwatch.OverrideDrain, Reason: "maintenance", Who: "ops", Until: until}
	bs[1].State, bs[1].Weight = fleetwatch.StateHalfOpen, 0.05
	bs[2].Weight = 0.25
	bs[4].State, bs[4].Weight, bs[4].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(30*time.Second)))
	bs[5].Weight, bs[5].Drift = 0, fleetwatch.DriftDrifted
	s := pool(1, bs...)
	s.Shadow = mode
	return s
}

func TestShadowView(t *testing.T) {
	type decision struct {
		State  fleetwatch.State
		Weight float64
		Open   bool // open_until set
	}
	view := func(s *fleetwatch.Snapshot) map[string]decision {
		out := map[string]decision{}
		for _, b := range s.Backends {
			out[b.Backend] = decision{b.State, b.Weight, b.OpenUntil != nil}
		}
		return out
	}
	closed := func(w float64) decision { return decision{fleetwatch.StateClosed, w, false} }
	open := decision{fleetwatch.StateOpen, 0, true}
	half := decision{fleetwatch.StateHalfOpen, 0.05, false}
	tests := []struct {
		mode fleetwatch.Shadow
		want map[string]decision
	}{
		{fleetwatch.ShadowOff, map[string]decision{"drained": closed(0), "half": half, "low": closed(0.25), "ok": closed(1), "open": open, "zero": closed(0)}},
		{fleetwatch.ShadowBreakers, map[string]decision{"drained": closed(0), "half": half, "low": closed(1), "ok": closed(1), "open": open, "zero": closed(1)}},
		{fleetwatch.ShadowObserve, map[string]decision{"drained": closed(0), "half": closed(1), "low": closed(1), "ok": closed(1), "open": closed(1), "zero": closed(1)}},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode)+"-", func(t *testing.T) {
			in := shadowFleet(tt.mode)
			before := view(in)
			out := ShadowView(in)
			if diff := cmp.Diff(tt.want, view(out)); diff != "" {
				t.Errorf("ShadowView (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, view(in)); diff != "" {
				t.Errorf("ShadowView modified its argument (-before +after):\n%s", diff)
			}
			if err := out.Validate(); err != nil {
				t.Errorf("the view is not a valid snapshot: %v", err)
			}
		})
	}
	// The operator's other overrides are honoured; force_closed closes at weight 1.
	until := fleetwatch.At(t0.Add(time.Hour))
	bs := []fleetwatch.Backend{backend("fc", 200), backend("fo", 200), backend("w", 200)}
	bs[0].Weight, bs[0].Override = 0.3, &fleetwatch.Override{Kind: fleetwatch.OverrideForceClosed, Reason: "r", Until: until}
	bs[1].State, bs[1].Weight, bs[1].OpenUntil = fleetwatch.StateOpen, 0, &until
	bs[1].Override = &fleetwatch.Override{Kind: fleetwatch.OverrideForceOpen, Reason: "r", Until: until}
	bs[2].Weight, bs[2].Override = 0.2, &fleetwatch.Override{Kind: fleetwatch.OverrideWeight, Reason: "r", Until: until, Weight: new(float64(0.2))}
	for _, mode := range []fleetwatch.Shadow{fleetwatch.ShadowBreakers, fleetwatch.ShadowObserve} {
		s := pool(1, bs...)
		s.Shadow = mode
		want := map[string]decision{"fc": closed(1), "fo": open, "w": closed(0.2)}
		if diff := cmp.Diff(want, view(ShadowView(s))); diff != "" {
			t.Errorf("%s: overrides (-want +got):\n%s", mode, diff)
		}
	}
}

// TestShadowPicks is what each mode picks, and what it counts, over the
// fleet of shadowFleet.
func TestShadowPicks(t *testing.T) {
	const n = 20000
	type share struct{ lo, hi float64 } // of the n picks
	none := share{0, 0}
	tests := []struct {
		mode   fleetwatch.Shadow
		shares map[string]share
		// The counts, each as a share of n.
		differed, exclOpen, exclWeight share
	}{
		{
			// Off: the decisions. ok takes most, low a quarter of ok's
			// draws (less still: a down-weighted candidate joins the
			// comparison only with probability weight), half a trickle.
			mode:     fleetwatch.ShadowOff,
			shares:   map[string]share{"drained": none, "half": {0.001, 0.05}, "low": {0.05, 0.3}, "ok": {0.6, 0.95}, "open": none, "zero": none},
			differed: none, exclOpen: none, exclWeight: none,
		},
		{
			// Breakers: open gets nothing and half its trickle; low and
			// zero are weighted 1 like ok. The drain is honoured.
			mode:   fleetwatch.ShadowBreakers,
			shares: map[string]share{"drained": none, "half": {0.001, 0.05}, "low": {0.27, 0.40}, "ok": {0.27, 0.40}, "open": none, "zero": {0.27, 0.40}},
			// Every pick to zero is one the decisions exclude.
			differed: share{0.3, 0.8}, exclOpen: none, exclWeight: share{0.27, 0.40},
		},
		{
			// Observe: all five not drained, equally.
			mode:     fleetwatch.ShadowObserve,
			shares:   map[string]share{"drained": none, "half": {0.16, 0.24}, "low": {0.16, 0.24}, "ok": {0.16, 0.24}, "open": {0.16, 0.24}, "zero": {0.16, 0.24}},
			differed: share{0.5, 0.95}, exclOpen: share{0.16, 0.24}, exclWeight: share{0.16, 0.24},
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode)+"-", func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			p.Update(shadowFleet(tt.mode))
			got := counts(p, seeded(3), Request{}, n)
			for id, want := range tt.shares {
				if f := float64(got[id]) / n; f < want.lo || f > want.hi {
					t.Errorf("%s got %.3f of the picks, want [%v, %v] (all: %v)", id, f, want.lo, want.hi, got)
				}
			}
			st := p.ShadowStats()
			if st.Mode != tt.mode {
				t.Errorf("ShadowStats().Mode = %q, want %q", st.Mode, tt.mode)
			}
			wantPicks := uint64(0)
			if tt.mode.On() {
				wantPicks = n
			}
			if st.Picks != wantPicks {
				t.Errorf("Picks = %d, want %d", st.Picks, wantPicks)
			}
			for name, c := range map[string]struct {
				v    uint64
				want share
			}{"Differed": {st.Differed, tt.differed}, "ExcludedOpen": {st.ExcludedOpen, tt.exclOpen}, "ExcludedWeight": {st.ExcludedWeight, tt.exclWeight}} {
				if f := float64(c.v) / n; f < c.want.lo || f > c.want.hi {
					t.Errorf("%s = %d (%.3f of the picks), want [%v, %v]", name, c.v, f, c.want.lo, c.want.hi)
				}
			}
			// Exact ties between the counts and the picks.
			if st.ExcludedOpen != uint64(got["open"]) {
				t.Errorf("ExcludedOpen = %d, want the %d picks of open", st.ExcludedOpen, got["open"])
			}
			if st.ExcludedWeight != uint64(got["zero"]) {
				t.Errorf("ExcludedWeight = %d, want the %d picks of zero", st.ExcludedWeight, got["zero"])
			}
			if st.Differed < st.Excluded() || st.ExcludedShed != 0 {
				t.Errorf("Differed %d < Excluded %d, or shed %d", st.Differed, st.Excluded(), st.ExcludedShed)
			}
		})
	}
}

// TestShadowAgreesWithItself: when the mode's view and the full decisions
// are the same, no pick is counted as different, whatever the requests and
// the load, because both picks draw the same bits.
func TestShadowAgreesWithItself(t *testing.T) {
	for _, mode := range []fleetwatch.Shadow{fleetwatch.ShadowBreakers, fleetwatch.ShadowObserve} {
		for _, failover := range []bool{false, true} {
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			bs := ids(40)
			for i := range bs {
				bs[i].EWMATTFTMs = new(float64(100 + float64(i%7)*40))
				bs[i].Priority = i % 3
			}
			snap := pool(1, bs...)
			snap.Shadow = mode
			if failover {
				snap.Mode = fleetwatch.ModeFailover
			}
			p.Update(snap)
			r := seeded(9)
			var held []Choice
			for i := range 3000 {
				req := Request{}
				switch i % 3 {
				case 1:
					req.Prefix, req.HasPrefix = uint64(i%50), true
				case 2:
					req.Exclude = bs[i%len(bs)].Backend
				}
				ch, err := p.Pick(r, req)
				if err != nil {
					if err == ErrRetryBudget {
						continue
					}
					t.Fatal(err)
				}
				if i%4 == 0 {
					held = append(held, ch) // load builds up
				} else {
					ch.Done(fleetwatch.OutcomeOK, 150, false)
				}
			}
			st := p.ShadowStats()
			if st.Picks == 0 || st.Differed != 0 || st.Excluded() != 0 {
				t.Errorf("%s failover=%v: %+v, want picks and no difference", mode, failover, st)
			}
			for i := range held {
				held[i].Done(fleetwatch.OutcomeOK, 150, false)
			}
		}
	}
}

// TestShadowAllOpen: every backend open. Breakers sheds as the decisions
// do; observe routes, and every pick is one the decisions would have
// failed fast.
func TestShadowAllOpen(t *testing.T) {
	for _, mode := range []fleetwatch.Shadow{fleetwatch.ShadowBreakers, fleetwatch.ShadowObserve} {
		bs := []fleetwatch.Backend{backend("a", 100), backend("b", 100)}
		for i := range bs {
			bs[i].State, bs[i].Weight, bs[i].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
		}
		snap := pool(1, bs...)
		snap.Shadow = mode
		c := &clock{now: t0}
		p := newPicker(c, Settings{})
		p.Update(snap)
		got := counts(p, seeded(1), Request{}, 100)
		st := p.ShadowStats()
		switch mode {
		case fleetwatch.ShadowBreakers:
			if got["error: "+ErrShed.Error()] != 100 || st.Picks != 0 {
				t.Errorf("breakers: %v %+v, want every request shed and no shadow pick", got, st)
			}
		case fleetwatch.ShadowObserve:
			if got["a"]+got["b"] != 100 || st.ExcludedShed != 100 || st.Differed != 100 {
				t.Errorf("observe: %v %+v, want 100 picks, each counted as shed and different", got, st)
			}
		}
	}
}

// TestShadowStale: a stale snapshot in shadow mode keeps its mode (observe
// routes to the open backend, whose open_until the stale path would
// otherwise honour) but counts no exclusion: the decision is no longer in
// force. (The stale path ignores weights in every mode.)
func TestShadowStale(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(shadowFleet(fleetwatch.ShadowObserve))
	c.Advance(10 * time.Second) // ttl 5s: stale; open's open_until (30s) not past
	got := counts(p, seeded(5), Request{}, 2000)
	st := p.ShadowStats()
	if got["open"] == 0 {
		t.Errorf("stale observe picks %v, want open among them", got)
	}
	if st.Picks != 2000 || st.Excluded() != 0 {
		t.Errorf("stale: %+v, want 2000 picks and no exclusion counted", st)
	}
	// The stale full decisions still hold open until its open_until.
	if st.Differed < uint64(got["open"]) {
		t.Errorf("Differed = %d, want at least the %d picks of open", st.Differed, got["open"])
	}
}

// TestShadowModeChanges: the mode follows the snapshot applied; back off,
// the counts stop and the decisions are followed again.
func TestShadowModeChanges(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(shadowFleet(fleetwatch.ShadowObserve))
	counts(p, seeded(1), Request{}, 500)
	before := p.ShadowStats()
	if before.Mode != fleetwatch.ShadowObserve || before.Picks != 500 {
		t.Fatalf("observe: %+v", before)
	}
	off := shadowFleet(fleetwatch.ShadowOff)
	off.Seq = 2
	p.Update(off)
	got := counts(p, seeded(1), Request{}, 500)
	after := p.ShadowStats()
	if after.Mode != fleetwatch.ShadowOff || after.Picks != before.Picks || after.Differed != before.Differed {
		t.Errorf("off again: %+v, want mode off and the counts of before (%+v)", after, before)
	}
	if got["open"] != 0 || got["zero"] != 0 {
		t.Errorf("off again: picks %v, want none on open or zero", got)
	}
}

// TestShadowPickAllocs: the shadow path allocates nothing but the replay
// source of its two picks, which a sync.Pool recycles, so without the race
// detector nothing at all. Under the race detector (which CI runs) the
// pool drops a quarter of what is put back, at random, and each drop costs
// one 8-byte source on a later pick: the test then allows half an
// allocation per pick on average, which a source allocated on every pick
// (or anything allocated per candidate) still exceeds. The count is exact
// (runtime.MemStats), not AllocsPerRun's integer average, which rounds
// the race detector's quarter down to 0.
func TestShadowPickAllocs(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	snap := pool(1, ids(100)...)
	snap.Shadow = fleetwatch.ShadowObserve
	p.Update(snap)
	r := seeded(1)
	limit := 0.0
	if raceEnabled {
		limit = 0.5
	}
	for _, req := range []Request{{}, {Prefix: 42, HasPrefix: true}, {Exclude: "b0003"}} {
		if a := mallocsPerRun(1000, func() {
			c, _ := p.Pick(r, req)
			c.Done(fleetwatch.OutcomeOK, 100, false)
		}); a > limit {
			t.Errorf("shadow Pick(%+v) allocates %.3f times per pick, want at most %v (race detector %v)", req, a, limit, raceEnabled)
		}
	}
}

// mallocsPerRun is testing.AllocsPerRun without its rounding down: the
// mean number of heap allocations of f over runs calls (after one warm-up
// call), at GOMAXPROCS 1.
func mallocsPerRun(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}
