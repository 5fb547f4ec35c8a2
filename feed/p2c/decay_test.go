package p2c

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The table's exp agrees with math.Exp to a few roundings at every time
// constant, over the table's span, its edges and beyond it.
func TestDecayTableMatchesExp(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, l := range []time.Duration{1, 7, 255, 256, 1000, time.Millisecond, 100 * time.Millisecond, DefaultLoadStale, time.Hour} {
		tbl := newDecayTable(l)
		if step := int64(1) << tbl.shift; l >= 256 && step > int64(l)/128 {
			t.Fatalf("L=%v: step %d ns > L/128", l, step)
		}
		check := func(d int64) {
			got, want := tbl.at(d), math.Exp(-float64(d)/float64(l))
			if diff := math.Abs(got - want); diff > 4*ulp(want) {
				t.Fatalf("L=%v d=%d: table %v, math.Exp %v (%.1f ulp)", l, d, got, want, diff/ulp(want))
			}
		}
		step := int64(1) << tbl.shift
		for _, d := range []int64{0, 1, step - 1, step, step + 1, int64(l) - 1, int64(l), int64(l) + step, 3 * int64(l)} {
			check(max(d, 0))
		}
		for range 20000 {
			check(r.Int64N(2*int64(l) + 1))
		}
	}
}

func ulp(x float64) float64 { return math.Nextafter(x, math.Inf(1)) - x }
