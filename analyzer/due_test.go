package analyzer

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// dueTick is serve's tick with the default beats: a tenth of the load beat.
const dueTick = DefaultLoadBeat / 10

// TestEvaluateDuePhases: ticked every tenth of the load beat, EvaluateDue
// gives every pool exactly its beats (one snapshot and three load beats a
// second), each pool on its own phase, so a tick carries a few pools, not
// all of them.
func TestEvaluateDuePhases(t *testing.T) {
	const pools = 40
	var cfg Config
	for i := range pools {
		cfg.Pools = append(cfg.Pools, PoolConfig{ID: fmt.Sprintf("pool-%03d", i), Backends: []BackendConfig{{ID: "a"}}})
	}
	a := newAnalyzer(t, cfg)
	published := map[string]int{}
	most := 0
	for d := time.Duration(0); d < 3*time.Second; d += dueTick {
		ev := a.EvaluateDue(at(d))
		if d < time.Second {
			continue
		}
		most = max(most, len(ev.Snapshots)+len(ev.Loads))
		for _, s := range ev.Snapshots {
			published[s.Pool] += 4 // a snapshot counts as four: one per second
		}
		for _, s := range ev.Loads {
			published[s.Pool]++
		}
	}
	for _, pc := range cfg.Pools {
		if got := published[pc.ID]; got != 2*(4+3) {
			t.Errorf("%s: %d (snapshots x 4 + load beats) over 2 s, want 14: one snapshot and three load beats a second", pc.ID, got)
		}
	}
	if most > pools/4 {
		t.Errorf("a tick carried %d of %d pools, want them spread over the beat (at most a quarter)", most, pools)
	}
}

// TestEvaluateDueLeavesPoolsAlone: a pool that is not due is not
// evaluated, so an event that would open a breaker waits for the pool's
// turn (or for the caller's Evaluate of every pool, which serve runs on
// such an event); what time alone decides (open_until passing) still comes
// within a rule tick, with load beats and without.
func TestEvaluateDueLeavesPoolsAlone(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(healthy(200, "a", "b", "c", "x"))
	due := func(d time.Duration) bool {
		ev := a.EvaluateDue(at(d))
		return len(ev.Snapshots)+len(ev.Loads) > 0
	}
	d := 10 * time.Second
	for ; d < 11*time.Second; d += dueTick { // the pool's first beats
		due(d)
	}
	for !due(d) {
		d += dueTick
	}
	d += dueTick // the tick after a beat on the grid: not due
	a.Observe(series("p", "x", fail, 20, at(d-time.Second), time.Second, 0))
	if ev := a.EvaluateDue(at(d)); len(ev.Snapshots)+len(ev.Loads)+len(ev.Transitions) != 0 {
		t.Fatalf("a pool between its beats was evaluated: %d snapshots, %d load beats, %d transitions", len(ev.Snapshots), len(ev.Loads), len(ev.Transitions))
	}
	if b := backendOf(t, a, "p", "x", at(d)); b.State != fleetwatch.StateClosed {
		t.Fatalf("x is %s before the pool's turn, want closed", b.State)
	}
	if ev := a.Evaluate(at(d)); len(transitionsOf(ev, "x")) != 1 || len(ev.Snapshots) != 1 {
		t.Fatalf("Evaluate of every pool: %d transitions of x and %d snapshots, want x opened and the pool published", len(transitionsOf(ev, "x")), len(ev.Snapshots))
	}

	for _, loadBeat := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("load beat %v", loadBeat), func(t *testing.T) {
			// Several backends opened at different times, so that an open
			// time ending by chance just before a heartbeat cannot pass
			// for a rule tick.
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{LoadBeat: loadBeat, OpenBase: 5 * time.Second})})
			backends := []string{"w", "x", "y", "z"}
			a.Observe(healthy(200, append([]string{"a", "b", "c", "d", "e", "f"}, backends...)...)) // four of ten may open
			until := map[string]time.Time{}
			opened := 0
			for d := 10 * time.Second; d < 30*time.Second; d += dueTick {
				now := at(d)
				if i := int((d - 10*time.Second) / (1300 * time.Millisecond)); i < len(backends) && d-10*time.Second == time.Duration(i)*1300*time.Millisecond {
					a.Observe(series("p", backends[i], fail, 20, now.Add(-time.Second), time.Second, 0))
					a.Evaluate(now) // the urgent evaluation of every pool
					b := backendOf(t, a, "p", backends[i], now)
					if b.State != fleetwatch.StateOpen || b.OpenUntil == nil {
						t.Fatalf("%s is %s, want open", backends[i], b.State)
					}
					until[backends[i]] = b.OpenUntil.Time
					opened++
				}
				for _, tr := range a.EvaluateDue(now).Transitions {
					if tr.To != fleetwatch.StateHalfOpen {
						continue
					}
					if late := now.Sub(until[tr.Backend]); late < 0 || late > RuleTick+dueTick {
						t.Errorf("%s half-open %v after its open time ended, want within a rule tick (%v)", tr.Backend, late, RuleTick)
					}
					delete(until, tr.Backend)
				}
			}
			if opened != len(backends) || len(until) != 0 {
				t.Errorf("%d of %d opened; never half-open: %v", opened, len(backends), until)
			}
		})
	}
}
