package analyzer

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// TestShadowInSnapshots: a pool configured in shadow mode publishes the
// mode in every snapshot, with the decisions computed as usual (a failing
// backend still opens); other pools, configured or not, publish none.
func TestShadowInSnapshots(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{}), Pools: []PoolConfig{
		{ID: "observed", Shadow: fleetwatch.ShadowObserve},
		{ID: "breakers", Shadow: fleetwatch.ShadowBreakers},
		{ID: "explicit-off", Shadow: "off"},
		{ID: "enforced"},
	}})
	var evs []fleetwatch.Event
	for _, p := range []string{"observed", "breakers", "explicit-off", "enforced", "from-events"} {
		evs = append(evs, series(p, "good", ok, 40, t0, 10*time.Second, 100)...)
		evs = append(evs, series(p, "bad", fail, 40, t0, 10*time.Second, 0)...)
	}
	a.Observe(evs)
	ev := a.Evaluate(at(10 * time.Second))
	want := map[string]fleetwatch.Shadow{
		"observed": fleetwatch.ShadowObserve, "breakers": fleetwatch.ShadowBreakers,
		"explicit-off": fleetwatch.ShadowOff, "enforced": fleetwatch.ShadowOff, "from-events": fleetwatch.ShadowOff,
	}
	if len(ev.Snapshots) != len(want) {
		t.Fatalf("%d snapshots, want %d", len(ev.Snapshots), len(want))
	}
	for _, s := range ev.Snapshots {
		if s.Shadow != want[s.Pool] {
			t.Errorf("pool %s: shadow = %q, want %q", s.Pool, s.Shadow, want[s.Pool])
		}
		if err := s.Validate(); err != nil {
			t.Errorf("pool %s: %v", s.Pool, err)
		}
		// The decisions are the analyzer's own in every mode.
		if b := s.Find("bad"); b == nil || b.State != fleetwatch.StateOpen {
			t.Errorf("pool %s: bad = %+v, want open", s.Pool, b)
		}
		if b := s.Find("good"); b == nil || b.State != fleetwatch.StateClosed || b.Weight != 1 {
			t.Errorf("pool %s: good = %+v, want closed at 1", s.Pool, b)
		}
	}
	// The heartbeat's snapshots and Snapshots carry it too.
	for _, s := range a.Snapshots(at(11 * time.Second)) {
		if s.Shadow != want[s.Pool] {
			t.Errorf("Snapshots: pool %s: shadow = %q, want %q", s.Pool, s.Shadow, want[s.Pool])
		}
	}
}

func TestShadowConfigRejected(t *testing.T) {
	_, err := New(Config{Pools: []PoolConfig{{ID: "p", Shadow: "dry-run"}}})
	var se *SettingError
	if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &se) || se.Key != "pools[0].shadow" {
		t.Fatalf("New = %v, want ErrInvalidConfig naming pools[0].shadow", err)
	}
}

// TestShadowInExplain: an explanation says the pool is in shadow mode.
func TestShadowInExplain(t *testing.T) {
	a := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "observed", Shadow: fleetwatch.ShadowObserve}, {ID: "enforced"}}})
	a.Observe(append(series("observed", "b", ok, 5, t0, time.Second, 100), series("enforced", "b", ok, 5, t0, time.Second, 100)...))
	now := at(2 * time.Second)
	a.Evaluate(now)
	for pool, want := range map[string]fleetwatch.Shadow{"observed": fleetwatch.ShadowObserve, "enforced": fleetwatch.ShadowOff} {
		e, found := a.Explain(pool, "b", now)
		if !found || e.Shadow != want {
			t.Errorf("Explain(%s, b): found %v, shadow %q, want %q", pool, found, e.Shadow, want)
		}
	}
}
