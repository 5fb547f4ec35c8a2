package analyzer

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

func ov(kind fleetwatch.OverrideKind, until time.Time) fleetwatch.Override {
	return fleetwatch.Override{Kind: kind, Reason: "incident 42", Who: "alice", Until: fleetwatch.At(until)}
}

// overrideScenario is a pool with a healthy backend "a" and a failing one
// "b", evaluated at 10s: a closed with weight 1, b open.
func overrideScenario(t *testing.T) *Analyzer {
	t.Helper()
	a := newAnalyzer(t, Config{Epoch: "e", Settings: noJitter(Settings{})})
	evs := series("p", "a", ok, 40, t0, 10*time.Second, 100)
	evs = append(evs, series("p", "b", fail, 40, t0, 10*time.Second, 0)...)
	a.Observe(evs)
	a.Evaluate(at(10 * time.Second))
	if d := backendOf(t, a, "p", "b", at(10*time.Second)); d.State != fleetwatch.StateOpen {
		t.Fatalf("b is %s, want open", d.State)
	}
	if d := backendOf(t, a, "p", "a", at(10*time.Second)); d.State != fleetwatch.StateClosed || d.Weight != 1 {
		t.Fatalf("a is %s %v, want closed 1", d.State, d.Weight)
	}
	return a
}

func TestOverrideApplied(t *testing.T) {
	until := at(time.Minute)
	w := 0.3
	tests := []struct {
		name    string
		backend string
		o       fleetwatch.Override
		state   fleetwatch.State
		weight  float64
		open    bool // open_until is the override's until
	}{
		{"drain a closed backend", "a", ov(fleetwatch.OverrideDrain, until), fleetwatch.StateClosed, 0, false},
		{"force_open a closed backend", "a", ov(fleetwatch.OverrideForceOpen, until), fleetwatch.StateOpen, 0, true},
		{"force_closed an open backend", "b", ov(fleetwatch.OverrideForceClosed, until), fleetwatch.StateClosed, 1, false},
		{"force_closed a closed backend keeps its weight", "a", ov(fleetwatch.OverrideForceClosed, until), fleetwatch.StateClosed, 1, false},
		{"weight", "a", func() fleetwatch.Override {
			o := ov(fleetwatch.OverrideWeight, until)
			o.Weight = &w
			return o
		}(), fleetwatch.StateClosed, 0.3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := overrideScenario(t)
			a.SetOverrides([]BackendOverride{{Pool: "p", Backend: tt.backend, Override: tt.o}})
			// Published at once, before the heartbeat.
			ev := a.Evaluate(at(10*time.Second + 100*time.Millisecond))
			if len(ev.Snapshots) != 1 {
				t.Fatalf("%d snapshots after setting an override, want 1", len(ev.Snapshots))
			}
			snap := ev.Snapshots[0]
			if err := snap.Validate(); err != nil {
				t.Fatal(err)
			}
			d := snap.Find(tt.backend)
			if d.State != tt.state || d.Weight != tt.weight {
				t.Errorf("%s %v, want %s %v", d.State, d.Weight, tt.state, tt.weight)
			}
			if tt.open != (d.OpenUntil != nil && d.OpenUntil.Equal(until)) {
				t.Errorf("open_until = %v, want the override's until: %v", d.OpenUntil, tt.open)
			}
			if diff := cmp.Diff(&tt.o, d.Override); diff != "" {
				t.Errorf("override (-want +got):\n%s", diff)
			}
			// Nothing changed: nothing published before the heartbeat (the
			// pool's phase puts it at 10.23 s, a tenth early at 10.13 s).
			if ev := a.Evaluate(at(10*time.Second + 120*time.Millisecond)); len(ev.Snapshots) != 0 {
				t.Errorf("%d snapshots without a change, want 0", len(ev.Snapshots))
			}
			// Cleared: the analyzer's own verdict, published at once.
			a.SetOverrides(nil)
			ev = a.Evaluate(at(10*time.Second + 300*time.Millisecond))
			if len(ev.Snapshots) != 1 {
				t.Fatalf("%d snapshots after clearing, want 1", len(ev.Snapshots))
			}
			d = ev.Snapshots[0].Find(tt.backend)
			if d.Override != nil {
				t.Errorf("override %+v after clearing", d.Override)
			}
			wantState := fleetwatch.StateClosed
			if tt.backend == "b" {
				wantState = fleetwatch.StateOpen
			}
			if d.State != wantState {
				t.Errorf("after clearing %s, want %s", d.State, wantState)
			}
		})
	}
}

