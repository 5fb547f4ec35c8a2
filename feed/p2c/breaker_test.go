package p2c

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// finishOn finishes one request to backend with outcome at once.
func finishOn(t testing.TB, p *Picker, backend string, o fleetwatch.Outcome) {
	t.Helper()
	busy(t, p, backend).Done(o, 1, false)
}

// The local breaker's states, with the default settings: 5 failures in a
// row open it for 10s, then it is half-open; a failed probe opens it for
// 20s (the second trip), ... capped at 1m; 3 ok outcomes close it.
func TestLocalBreakerStates(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, backend("a", 100), backend("b", 100)))
	var got []fleetwatch.State
	step := func() { got = append(got, p.LocalState("a")) }

	for range 4 {
		finishOn(t, p, "a", fleetwatch.OutcomeError)
	}
	finishOn(t, p, "a", fleetwatch.OutcomeOK) // resets the count
	for range 4 {
		finishOn(t, p, "a", fleetwatch.OutcomeTimeout)
	}
	step() // closed: never 5 in a row
	finishOn(t, p, "a", fleetwatch.OutcomeThrottled)
	step() // open
	c.Advance(9 * time.Second)
	finishOn(t, p, "a", fleetwatch.OutcomeError) // a straggler while open: no effect
	step()                                       // open
	c.Advance(time.Second)
	step()                                         // half-open after 10s
	finishOn(t, p, "a", fleetwatch.OutcomeStalled) // the probe stalls: 20s
	step()                                         // open
	c.Advance(19 * time.Second)
	step() // still open
	c.Advance(time.Second)
	step() // half-open
	for range 2 {
		finishOn(t, p, "a", fleetwatch.OutcomeOK)
	}
	finishOn(t, p, "a", fleetwatch.OutcomeCanceled) // says nothing
	step()                                          // half-open: 2 of 3
	finishOn(t, p, "a", fleetwatch.OutcomeOK)
	step() // closed
	want := []fleetwatch.State{"closed", "open", "open", "half_open", "open", "open", "half_open", "half_open", "closed"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("local states (-want +got):\n%s", diff)
	}
	if p.tripped.Load() != 0 {
		t.Errorf("tripped = %d after closing, want 0", p.tripped.Load())
	}
	if s := p.LocalState("b"); s != fleetwatch.StateClosed {
		t.Errorf("b = %s, want closed", s)
	}
}

// The n-th trip in a row opens the breaker for n x LocalOpen, capped.
func TestLocalBreakerOpenGrowsAndIsCapped(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{LocalFailures: 1, LocalOpen: time.Second, LocalOpenMax: 3 * time.Second})
	p.Update(pool(1, backend("a", 100)))
	var opens []time.Duration
	finishOn(t, p, "a", fleetwatch.OutcomeError)
	for range 5 {
		d := time.Duration(0)
		for p.LocalState("a") == fleetwatch.StateOpen {
			c.Advance(100 * time.Millisecond)
			d += 100 * time.Millisecond
		}
		opens = append(opens, d)
		finishOn(t, p, "a", fleetwatch.OutcomeError) // the probe fails
	}
	want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second, 3 * time.Second}
	if diff := cmp.Diff(want, opens); diff != "" {
		t.Errorf("open times (-want +got):\n%s", diff)
	}
}

func TestLocalBreakerDisabled(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{LocalFailures: -1})
	p.Update(pool(1, backend("a", 100)))
	for range 50 {
		finishOn(t, p, "a", fleetwatch.OutcomeError)
	}
	if s := p.LocalState("a"); s != fleetwatch.StateClosed {
		t.Errorf("disabled local breaker is %s", s)
	}
}

// The local breaker steers picks only while the snapshot is stale: open,
// the backend gets nothing; half-open, a trickle; with a fresh snapshot
// the feed's weights decide.
func TestLocalBreakerOnlyWhenStale(t *testing.T) {
	for _, mode := range []fleetwatch.Mode{fleetwatch.ModeBalance, fleetwatch.ModeFailover} {
		t.Run(string(mode), func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{})
			snap := pool(1, backend("a", 100), backend("b", 100), backend("c", 100))
			snap.Mode = mode
			if mode == fleetwatch.ModeFailover {
				snap.Backends[1].Priority, snap.Backends[2].Priority = 1, 1 // a is the primary
			}
			p.Update(snap)
			for range 5 {
				finishOn(t, p, "a", fleetwatch.OutcomeError)
			}
			const n = 20000
			share := func() float64 { return float64(counts(p, seeded(3), Request{}, n)["a"]) / n }
			fresh := share()
			c.Advance(6 * time.Second) // stale; a's local breaker open for 10s
			open := share()
			c.Advance(5 * time.Second) // half-open
			halfOpen := share()
			if fresh < 0.3 {
				t.Errorf("fresh: a's share %.3f, want the feed's (>= 1/3): the local breaker must not count", fresh)
			}
			if open != 0 {
				t.Errorf("stale, locally open: a's share %.4f, want 0", open)
			}
			if halfOpen < 0.01 || halfOpen > 0.1 {
				t.Errorf("stale, locally half-open: a's share %.4f, want a trickle around 0.05", halfOpen)
			}
		})
	}
}

