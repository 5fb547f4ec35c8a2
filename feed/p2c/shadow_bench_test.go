package p2c

import (
	"testing"

	"github.com/fleetwatch/fleetwatch"
)

// The cost of shadow mode: a pick in shadow mode picks twice (the mode's
// view and the full decisions) from replayed draws. Compare with
// BenchmarkPick100 and BenchmarkPickAffinity100, the same pool off.

func benchShadow(b *testing.B, mode fleetwatch.Shadow, req func(uint64) Request) {
	p := benchPicker(b, 100)
	snap := p.state.Load()
	if snap == nil {
		b.Fatal("no snapshot")
	}
	s := pool(2, ids(100)...)
	for i := range s.Backends {
		s.Backends[i].EWMATTFTMs = floatPtr(100 + float64(i%7)*30)
		s.Backends[i].Weight = 0.5 + float64(i%3)/4
	}
	s.At = snap.header.At
	s.TTLMs = 3600 * 1000
	s.Shadow = mode
	p.Update(s)
	if p.state.Load().full == nil {
		b.Fatal("shadow mode not applied")
	}
	benchPickWith(b, p, req)
}

func BenchmarkPickShadowBreakers100(b *testing.B) { benchShadow(b, fleetwatch.ShadowBreakers, plain) }
func BenchmarkPickShadowObserve100(b *testing.B)  { benchShadow(b, fleetwatch.ShadowObserve, plain) }
func BenchmarkPickShadowAffinity100(b *testing.B) {
	benchShadow(b, fleetwatch.ShadowObserve, prefixed)
}