func TestOverrideExpires(t *testing.T) {
	a := overrideScenario(t)
	until := at(12 * time.Second)
	a.SetOverrides([]BackendOverride{{Pool: "p", Backend: "a", Override: ov(fleetwatch.OverrideForceOpen, until)}})
	if d := backendOf(t, a, "p", "a", at(11*time.Second)); d.State != fleetwatch.StateOpen || d.Override == nil {
		t.Fatalf("before until: %s override %v, want open with the override", d.State, d.Override)
	}
	a.Evaluate(at(11 * time.Second))
	ev := a.Evaluate(at(12 * time.Second))
	if len(ev.Snapshots) != 1 {
		t.Fatalf("%d snapshots at until, want 1", len(ev.Snapshots))
	}
	d := ev.Snapshots[0].Find("a")
	if d.State != fleetwatch.StateClosed || d.Override != nil || d.OpenUntil != nil {
		t.Errorf("at until: %s override %v open_until %v, want closed without override", d.State, d.Override, d.OpenUntil)
	}
}

// TestOverrideKeepsCounting checks that the analyzer judges a drained
// backend underneath: it fails while drained, and clearing the drain
// publishes it open, not the closed state it had when drained.
func TestOverrideKeepsCounting(t *testing.T) {
	a := newAnalyzer(t, Config{Epoch: "e", Settings: noJitter(Settings{})})
	for _, id := range []string{"a", "c", "d"} { // one open of three is within the ejection cap
		a.Observe(series("p", id, ok, 40, t0, 10*time.Second, 100))
	}
	a.Evaluate(at(10 * time.Second))
	a.SetOverrides([]BackendOverride{{Pool: "p", Backend: "a", Override: ov(fleetwatch.OverrideDrain, at(time.Hour))}})
	a.Observe(series("p", "a", fail, 60, at(10*time.Second), 5*time.Second, 0))
	ev := a.Evaluate(at(15 * time.Second))
	d := ev.Snapshots[0].Find("a")
	if d.State != fleetwatch.StateOpen || d.Override == nil {
		t.Fatalf("drained a after failures: %s override %v, want open (its own verdict) with the override", d.State, d.Override)
	}
	a.SetOverrides(nil)
	if d := backendOf(t, a, "p", "a", at(15*time.Second+time.Millisecond)); d.State != fleetwatch.StateOpen || d.Override != nil {
		t.Errorf("cleared: %s override %v, want open without override", d.State, d.Override)
	}
}

// TestOverrideUnknownBackend checks that an override of a backend not yet
// seen applies once it appears.
func TestOverrideUnknownBackend(t *testing.T) {
	a := newAnalyzer(t, Config{Epoch: "e"})
	a.SetOverrides([]BackendOverride{{Pool: "q", Backend: "x", Override: ov(fleetwatch.OverrideDrain, at(time.Hour))}})
	a.Observe(series("q", "x", ok, 5, t0, time.Second, 50))
	ev := a.Evaluate(at(time.Second))
	if d := ev.Snapshots[0].Find("x"); d.Weight != 0 || d.Override == nil {
		t.Errorf("x: weight %v override %v, want 0 with the override", d.Weight, d.Override)
	}
}

// TestRestoreIgnoresOverriddenDecisions checks that a restart does not
// take an override's published state and weight for the breaker's: a
// forced-open and a drained backend restore as healthy, closed, weight 1.
func TestRestoreIgnoresOverriddenDecisions(t *testing.T) {
	a := newAnalyzer(t, Config{Epoch: "e", Settings: noJitter(Settings{})})
	for _, id := range []string{"a", "b", "c"} {
		a.Observe(series("p", id, ok, 40, t0, 10*time.Second, 100))
	}
	a.SetOverrides([]BackendOverride{
		{Pool: "p", Backend: "a", Override: ov(fleetwatch.OverrideForceOpen, at(time.Hour))},
		{Pool: "p", Backend: "b", Override: ov(fleetwatch.OverrideDrain, at(time.Hour))},
	})
	ev := a.Evaluate(at(10 * time.Second))
	if d := ev.Snapshots[0].Find("a"); d.State != fleetwatch.StateOpen {
		t.Fatalf("a is %s, want forced open", d.State)
	}
	restarted := newAnalyzer(t, Config{Epoch: "e2", Settings: noJitter(Settings{})})
	restarted.Restore(ev.Snapshots, at(11*time.Second))
	for _, id := range []string{"a", "b"} {
		if d := backendOf(t, restarted, "p", id, at(11*time.Second)); d.State != fleetwatch.StateClosed || d.Weight != 1 || d.Override != nil {
			t.Errorf("%s restored as %s weight %v override %v, want closed 1 without override", id, d.State, d.Weight, d.Override)
		}
	}
}
