package route

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

func corePools(t *testing.T, now func() time.Time) *Pools {
	t.Helper()
	ps, err := NewPools([]Pool{
		{ID: "chat", Models: []string{"gpt-x"}, Backends: []Backend{
			{ID: "a", URL: "http://10.0.0.1:8000"},
			{ID: "b", URL: "https://b.example/v1"},
			{ID: "c", URL: "http://10.0.0.3"},
		}},
		{ID: "code", Backends: []Backend{{ID: "10.0.1.1:9000", URL: "http://10.0.1.1:9000"}}},
	}, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestPoolsLookupAndAddresses(t *testing.T) {
	ps := corePools(t, nil)
	for model, want := range map[string]string{"chat": "chat", "gpt-x": "chat", "code": "code", "nope": ""} {
		if got, _ := ps.ForModel(model); got != want {
			t.Errorf("ForModel(%q) = %q, want %q", model, got, want)
		}
	}
	for _, c := range []struct{ pool, backend, addr string }{
		{"chat", "a", "10.0.0.1:8000"}, {"chat", "b", "b.example:443"}, {"chat", "c", "10.0.0.3:80"},
		{"code", "10.0.1.1:9000", "10.0.1.1:9000"}, {"chat", "zz", ""},
	} {
		if got := ps.Address(c.pool, c.backend); got != c.addr {
			t.Errorf("Address(%s, %s) = %q, want %q", c.pool, c.backend, got, c.addr)
		}
		if c.addr != "" {
			if got := ps.Backend(c.pool, c.addr); got != c.backend {
				t.Errorf("Backend(%s, %s) = %q, want %q", c.pool, c.addr, got, c.backend)
			}
		}
	}
	if _, err := ps.Pick("nope", rand.New(rand.NewPCG(1, 2)), p2c.Request{}); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("Pick of an unknown pool: %v, want ErrUnknownPool", err)
	}
}

func TestPoolsWhy(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	ps := corePools(t, clock)
	if w := ps.Why("chat", "a"); w.Class != WhyUnknown || w.AgeSeconds() != -1 {
		t.Errorf("before any decision: %+v, want unknown, age -1", w)
	}
	until := fleetwatch.At(now.Add(time.Minute))
	snap := &fleetwatch.Snapshot{V: 1, Pool: "chat", Epoch: "e", Seq: 1, At: fleetwatch.At(now.Add(-1500 * time.Millisecond)), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Backends: []fleetwatch.Backend{
			{Backend: "a", State: fleetwatch.StateClosed, Weight: 1},
			{Backend: "b", State: fleetwatch.StateOpen, Weight: 0, OpenUntil: &until},
			{Backend: "c", State: fleetwatch.StateClosed, Weight: 0.4},
		}}
	ps.Apply(snap)
	for backend, want := range map[string]string{"a": WhyHealthy, "b": WhyOpen, "c": WhyDownWeighted} {
		if w := ps.Why("chat", backend); w.Class != want || w.AgeSeconds() != 1.5 {
			t.Errorf("Why(%s) = %+v, want %s at 1.5 s", backend, w, want)
		}
	}
	// A load update based on the snapshot confirms its decisions: the
	// age counts from the update's at (and the ttl too).
	now = now.Add(3 * time.Second)
	ps.ApplyLoads("chat", &p2c.LoadUpdate{Epoch: "e", Base: 1, At: now.Add(-time.Second), Median: math.NaN(), Budget: math.NaN()})
	if w := ps.Why("chat", "a"); w.Class != WhyHealthy || w.AgeSeconds() != 1 {
		t.Errorf("after a load update 1 s ago: %+v, want healthy at 1 s", w)
	}
	now = now.Add(10 * time.Second)
	if w := ps.Why("chat", "a"); w.Class != WhyStale {
		t.Errorf("past the ttl: %+v, want stale", w)
	}
}

// The core's picks are the picker's, and Fallbacks lists the others in
// order, never an open one.
func TestPoolsPickAndFallbacks(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	ps := corePools(t, func() time.Time { return now })
	until := fleetwatch.At(now.Add(time.Minute))
	ps.Apply(&fleetwatch.Snapshot{V: 1, Pool: "chat", Epoch: "e", Seq: 1, At: fleetwatch.At(now), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Backends: []fleetwatch.Backend{
			{Backend: "a", State: fleetwatch.StateClosed, Weight: 1},
			{Backend: "b", State: fleetwatch.StateOpen, Weight: 0, OpenUntil: &until},
			{Backend: "c", State: fleetwatch.StateClosed, Weight: 1},
		}})
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		ch, err := ps.Pick("chat", r, p2c.Request{})
		if err != nil || ch.Backend == "b" {
			t.Fatalf("pick %q %v: want a or c", ch.Backend, err)
		}
		fb := ps.Fallbacks("chat", r, p2c.Request{}, ch.Backend, 3, nil)
		if len(fb) != 1 || fb[0] == ch.Backend || fb[0] == "b" {
			t.Fatalf("fallbacks %v after %s: want the other of a and c", fb, ch.Backend)
		}
		ch.Done(fleetwatch.OutcomeOK, 10, false)
	}
	if _, err := ps.Pick("chat", r, p2c.Request{Among: []string{"b"}}); !errors.Is(err, p2c.ErrShed) {
		t.Errorf("a subset of an open backend: %v, want ErrShed", err)
	}
}

// TestMergeOrder checks that a snapshot's decisions reach the configured
// backends whatever the snapshot's order, and that backends it does not
// name or the router does not have are handled: merge walks the sorted
// order once and searches when the walk misses.
func TestMergeOrder(t *testing.T) {
	ps := corePools(t, nil)
	p := ps.pools["chat"]
	at := fleetwatch.At(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	be := func(id string, w float64) fleetwatch.Backend {
		return fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: w}
	}
	for name, bs := range map[string][]fleetwatch.Backend{
		"sorted":            {be("a", 0.1), be("b", 0.2), be("c", 0.3)},
		"out of order":      {be("c", 0.3), be("a", 0.1), be("b", 0.2)},
		"extra and missing": {be("0", 0.9), be("a", 0.1), be("bb", 0.5), be("c", 0.3)},
	} {
		snap := &fleetwatch.Snapshot{Pool: "chat", Epoch: "e", Seq: 1, At: at, Backends: bs}
		m := p.merge(snap)
		want := map[string]float64{"a": 0.1, "b": 0.2, "c": 0.3}
		if name == "extra and missing" {
			want["b"] = 1 // not named: a healthy default
		}
		if len(m.Backends) != 3 {
			t.Fatalf("%s: merged %d backends, want the 3 configured", name, len(m.Backends))
		}
		for i, id := range []string{"a", "b", "c"} {
			if got := m.Backends[i]; got.Backend != id || got.Weight != want[id] {
				t.Errorf("%s: backend %d = %s weight %g, want %s weight %g", name, i, got.Backend, got.Weight, id, want[id])
			}
		}
	}
}
