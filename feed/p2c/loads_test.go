package p2c

import (
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// loadPicker follows a snapshot of a, b and c (seq 2, epoch e1, at t0, 4
// routers) with loads 10, 2 and none.
func loadPicker(t *testing.T) (*Picker, *clock) {
	t.Helper()
	c := &clock{now: t0}
	p := newPicker(c, Settings{Score: LoadScore})
	snap := pool(2, withLoad(backend("a", 200), 10, 0), withLoad(backend("b", 200), 2, 0), backend("c", 200))
	snap.Routers = 4
	p.Update(snap)
	return p, c
}

func loadOfID(p *Picker, c *clock, id string) float64 {
	st := p.state.Load()
	return p.loadOf(st, &st.entries[st.byID[id]], false, c.now.UnixNano())
}

// A load update moves the loads it lists (and the published EWMAs), leaves
// the decisions, and the picks follow the new loads.
func TestUpdateLoadsMovesLoads(t *testing.T) {
	p, c := loadPicker(t)
	if got := counts(p, seeded(1), Request{}, 200); got["a"] > got["b"] {
		t.Fatalf("before the update: %v, want b (load 2) ahead of a (load 10)", got)
	}
	c.Advance(250 * time.Millisecond)
	ok := p.UpdateLoads(&LoadUpdate{Epoch: "e1", Base: 2, At: c.now, Median: math.NaN(), Budget: math.NaN(),
		Backends: []BackendLoad{
			{Backend: "a", Running: 0, Waiting: 0, Metrics: true, EWMATTFTMs: math.NaN()},
			{Backend: "b", Running: 12, Waiting: 4, Metrics: true, EWMATTFTMs: 900},
			{Backend: "zz", Running: 1, Waiting: 0, EWMATTFTMs: math.NaN()}, // not in the snapshot: ignored
		}})
	if !ok {
		t.Fatal("UpdateLoads refused an update of the snapshot applied")
	}
	if a, b := loadOfID(p, c, "a"), loadOfID(p, c, "b"); math.Abs(a) > 1e-9 || math.Abs(b-16) > 1e-9 {
		t.Errorf("loads after the update: a %v, b %v, want 0 and 16", a, b)
	}
	st := p.state.Load()
	if e := st.entries[st.byID["b"]]; e.pub.feedEWMA() != 900 || e.weight != 1 || e.state != fleetwatch.StateClosed {
		t.Errorf("b after the update: EWMA %v weight %v state %s, want 900, 1, closed", e.pub.feedEWMA(), e.weight, e.state)
	}
	if got := counts(p, seeded(1), Request{}, 200); got["b"] > got["a"] {
		t.Errorf("after the update: %v, want a (load 0) ahead of b (load 16)", got)
	}
}

// An update finds its backends by position when it lists them in the
// snapshot's order, and by id otherwise.
func TestUpdateLoadsInAnyOrder(t *testing.T) {
	for name, order := range map[string][]string{"in order": {"a", "b", "c"}, "reversed": {"c", "b", "a"}, "some": {"b"}} {
		p, c := loadPicker(t)
		c.Advance(250 * time.Millisecond)
		u := &LoadUpdate{Epoch: "e1", Base: 2, At: c.now, Median: math.NaN(), Budget: math.NaN()}
		want := map[string]float64{"a": loadOfID(p, c, "a"), "b": loadOfID(p, c, "b")} // unlisted: as they were
		for k, id := range order {
			u.Backends = append(u.Backends, BackendLoad{Backend: id, Running: float64(20 + k), Metrics: true, EWMATTFTMs: math.NaN()})
			want[id] = float64(20 + k)
		}
		if !p.UpdateLoads(u) {
			t.Fatalf("%s: refused", name)
		}
		for id, w := range want {
			if got := loadOfID(p, c, id); math.Abs(got-w) > 1e-9 {
				t.Errorf("%s: %s's load %v, want %v", name, id, got, w)
			}
		}
	}
}

// An update of another snapshot (epoch or seq), or older than the snapshot
// applied, changes nothing.
func TestUpdateLoadsOfAnotherSnapshot(t *testing.T) {
	for name, u := range map[string]LoadUpdate{
		"another epoch":    {Epoch: "e0", Base: 2, At: t0.Add(time.Second)},
		"another seq":      {Epoch: "e1", Base: 1, At: t0.Add(time.Second)},
		"older than it is": {Epoch: "e1", Base: 2, At: t0.Add(-time.Second)},
	} {
		p, c := loadPicker(t)
		u.Median, u.Budget = math.NaN(), math.NaN()
		u.Backends = []BackendLoad{{Backend: "a", Running: 0, Waiting: 0, EWMATTFTMs: math.NaN()}}
		if p.UpdateLoads(&u) {
			t.Errorf("%s: applied", name)
		}
		if got := loadOfID(p, c, "a"); got != 10 {
			t.Errorf("%s: a's load %v, want 10 still", name, got)
		}
		if got := p.StaleAt(); !got.Equal(t0.Add(5 * time.Second)) {
			t.Errorf("%s: stale at %v, want the snapshot's at + ttl", name, got)
		}
	}
}

// An update keeps the decisions fresh until its at + ttl_ms; a load listed
// with a report age only is the same load reported again then (unless that
// is older than the report it has); a load not listed keeps its report
// time.
func TestUpdateLoadsReportTimes(t *testing.T) {
	p, c := loadPicker(t)
	c.Advance(4 * time.Second)
	p.UpdateLoads(&LoadUpdate{Epoch: "e1", Base: 2, At: c.now, Median: math.NaN(), Budget: math.NaN(),
		Backends: []BackendLoad{{Backend: "a", Running: math.NaN(), Waiting: math.NaN(), AgeMs: 100, EWMATTFTMs: math.NaN()},
			{Backend: "c", Running: math.NaN(), Waiting: math.NaN(), AgeMs: 4500, EWMATTFTMs: math.NaN()}}})
	if got, want := loadOfID(p, c, "a"), 10*math.Exp(-0.1/2); math.Abs(got-want) > 1e-6 {
		t.Errorf("a's load %v just reported again, want %v (the same load, 100 ms old, decaying over LoadStale, 2 s)", got, want)
	}
	c.Advance(3 * time.Second) // 7 s after the snapshot, 3 s after the update
	if got, want := p.StaleAt(), t0.Add(9*time.Second); !got.Equal(want) {
		t.Errorf("stale at %v, want the update's at + 5 s (%v)", got, want)
	}
	st := p.state.Load()
	reported := func(id string) time.Time { return time.Unix(0, st.entries[st.byID[id]].pub.loadAt.Load()) }
	if got, want := reported("a"), t0.Add(3900*time.Millisecond); !got.Equal(want) {
		t.Errorf("a's load reported at %v, want the update's at - 100 ms (%v)", got, want)
	}
	if got := reported("b"); !got.Equal(t0) {
		t.Errorf("b's load reported at %v, want the snapshot's report time %v", got, t0)
	}
}

// The median moves with an update, and goes with a 0.
func TestUpdateLoadsMedian(t *testing.T) {
	p, _ := loadPicker(t)
	st := p.state.Load()
	if st.med() != 200 {
		t.Fatalf("median %v, want 200", st.med())
	}
	p.UpdateLoads(&LoadUpdate{Epoch: "e1", Base: 2, At: t0, Median: 350, Budget: math.NaN()})
	if st.med() != 350 {
		t.Errorf("median %v after an update of 350", st.med())
	}
	p.UpdateLoads(&LoadUpdate{Epoch: "e1", Base: 2, At: t0, Median: 0, Budget: math.NaN()})
	if !math.IsNaN(st.med()) {
		t.Errorf("median %v after an update of 0, want none", st.med())
	}
}

// Applying a load update allocates nothing.
func TestUpdateLoadsAllocatesNothing(t *testing.T) {
	p, c := loadPicker(t)
	u := &LoadUpdate{Epoch: "e1", Base: 2, At: c.now, Median: 210, Budget: math.NaN(),
		Backends: []BackendLoad{{Backend: "a", Running: 3, Waiting: 1, EWMATTFTMs: 220}, {Backend: "b", NoLoad: true, Running: math.NaN(), EWMATTFTMs: math.NaN()}}}
	if a := testing.AllocsPerRun(100, func() {
		c.Advance(time.Millisecond)
		u.At = c.now
		p.UpdateLoads(u)
	}); a != 0 {
		t.Errorf("UpdateLoads allocates %v per update, want 0", a)
	}
}

// Picks go on while load updates are applied (run with -race).
func TestUpdateLoadsWhilePicking(t *testing.T) {
	p, _ := loadPicker(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := seeded(2)
		for range 2000 {
			if _, err := pickDone(p, r, Request{}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	u := &LoadUpdate{Epoch: "e1", Base: 2, Median: math.NaN(), Budget: math.NaN(),
		Backends: []BackendLoad{{Backend: "a", EWMATTFTMs: math.NaN()}, {Backend: "c", EWMATTFTMs: 180}}}
	for i := range 2000 {
		u.At = t0.Add(time.Duration(i) * time.Millisecond)
		u.Backends[0].Running, u.Backends[0].Waiting = float64(i%13), float64(i%3)
		u.Backends[1].Running, u.Backends[1].Waiting = float64(i%5), 0
		if !p.UpdateLoads(u) {
			t.Fatal("update refused")
		}
	}
	<-done
}
