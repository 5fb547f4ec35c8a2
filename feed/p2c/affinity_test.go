package p2c

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

func stickyFor(t *testing.T, p *Picker, key uint64) Choice {
	t.Helper()
	c, err := pickDone(p, seeded(key), Request{Prefix: key, HasPrefix: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAffinitySticks(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, ids(6)...))
	for key := uint64(1); key <= 50; key++ {
		first := stickyFor(t, p, key)
		if !first.Sticky {
			t.Fatalf("key %d: not sticky: %+v", key, first)
		}
		for range 5 {
			if got := stickyFor(t, p, key); got != first {
				t.Fatalf("key %d moved from %+v to %+v", key, first, got)
			}
		}
	}
}

// The sticky backend is abandoned when its breaker opens or its EWMA
// reaches the tolerance times the pool median, and only then.
func TestAffinityMoves(t *testing.T) {
	const key = 12345
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	bs := ids(5)
	p.Update(pool(1, bs...))
	home := stickyFor(t, p, key)

	tests := []struct {
		name       string
		change     func(b *fleetwatch.Backend)
		wantSticky bool
		wantHome   bool
	}{
		{"somewhat slower stays", func(b *fleetwatch.Backend) { b.EWMATTFTMs = new(float64(2.4 * 200)) }, true, true},
		{"beyond tolerance leaves", func(b *fleetwatch.Backend) { b.EWMATTFTMs = new(float64(2.6 * 200)) }, false, false},
		{"open leaves for another sticky backend", func(b *fleetwatch.Backend) {
			b.State, b.Weight, b.OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
		}, true, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changed := append([]fleetwatch.Backend(nil), bs...)
			tt.change(&changed[home.Index])
			p.Update(pool(uint64(i+2), changed...))
			// The median is computed over all backends, so 200 stays it.
			for range 200 {
				got := stickyFor(t, p, key)
				// Without affinity the request goes through two choices,
				// which may still pick home; only a sticky pick is checked.
				if got.Sticky != tt.wantSticky || (got.Sticky && (got.Backend == home.Backend) != tt.wantHome) {
					t.Fatalf("got %+v (home %s); want sticky=%v home=%v", got, home.Backend, tt.wantSticky, tt.wantHome)
				}
			}
		})
	}
}

// Rendezvous hashing: removing one backend moves only the keys it held, and
// those spread over the others.
func TestAffinityRemovalMovesOnlyItsKeys(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	bs := ids(10)
	p.Update(pool(1, bs...))
	const keys = 5000
	before := make([]string, keys)
	perBackend := map[string]int{}
	for k := range keys {
		before[k] = stickyFor(t, p, uint64(k)*0x9e3779b97f4a7c15).Backend
		perBackend[before[k]]++
	}
	for _, b := range bs {
		if n := perBackend[b.Backend]; n < keys/10/2 || n > keys/10*2 {
			t.Errorf("%s holds %d of %d keys; rendezvous should spread them evenly", b.Backend, n, keys)
		}
	}
	removed := bs[4].Backend
	p.Update(pool(2, append(append([]fleetwatch.Backend(nil), bs[:4]...), bs[5:]...)...))
	moved, receivers := 0, map[string]bool{}
	for k := range keys {
		after := stickyFor(t, p, uint64(k)*0x9e3779b97f4a7c15).Backend
		switch {
		case before[k] == removed:
			moved++
			receivers[after] = true
		case after != before[k]:
			t.Fatalf("key %d moved from %s to %s though %s was removed", k, before[k], after, removed)
		}
	}
	if moved != perBackend[removed] || len(receivers) < 5 {
		t.Errorf("%d keys moved to %d backends; want all %d of %s's keys spread out", moved, len(receivers), perBackend[removed], removed)
	}
}

// Half-open and weight-0 backends hold no keys: a trickle stays a trickle.
func TestAffinitySkipsHalfOpen(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	bs := ids(4)
	bs[1].State, bs[1].Weight = fleetwatch.StateHalfOpen, 0.05
	bs[2].Weight = 0
	p.Update(pool(1, bs...))
	for k := range uint64(2000) {
		got := stickyFor(t, p, k)
		if got.Sticky && (got.Backend == bs[1].Backend || got.Backend == bs[2].Backend) {
			t.Fatalf("key %d stuck to %s", k, got.Backend)
		}
	}
}

func TestAffinityTolerance(t *testing.T) {
	tests := []struct {
		settings, snapshot float64
		ewma               float64
		wantSticky         bool
	}{
		{0, 0, 2.4 * 200, true}, // both unset: the default 2.5
		{0, 0, 2.6 * 200, false},
		{0, 4, 3.9 * 200, true}, // the snapshot's value
		{1.5, 4, 1.6 * 200, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("settings %v snapshot %v ewma %v", tt.settings, tt.snapshot, tt.ewma), func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{AffinityTolerance: tt.settings})
			bs := ids(5)
			snap := pool(1, bs...)
			snap.AffinityTolerance = tt.snapshot
			p.Update(snap)
			home := stickyFor(t, p, 7)
			bs[home.Index].EWMATTFTMs = new(float64(tt.ewma))
			snap = pool(2, bs...)
			snap.AffinityTolerance = tt.snapshot
			p.Update(snap)
			if got := stickyFor(t, p, 7); got.Sticky != tt.wantSticky {
				t.Errorf("sticky = %v, want %v", got.Sticky, tt.wantSticky)
			}
		})
	}
}

