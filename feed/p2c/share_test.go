package p2c

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"pgregory.net/rapid"
)

// TestSharedCandidatesMatchAFullBuild: a picker updated through a run of
// snapshots, which shares a snapshot's candidate tables with the one
// before when its backends' candidates did not change (sameCandidates),
// holds after each snapshot what a picker given only that snapshot
// builds: the same candidates, weights, tiers, stale order, affinity
// owners and locals, through changes of state, weight, priority, mode and
// membership.
func TestSharedCandidatesMatchAFullBuild(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "backends")
		bs := make([]fleetwatch.Backend, n)
		for i := range bs {
			bs[i] = backend(fmt.Sprintf("b%02d", i), 100)
		}
		mode := fleetwatch.ModeBalance
		openUntil := func() *fleetwatch.Time {
			return new(fleetwatch.At(t0.Add(time.Duration(rapid.IntRange(1, 60).Draw(t, "open s")) * time.Second)))
		}
		p := New(Settings{})
		for seq := uint64(1); seq <= 8; seq++ {
			// Most steps move only what is not a candidate's: loads,
			// EWMAs, the routers counted; some move one backend's, the
			// pool's mode or its membership (the last backend leaves or
			// comes back).
			if rapid.Bool().Draw(t, "move a candidate") {
				b := &bs[rapid.IntRange(0, len(bs)-1).Draw(t, "which")]
				switch rapid.IntRange(0, 5).Draw(t, "what") {
				case 0:
					b.State = rapid.SampledFrom([]fleetwatch.State{fleetwatch.StateClosed, fleetwatch.StateOpen,
						fleetwatch.StateHalfOpen}).Draw(t, "state")
					b.OpenUntil = nil
					if b.State == fleetwatch.StateOpen {
						b.OpenUntil = openUntil()
					}
				case 1:
					b.Weight = rapid.SampledFrom([]float64{0, 0.25, 0.5, 1}).Draw(t, "weight")
				case 2:
					b.Priority = rapid.IntRange(0, 2).Draw(t, "priority")
				case 3:
					mode = rapid.SampledFrom([]fleetwatch.Mode{fleetwatch.ModeBalance, fleetwatch.ModeFailover}).Draw(t, "mode")
				case 4:
					if b.State == fleetwatch.StateOpen {
						b.OpenUntil = openUntil()
					}
				case 5:
					if len(bs) == n && n > 1 {
						bs = bs[:n-1]
					} else {
						bs = bs[:n]
					}
				}
			}
			for i := range bs {
				bs[i].Load = &fleetwatch.Load{Running: float64(rapid.IntRange(0, 8).Draw(t, "running")), Source: fleetwatch.LoadSourceMetrics}
			}
			snap := pool(seq, slices.Clone(bs)...)
			snap.Mode = mode
			snap.Routers = rapid.IntRange(1, 40).Draw(t, "routers")
			p.Update(snap)
			got := p.state.Load()
			alone := New(Settings{})
			alone.Update(snap)
			want := alone.state.Load()
			if msg := sameTables(got, want); msg != "" {
				t.Fatalf("seq %d: the picker updated through the run differs from one built from the snapshot alone: %s", seq, msg)
			}
			if len(got.locals) != len(bs) {
				t.Fatalf("seq %d: %d locals for %d backends (none in flight)", seq, len(got.locals), len(bs))
			}
			for i := range got.entries {
				if got.locals[got.entries[i].id] != got.entries[i].local {
					t.Fatalf("seq %d: entry %d's local is not the one the picker keeps for it", seq, i)
				}
			}
		}
	})
}

