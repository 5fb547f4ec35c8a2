package p2c

import (
	"math"
	"math/bits"
	"time"
)

// decayTable computes exp(-d / L) for a duration d >= 0 in ns and a fixed
// time constant L without calling math.Exp on the pick path: d splits into
// whole steps of 2^shift ns (at most L/128) and a remainder r, and
//
//	exp(-d/L) = exp(-k 2^shift / L) x exp(-r/L)
//
// takes the first factor from a table built once per Picker and the second
// from a degree-6 Taylor polynomial (r/L < 1/128, so the truncation error
// is below (1/128)^7 / 7! < 1e-18, under one rounding of the product).
// The result differs from math.Exp by rounding only. The table covers d up
// to L plus a step (the span in which a published load is still used);
// beyond it, math.Exp.
type decayTable struct {
	steps []float64 // steps[k] = exp(-k 2^shift / L)
	shift uint
	inv   float64 // 1 / L, in 1/ns
}

func newDecayTable(l time.Duration) decayTable {
	if l <= 0 {
		return decayTable{}
	}
	var shift uint
	if l >= 256 {
		shift = uint(bits.Len64(uint64(l)/128)) - 1 // 2^shift <= L/128
	}
	t := decayTable{shift: shift, inv: 1 / float64(l)}
	n := int(uint64(l)>>shift) + 2
	t.steps = make([]float64, n)
	for k := range t.steps {
		t.steps[k] = math.Exp(-float64(uint64(k)<<shift) * t.inv)
	}
	return t
}

// at returns exp(-d / L) for d >= 0.
func (t *decayTable) at(d int64) float64 {
	k := uint64(d) >> t.shift
	if k >= uint64(len(t.steps)) {
		return math.Exp(-float64(d) * t.inv)
	}
	x := float64(uint64(d)&(1<<t.shift-1)) * t.inv
	return t.steps[k] * (1 + x*(-1+x*(1.0/2+x*(-1.0/6+x*(1.0/24+x*(-1.0/120+x*(1.0/720)))))))
}