// Bounded load: a queue piling onto the sticky backend spills the prefix to
// two choices before the EWMA rule can see it; with the bound disabled the
// key stays.
func TestAffinityBoundedLoad(t *testing.T) {
	tests := []struct {
		name       string
		factor     float64
		inFlight   int // on the sticky backend, nothing elsewhere
		wantSticky bool
	}{
		{"idle", 0, 0, true},
		{"one in flight of one: capacity ceil(1.5x2/4) = 1", 0, 1, false},
		{"bound disabled", -1, 10, true},
		{"generous factor: capacity ceil(8x4/4) = 8", 8, 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{AffinityLoadFactor: tt.factor})
			p.Update(pool(1, ids(4)...))
			home := stickyFor(t, p, 99)
			for range tt.inFlight {
				busy(t, p, home.Backend)
			}
			if got := stickyFor(t, p, 99); got.Sticky != tt.wantSticky {
				t.Errorf("sticky = %v, want %v (%+v)", got.Sticky, tt.wantSticky, got)
			}
		})
	}
}

// The table updated across membership changes holds what a table built from
// scratch for the final membership holds.
func TestAffinityIncrementalMatchesFull(t *testing.T) {
	all := ids(8)
	steps := [][]int{ // which of the 8 backends are present
		{0, 1, 2, 3, 4, 5, 6, 7},
		{0, 1, 2, 4, 5, 6, 7},
		{0, 1, 2, 4, 6, 7},
		{0, 1, 2, 3, 4, 6, 7},
		{1, 2, 3, 4, 5, 6},
	}
	pick := func(idx []int) []fleetwatch.Backend {
		var bs []fleetwatch.Backend
		for _, i := range idx {
			bs = append(bs, all[i])
		}
		return bs
	}
	c := &clock{now: t0}
	walked := newPicker(c, Settings{})
	for i, step := range steps {
		walked.Update(pool(uint64(i+1), pick(step)...))
	}
	direct := newPicker(c, Settings{})
	direct.Update(pool(1, pick(steps[len(steps)-1])...))
	for k := range uint64(3000) {
		key := mix64(k)
		if a, b := stickyFor(t, walked, key), stickyFor(t, direct, key); a != b {
			t.Fatalf("key %d: incremental table says %+v, a fresh one %+v", k, a, b)
		}
	}
}

// Two routers holding the same snapshot send a prefix to the same backend,
// whatever each saw before: one that followed a pool of 100 while 40 of
// its backends opened, and one that joined during the incident. (With a
// slot count that only grew with the candidates, the first kept 4,096
// slots and the second made 2,048: 983 of these 2,000 prefixes went
// elsewhere.)
func TestAffinityAgreesAcrossHistories(t *testing.T) {
	c := &clock{now: t0}
	all := ids(100)
	incident := append([]fleetwatch.Backend(nil), all...)
	for i := range 40 {
		incident[i].State, incident[i].Weight, incident[i].OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	}
	before := newPicker(c, Settings{})
	before.Update(pool(1, all...))
	before.Update(pool(2, incident...))
	joined := newPicker(c, Settings{})
	joined.Update(pool(2, incident...))
	differ := 0
	const keys = 2000
	for k := range uint64(keys) {
		key := mix64(k + 7)
		a, b := stickyFor(t, before, key), stickyFor(t, joined, key)
		if !a.Sticky || !b.Sticky {
			t.Fatalf("key %d: not sticky: %+v, %+v", k, a, b)
		}
		if a.Backend != b.Backend {
			differ++
		}
	}
	if differ != 0 {
		t.Errorf("%d of %d prefixes go to another backend from the router that joined during the incident", differ, keys)
	}
}

// The stale path computes the same sticky backend as the fresh table when
// the candidates are the same.
func TestAffinityStaleAgrees(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, ids(12)...))
	fresh := make([]string, 500)
	for k := range fresh {
		fresh[k] = stickyFor(t, p, uint64(k)).Backend
	}
	c.Advance(time.Minute)
	for k := range fresh {
		if got := stickyFor(t, p, uint64(k)); got.Backend != fresh[k] || !got.Sticky {
			t.Fatalf("key %d: stale %+v, fresh %s", k, got, fresh[k])
		}
	}
}

// A pool of 1,000 spreads keys over its backends within the slot table's
// granularity.
func TestAffinityLargePoolSpread(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, ids(1000)...))
	owners := map[string]int{}
	for k := range uint64(20000) {
		owners[stickyFor(t, p, mix64(k)).Backend]++
	}
	if len(owners) < 950 {
		t.Errorf("20,000 keys landed on %d of 1,000 backends", len(owners))
	}
}