// When every candidate's local breaker is open the picker ignores them:
// a router without a feed never sends nothing on its own guess.
func TestLocalBreakerAllOpenStillPicks(t *testing.T) {
	for _, mode := range []fleetwatch.Mode{fleetwatch.ModeBalance, fleetwatch.ModeFailover} {
		t.Run(string(mode), func(t *testing.T) {
			c := &clock{now: t0.Add(time.Minute)} // stale from the start
			p := newPicker(c, Settings{})
			snap := pool(1, backend("a", 100), backend("b", 100))
			snap.Mode = mode
			p.Update(snap)
			for range 5 {
				finishOn(t, p, "a", fleetwatch.OutcomeError)
				finishOn(t, p, "b", fleetwatch.OutcomeError)
			}
			got := counts(p, seeded(4), Request{}, 1000)
			if got["a"]+got["b"] != 1000 {
				t.Errorf("picks %v, want every pick to go somewhere", got)
			}
		})
	}
}

// The fast-failure trap without a feed: a backend that fails at once has
// nothing in flight, so the in-flight score alone would hand it every
// comparison it is in (about 2/3 of the picks of a pool of three). The
// local breaker keeps it under 5% of the attempts.
func TestLocalBreakerFastFailureWithoutFeed(t *testing.T) {
	for _, tt := range []struct {
		name    string
		local   int
		maxFrac float64
		minFrac float64
	}{
		{"local breaker on", 0, 0.05, 0},
		{"local breaker off: the trap", -1, 1, 0.3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{now: t0}
			p := newPicker(c, Settings{LocalFailures: tt.local, RetryRatio: -1})
			snap := pool(1, backend("good1", 0), backend("good2", 0), backend("bad", 0))
			snap.At.Time = time.Unix(0, 0) // stale from the start, as before any decision
			p.Update(snap)
			r := seeded(5)
			var inFlight []*Choice
			bad, total := 0, 0
			for range 20000 { // 10 ms apart: 200 s of traffic
				c.Advance(10 * time.Millisecond)
				ch, err := p.Pick(r, Request{})
				if err != nil {
					t.Fatal(err)
				}
				total++
				if ch.Backend == "bad" {
					bad++
					ch.Done(fleetwatch.OutcomeError, 1, false) // fails at once
				} else {
					inFlight = append(inFlight, &ch)
				}
				if len(inFlight) > 8 { // the good ones take 8 steps
					inFlight[0].Done(fleetwatch.OutcomeOK, 80, false)
					inFlight = inFlight[1:]
				}
			}
			t.Logf("the failing backend got %d of %d attempts", bad, total)
			if f := float64(bad) / float64(total); f > tt.maxFrac || f < tt.minFrac {
				t.Errorf("the failing backend got %d of %d attempts (%.3f), want [%.2f, %.2f]", bad, total, f, tt.minFrac, tt.maxFrac)
			}
		})
	}
}

func TestStaleLocalPickAllocs(t *testing.T) {
	c := &clock{now: t0}
	for _, mode := range []fleetwatch.Mode{fleetwatch.ModeBalance, fleetwatch.ModeFailover} {
		p := newPicker(c, Settings{RetryRatio: -1})
		snap := pool(1, ids(100)...)
		snap.Mode = mode
		p.Update(snap)
		for range 5 {
			finishOn(t, p, "b0003", fleetwatch.OutcomeError)
		}
		c.Advance(6 * time.Second)
		r := seeded(1)
		for _, req := range []Request{{}, {Prefix: 42, HasPrefix: true}, {Exclude: "b0004"}} {
			if a := testing.AllocsPerRun(1000, func() {
				ch, _ := p.Pick(r, req)
				ch.Done(fleetwatch.OutcomeOK, 100, false)
			}); a != 0 {
				t.Errorf("%s: stale Pick(%+v) with a local breaker open allocates %v times", mode, req, a)
			}
		}
	}
}
