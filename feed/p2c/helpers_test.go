package p2c

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// t0 is the virtual time every test starts at.
var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

// clock is a settable virtual clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// scripted is a Rand that returns its values in order, then repeats the
// last one, so a test states exactly which candidates are drawn.
type scripted struct {
	vals []uint64
	next int
}

func (s *scripted) Uint64() uint64 {
	v := s.vals[min(s.next, len(s.vals)-1)]
	s.next++
	return v
}

// at returns the Uint64 that makes unitFloat return f.
func at(f float64) uint64 { return uint64(f*(1<<53)) << 11 }

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// backend builds one closed backend with weight 1 and an EWMA.
func backend(id string, ewma float64) fleetwatch.Backend {
	b := fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftOK}
	if ewma > 0 {
		b.EWMATTFTMs = new(float64(ewma))
	}
	return b
}

// pool builds a balance snapshot at t0 with a 5 s ttl and the median of
// the backends' EWMAs.
func pool(seq uint64, bs ...fleetwatch.Backend) *fleetwatch.Snapshot {
	s := &fleetwatch.Snapshot{
		V: 1, Pool: "p", Epoch: "e1", Seq: seq, At: fleetwatch.At(t0), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
		AffinityTolerance: fleetwatch.DefaultAffinityTolerance, Backends: bs,
	}
	var ewmas []float64
	for _, b := range bs {
		if b.EWMATTFTMs != nil {
			ewmas = append(ewmas, *b.EWMATTFTMs)
		}
	}
	if len(ewmas) > 0 {
		s.MedianEWMATTFTMs = new(float64(median(ewmas)))
	}
	return s
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ids(n int) []fleetwatch.Backend {
	bs := make([]fleetwatch.Backend, n)
	for i := range bs {
		bs[i] = backend(fmt.Sprintf("b%04d", i), 200)
	}
	return bs
}

// counts picks n times and counts the chosen backends.
func counts(p *Picker, r Rand, req Request, n int) map[string]int {
	got := map[string]int{}
	for range n {
		c, err := pickDone(p, r, req)
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		got[c.Backend]++
	}
	return got
}

// pickDone picks and finishes the request at once (as never sent), so that
// a test's picks do not pile up in flight, and returns the choice without
// its handle.
func pickDone(p *Picker, r Rand, req Request) (Choice, error) {
	c, err := p.Pick(r, req)
	out := Choice{Backend: c.Backend, Index: c.Index, Sticky: c.Sticky}
	c.Done(fleetwatch.OutcomeCanceled, 0, false)
	return out, err
}

// busy counts one request in flight on backend and returns its handle.
func busy(t testing.TB, p *Picker, backend string) *Choice {
	t.Helper()
	c, err := p.Choose(backend)
	if err != nil {
		t.Fatalf("Choose(%s): %v", backend, err)
	}
	return &c
}
