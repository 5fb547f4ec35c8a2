package analyzer

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"pgregory.net/rapid"
)

// TestPropertyInvariants: for any sequence of events, drift changes and
// evaluations, weights stay in [0, 1], open backends have weight 0 and an
// open_until, seq strictly increases per pool, and at most
// max(1, floor(max_open_fraction x n)) backends of a pool are open, n the
// largest size the pool had (the cap is enforced when a backend opens; a
// pool that shrinks by expiry does not close open backends early).
func TestPropertyInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fraction := rapid.SampledFrom([]float64{0, 0.2, 0.5, 1}).Draw(t, "max_open_fraction")
		cfg := Config{
			Settings: Settings{
				MinRequests:         rapid.IntRange(1, 30).Draw(t, "min_requests"),
				ConsecutiveFailures: rapid.IntRange(1, 6).Draw(t, "consecutive_failures"),
				HalfOpenSuccesses:   rapid.IntRange(1, 6).Draw(t, "half_open_successes"),
				OpenBase:            time.Duration(rapid.IntRange(1, 10).Draw(t, "open_base_s")) * time.Second,
				MaxOpenFraction:     fraction,
			},
			Quarantine: rapid.Bool().Draw(t, "quarantine"),
			Seed:       rapid.Uint64().Draw(t, "seed"),
		}
		if cfg.Settings.OpenBase > DefaultOpenMax {
			cfg.Settings.OpenMax = cfg.Settings.OpenBase
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if fraction == 0 {
			fraction = DefaultMaxOpenFraction
		}
		pools := []string{"p", "q"}
		nBackends := rapid.IntRange(1, 8).Draw(t, "backends")
		now := t0
		lastSeq := map[string]uint64{}
		largest := map[string]int{}
		outcomes := []fleetwatch.Outcome{ok, ok, ok, fail, timeout, throttled, canceled, clientErr, stalled}
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for step := range steps {
			switch rapid.IntRange(0, 9).Draw(t, "action") {
			case 0:
				a.SetDrift(rapid.SampledFrom(pools).Draw(t, "drift_pool"),
					fmt.Sprint("b", rapid.IntRange(0, nBackends-1).Draw(t, "drift_backend")),
					rapid.SampledFrom([]fleetwatch.DriftStatus{fleetwatch.DriftOK, fleetwatch.DriftSuspect, fleetwatch.DriftDrifted}).Draw(t, "status"))
			case 1, 2:
				now = now.Add(time.Duration(rapid.IntRange(0, 40_000).Draw(t, "advance_ms")) * time.Millisecond)
			default:
				n := rapid.IntRange(1, 40).Draw(t, "batch")
				batch := make([]fleetwatch.Event, n)
				for i := range batch {
					batch[i] = event(rapid.SampledFrom(pools).Draw(t, "pool"),
						fmt.Sprint("b", rapid.IntRange(0, nBackends-1).Draw(t, "backend")),
						rapid.SampledFrom(outcomes).Draw(t, "outcome"),
						now.Add(time.Duration(rapid.IntRange(-3000, 3000).Draw(t, "skew_ms"))*time.Millisecond),
						rapid.Float64Range(0, 20_000).Draw(t, "ttft"))
					batch[i].Cold = rapid.IntRange(0, 9).Draw(t, "cold") == 0
					batch[i].RetryAfterMs = float64(rapid.IntRange(0, 60_000).Draw(t, "retry_after"))
				}
				a.Observe(batch)
			}
			ev := a.Evaluate(now)
			for _, snap := range ev.Snapshots {
				if snap.Seq <= lastSeq[snap.Pool] {
					t.Fatalf("step %d: pool %s seq %d after %d", step, snap.Pool, snap.Seq, lastSeq[snap.Pool])
				}
				lastSeq[snap.Pool] = snap.Seq
				largest[snap.Pool] = max(largest[snap.Pool], len(snap.Backends))
				checkSnapshot(t, snap, fraction, largest[snap.Pool])
			}
			for _, snap := range a.Snapshots(now) {
				checkSnapshot(t, snap, fraction, largest[snap.Pool])
			}
		}
	})
}

func checkSnapshot(t *rapid.T, snap fleetwatch.Snapshot, fraction float64, poolSize int) {
	open := 0
	for i, d := range snap.Backends {
		if i > 0 && snap.Backends[i-1].Backend >= d.Backend {
			t.Fatalf("pool %s: backends not sorted", snap.Pool)
		}
		if !(d.Weight >= 0 && d.Weight <= 1) {
			t.Fatalf("pool %s backend %s: weight %v", snap.Pool, d.Backend, d.Weight)
		}
		if d.State == fleetwatch.StateOpen {
			open++
			if d.Weight != 0 || d.OpenUntil == nil {
				t.Fatalf("pool %s backend %s: open with weight %v open_until %v", snap.Pool, d.Backend, d.Weight, d.OpenUntil)
			}
		} else if d.OpenUntil != nil {
			t.Fatalf("pool %s backend %s: %s with open_until", snap.Pool, d.Backend, d.State)
		}
		for name, r := range map[string]*float64{"success_rate": d.SuccessRate, "rate_429": d.Rate429} {
			if r != nil && !(*r >= 0 && *r <= 1) {
				t.Fatalf("pool %s backend %s: %s %v", snap.Pool, d.Backend, name, *r)
			}
		}
	}
	if limit := max(1, int(math.Floor(fraction*float64(poolSize)+1e-9))); open > limit {
		t.Fatalf("pool %s: %d of %d open, cap %d", snap.Pool, open, poolSize, limit)
	}
}
