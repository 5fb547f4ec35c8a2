package p2c

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

func openBackend(b fleetwatch.Backend, until time.Time) fleetwatch.Backend {
	b.State, b.Weight, b.OpenUntil = fleetwatch.StateOpen, 0, new(fleetwatch.At(until))
	return b
}

// A subset restricts every pick to its backends; ids not in the pool are
// ignored; the least loaded of the subset wins.
func TestAmongRestrictsThePick(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, ids(8)...))
	defer busy(t, p, "b0002").Done(fleetwatch.OutcomeOK, 100, false)
	got := counts(p, seeded(1), Request{Among: []string{"b0002", "b0005", "b0006", "nope"}}, 2000)
	for id := range got {
		if id != "b0005" && id != "b0006" {
			t.Errorf("picked %s, outside the subset or busy: %v", id, got)
		}
	}
	if got["b0005"] < 800 || got["b0006"] < 800 {
		t.Errorf("picks %v: want the two idle ones of the subset, about evenly", got)
	}
}

// Open backends, and those of weight 0, are never picked from a subset; a
// subset of only those is ErrNoCandidates when one is drained (weight 0,
// not open), ErrShed when every one is open (all_open=shed), and the
// subset with breakers ignored under all_open=spread.
func TestAmongHonoursTheBreakers(t *testing.T) {
	until := t0.Add(time.Minute)
	bs := ids(4)
	bs[0] = openBackend(bs[0], until)
	bs[1].Weight = 0 // drained, or quarantined for drift
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, bs...))
	got := counts(p, seeded(2), Request{Among: []string{"b0000", "b0001", "b0002"}}, 1000)
	if got["b0002"] != 1000 {
		t.Errorf("picks %v: want every pick on b0002, the one usable", got)
	}
	if _, err := pickDone(p, seeded(2), Request{Among: []string{"b0000", "b0001"}}); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("an open and a drained backend: err %v, want ErrNoCandidates", err)
	}
	if _, err := pickDone(p, seeded(2), Request{Among: []string{"nope"}}); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("unknown ids: err %v, want ErrNoCandidates", err)
	}
	if _, err := pickDone(p, seeded(2), Request{Among: []string{"b0000"}}); !errors.Is(err, ErrShed) {
		t.Errorf("an open backend alone: err %v, want ErrShed", err)
	}
	snap := pool(2, bs...)
	snap.AllOpen = fleetwatch.AllOpenSpread
	p.Update(snap)
	if ch, err := pickDone(p, seeded(2), Request{Among: []string{"b0000"}}); err != nil || ch.Backend != "b0000" {
		t.Errorf("an open backend alone under spread: %v %v, want b0000", ch.Backend, err)
	}
}

// In failover mode a subset uses its lowest priority with a candidate.
func TestAmongFailover(t *testing.T) {
	prio := func(b fleetwatch.Backend, p int) fleetwatch.Backend { b.Priority = p; return b }
	bs := []fleetwatch.Backend{prio(backend("a", 100), 0), prio(backend("b", 100), 1), prio(backend("c", 100), 1), prio(backend("d", 100), 2)}
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	snap := pool(1, bs...)
	snap.Mode = fleetwatch.ModeFailover
	p.Update(snap)
	got := counts(p, seeded(3), Request{Among: []string{"b", "c", "d"}}, 2000)
	if got["d"] != 0 || got["b"] < 800 || got["c"] < 800 {
		t.Errorf("picks %v: want b and c (priority 1), never d", got)
	}
}

// With a stale snapshot a subset fails static: a breaker whose open_until
// is ahead stays honoured, one whose open_until passed is a candidate.
func TestAmongStale(t *testing.T) {
	bs := ids(3)
	bs[0] = openBackend(bs[0], t0.Add(time.Hour))
	bs[1] = openBackend(bs[1], t0.Add(8*time.Second))
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, bs...))
	c.Advance(10 * time.Second) // past ttl_ms and b0001's open_until
	got := counts(p, seeded(4), Request{Among: []string{"b0000", "b0001"}}, 500)
	if got["b0001"] != 500 {
		t.Errorf("stale picks %v: want b0001 (its open_until passed), never b0000", got)
	}
}

// Avoid is never chosen, even alone; Exclude (a retry) is, when it is the
// only candidate left.
func TestAvoidAndExclude(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, ids(2)...))
	if _, err := pickDone(p, seeded(5), Request{Among: []string{"b0000"}, Avoid: []string{"b0000"}}); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("the only allowed backend avoided: err %v, want ErrNoCandidates", err)
	}
	ch, err := pickDone(p, seeded(5), Request{Among: []string{"b0000"}, Exclude: "b0000"})
	if err != nil || ch.Backend != "b0000" {
		t.Errorf("a retry whose tried backend is the only one: %s %v, want b0000", ch.Backend, err)
	}
	got := counts(p, seeded(5), Request{Avoid: []string{"b0001"}}, 200)
	if got["b0000"] != 200 {
		t.Errorf("avoiding b0001: %v", got)
	}
}

// Fallbacks lists distinct backends after the primary, none open, at most
// n, and counts nothing in flight.
func TestFallbacks(t *testing.T) {
	bs := ids(5)
	bs[3] = openBackend(bs[3], t0.Add(time.Minute))
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, bs...))
	ch, err := p.Pick(seeded(6), Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Done(fleetwatch.OutcomeOK, 100, false)
	fb := p.Fallbacks(seeded(6), Request{}, ch.Backend, 10, nil)
	if len(fb) != 3 {
		t.Errorf("fallbacks %v after %s: want the 3 other backends not open", fb, ch.Backend)
	}
	seen := map[string]bool{ch.Backend: true}
	for _, id := range fb {
		if seen[id] || id == "b0003" {
			t.Errorf("fallbacks %v after %s: %s repeated or open", fb, ch.Backend, id)
		}
		seen[id] = true
		if n := p.InFlight(id); n != 0 {
			t.Errorf("fallback %s counted %d in flight", id, n)
		}
	}
	if fb := p.Fallbacks(seeded(6), Request{Among: []string{ch.Backend, "b0003"}}, ch.Backend, 2, nil); len(fb) != 0 {
		t.Errorf("fallbacks %v from a subset of the primary and an open backend: want none", fb)
	}
}

// A prefix keeps its sticky backend within the subset: the same prefix
// lands on the same backend every time, and different prefixes spread.
func TestAmongKeepsAffinity(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, ids(8)...))
	among := []string{"b0001", "b0003", "b0004", "b0006"}
	landed := map[string]bool{}
	for key := range uint64(40) {
		first := ""
		for range 5 {
			ch, err := pickDone(p, seeded(key), Request{Among: among, Prefix: key, HasPrefix: true})
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = ch.Backend
			}
			if ch.Backend != first {
				t.Fatalf("prefix %d went to %s, then %s", key, first, ch.Backend)
			}
		}
		if !slices.Contains(among, first) {
			t.Fatalf("prefix %d went to %s, outside the subset", key, first)
		}
		landed[first] = true
	}
	if len(landed) < 3 {
		t.Errorf("40 prefixes landed on %v, want them spread over the subset", landed)
	}
}

// A restricted pick allocates nothing.
func TestAmongAllocs(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, ids(100)...))
	r := seeded(1)
	req := Request{Among: []string{"b0003", "b0040", "b0077"}, Avoid: []string{"b0040"}}
	if a := testing.AllocsPerRun(1000, func() {
		c, _ := p.Pick(r, req)
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}); a != 0 {
		t.Errorf("a restricted Pick allocates %v times", a)
	}
}