// TestSharedCandidatesAreShared: a snapshot that moves only loads and the
// routers counted keeps the tables of the one before (no rebuild); one
// that moves a weight keeps only the stale order, and one that opens a
// backend none.
func TestSharedCandidatesAreShared(t *testing.T) {
	p := New(Settings{})
	s1 := pool(1, backend("a", 100), backend("b", 200), backend("c", 300))
	s1.Routers = 4
	p.Update(s1)
	first := p.state.Load()
	s2 := pool(2, backend("a", 120), backend("b", 180), backend("c", 300))
	s2.Routers = 5
	s2.Backends[1].Load = &fleetwatch.Load{Running: 3, Source: fleetwatch.LoadSourceMetrics}
	p.Update(s2)
	second := p.state.Load()
	if &second.fresh.cum[0] != &first.fresh.cum[0] || &second.stalePos[0] != &first.stalePos[0] || second.affinity != first.affinity {
		t.Errorf("a snapshot with the same candidates rebuilt the candidate tables")
	}
	if second.routers != 5 || second.header.Seq != 2 {
		t.Errorf("the new snapshot's own fields were not taken: routers %v, seq %d", second.routers, second.header.Seq)
	}
	s3 := pool(3, backend("a", 120), backend("b", 180), backend("c", 300))
	s3.Backends[2].Weight = 0.5
	p.Update(s3)
	third := p.state.Load()
	if &third.fresh.cum[0] == &second.fresh.cum[0] {
		t.Errorf("a snapshot with another weight shares the candidate table of the one before")
	}
	if &third.stalePos[0] != &second.stalePos[0] {
		t.Errorf("a snapshot that moved only a weight rebuilt the stale order")
	}
	s4 := pool(4, backend("a", 120), backend("b", 180), backend("c", 300))
	s4.Backends[2].Weight = 0.5
	s4.Backends[0].State, s4.Backends[0].OpenUntil = fleetwatch.StateOpen, new(fleetwatch.At(t0.Add(time.Minute)))
	p.Update(s4)
	if fourth := p.state.Load(); &fourth.stalePos[0] == &third.stalePos[0] || fourth.staleNotOpen != 2 {
		t.Errorf("a snapshot that opened a backend kept the stale order of the one before (%d not open)", fourth.staleNotOpen)
	}
	if w := third.fresh.weight(2); w != 0.5 {
		t.Errorf("backend c's weight in the candidate table: %v, want 0.5", w)
	}
}

// sameTables compares what buildFresh, buildStale and the affinity table
// make of two states of the same snapshot; "" when they agree.
func sameTables(a, b *state) string {
	switch {
	case a.allOpen != b.allOpen:
		return fmt.Sprintf("allOpen %v, %v", a.allOpen, b.allOpen)
	case !sameTable(&a.fresh, &b.fresh):
		return fmt.Sprintf("fresh %v, %v", a.fresh.cum, b.fresh.cum)
	case !sameTable(&a.spread, &b.spread):
		return "spread"
	case len(a.tiers) != len(b.tiers) || a.affinityTier != b.affinityTier:
		return fmt.Sprintf("%d tiers (affinity %d), %d (%d)", len(a.tiers), a.affinityTier, len(b.tiers), b.affinityTier)
	case !slices.Equal(a.sticky, b.sticky) || !slices.Equal(a.stickyHash, b.stickyHash):
		return fmt.Sprintf("sticky %v, %v", a.sticky, b.sticky)
	case !slices.Equal(a.staleOrder, b.staleOrder) || a.staleNotOpen != b.staleNotOpen ||
		!slices.Equal(a.staleOpenUntil, b.staleOpenUntil) || !slices.Equal(a.stalePos, b.stalePos):
		return fmt.Sprintf("stale order %v (%d not open), %v (%d)", a.staleOrder, a.staleNotOpen, b.staleOrder, b.staleNotOpen)
	case len(a.byID) != len(b.byID):
		return "byID"
	}
	for i := range a.tiers {
		if a.tiers[i].upTo != b.tiers[i].upTo || !sameTable(&a.tiers[i].tbl, &b.tiers[i].tbl) {
			return fmt.Sprintf("tier %d", i)
		}
	}
	for id, i := range b.byID {
		if a.byID[id] != i {
			return fmt.Sprintf("byID[%s] %d, %d", id, a.byID[id], i)
		}
	}
	for key := range uint64(512) {
		k := mix64(key + 1)
		if x, y := a.affinity.lookup(k), b.affinity.lookup(k); x != y {
			return fmt.Sprintf("prefix %x: sticky entry %d, %d", k, x, y)
		}
	}
	return ""
}

func sameTable(a, b *table) bool {
	return slices.Equal(a.cum, b.cum) && a.positive == b.positive && a.maxWeight == b.maxWeight &&
		slices.Equal(a.prob, b.prob) && slices.Equal(a.alias, b.alias)
}
