package p2c

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fleetwatch/fleetwatch"
)

func TestTierShares(t *testing.T) {
	tests := []struct {
		name   string
		totals []float64
		want   []float64
	}{
		{"healthy primary takes everything", []float64{1, 2}, []float64{1, 0}},
		{"two full backends in the primary", []float64{2, 1}, []float64{1, 0}},
		{"half-open primary: a trickle, the rest to the next tier", []float64{0.05, 1}, []float64{0.05, 0.95}},
		{"quarantined primary: nothing", []float64{0, 1}, []float64{0, 1}},
		{"two trickle tiers, then a full one", []float64{0.5, 0.5, 3}, []float64{0.5, 0.25, 0.25}},
		{"every tier below 1: normalised", []float64{0.05}, []float64{1}},
		{"a trickle and a throttled tier, normalised", []float64{0.2, 0.5}, []float64{0.2 / 0.6, 0.4 / 0.6}},
		{"every tier at 0", []float64{0, 0}, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]float64, len(tt.totals))
			tierShares(tt.totals, got)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("shares (-want +got):\n%s", diff)
			}
		})
	}
}

// In failover mode a tier is judged by its weights: a half-open primary
// gets its trickle and the next tier the rest, a quarantined primary
// (closed, weight 0) gets nothing.
func TestFailoverByWeight(t *testing.T) {
	prio := func(b fleetwatch.Backend, p int) fleetwatch.Backend { b.Priority = p; return b }
	halfOpen := func(b fleetwatch.Backend) fleetwatch.Backend {
		b.State, b.Weight = fleetwatch.StateHalfOpen, 0.05
		return b
	}
	quarantined := func(b fleetwatch.Backend) fleetwatch.Backend {
		b.Weight, b.Drift = 0, fleetwatch.DriftDrifted
		return b
	}
	throttled := func(b fleetwatch.Backend, w float64) fleetwatch.Backend { b.Weight = w; return b }
	a, b, c := prio(backend("a", 100), 0), prio(backend("b", 100), 1), prio(backend("c", 100), 1)
	const n = 40000
	tests := []struct {
		name     string
		backends []fleetwatch.Backend
		want     map[string]float64 // expected share of picks
	}{
		{"half-open primary", []fleetwatch.Backend{halfOpen(a), b, c}, map[string]float64{"a": 0.05, "b": 0.475, "c": 0.475}},
		{"quarantined primary", []fleetwatch.Backend{quarantined(a), b, c}, map[string]float64{"b": 0.5, "c": 0.5}},
		{"throttled primary at 0.6", []fleetwatch.Backend{throttled(a, 0.6), b, c}, map[string]float64{"a": 0.6, "b": 0.2, "c": 0.2}},
		{"only a half-open backend anywhere", []fleetwatch.Backend{halfOpen(a)}, map[string]float64{"a": 1}},
		{"every backend quarantined: the lowest tier, equally", []fleetwatch.Backend{quarantined(a), quarantined(b)}, map[string]float64{"a": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPicker(&clock{now: t0}, Settings{})
			snap := pool(1, tt.backends...)
			snap.Mode = fleetwatch.ModeFailover
			p.Update(snap)
			got := counts(p, seeded(11), Request{}, n)
			for id, cnt := range got {
				if _, ok := tt.want[id]; !ok {
					t.Errorf("%s got %d picks, want none (counts %v)", id, cnt, got)
				}
			}
			for id, share := range tt.want {
				// A wide band: the sampling is random (fixed seed), the
				// rule is what is tested.
				if f := float64(got[id]) / n; f < share*0.8 || f > share*1.2 {
					t.Errorf("%s got a share of %.4f, want %.3f +-20%% (counts %v)", id, f, share, got)
				}
			}
		})
	}
}

// A retry excluding the trickle tier's only backend goes to the next tier
// rather than back to the backend that just failed.
func TestFailoverTrickleRetry(t *testing.T) {
	a, b := backend("a", 100), backend("b", 100)
	a.State, a.Weight = fleetwatch.StateHalfOpen, 0.05
	b.Priority = 1
	snap := pool(1, a, b)
	snap.Mode = fleetwatch.ModeFailover
	p := newPicker(&clock{now: t0}, Settings{RetryRatio: -1})
	p.Update(snap)
	// The first draw lands in a's tier (share 0.05).
	got, err := pickDone(p, &scripted{vals: []uint64{at(0.01), at(0.5)}}, Request{Exclude: "a"})
	if err != nil || got.Backend != "b" {
		t.Errorf("retry excluding a = %q, %v; want b", got.Backend, err)
	}
}

// Affinity in a split failover pool holds within the tier with the largest
// share: with a half-open primary, prefixed requests stick to backends of
// the second tier, and the primary still gets its trickle.
func TestFailoverTrickleAffinity(t *testing.T) {
	a, b, c := backend("a", 100), backend("b", 100), backend("c", 100)
	a.State, a.Weight = fleetwatch.StateHalfOpen, 0.05
	b.Priority, c.Priority = 1, 1
	snap := pool(1, a, b, c)
	snap.Mode = fleetwatch.ModeFailover
	p := newPicker(&clock{now: t0}, Settings{})
	p.Update(snap)
	const n = 20000
	r := seeded(12)
	got, sticky := map[string]int{}, 0
	for range n {
		ch, err := pickDone(p, r, Request{Prefix: 77, HasPrefix: true})
		if err != nil {
			t.Fatal(err)
		}
		got[ch.Backend]++
		if ch.Sticky {
			sticky++
			if ch.Backend == "a" {
				t.Fatalf("the half-open primary was chosen as sticky")
			}
		}
	}
	if f := float64(got["a"]) / n; f < 0.04 || f > 0.06 {
		t.Errorf("the primary's share %.4f, want its trickle 0.05 (counts %v)", f, got)
	}
	if sticky < n*9/10 || (got["b"] > 0 && got["c"] > 0 && min(got["b"], got["c"]) > n/20) {
		t.Errorf("%d of %d picks sticky, counts %v: want the prefix to stay on one backend of the second tier", sticky, n, got)
	}
}

func TestFailoverAllOpenSheds(t *testing.T) {
	a, b := backend("a", 100), backend("b", 100)
	b.Priority = 1
	for _, x := range []*fleetwatch.Backend{&a, &b} {
		x.State, x.Weight, x.OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(t0.Add(time.Minute)))
	}
	snap := pool(1, a, b)
	snap.Mode = fleetwatch.ModeFailover
	p := newPicker(&clock{now: t0}, Settings{})
	p.Update(snap)
	if _, err := pickDone(p, seeded(1), Request{Prefix: 1, HasPrefix: true}); !errors.Is(err, ErrShed) {
		t.Errorf("err = %v, want ErrShed", err)
	}
}
