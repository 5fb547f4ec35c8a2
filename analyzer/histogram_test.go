package analyzer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBinOfAndBinValue(t *testing.T) {
	tests := []struct {
		name string
		ms   float64
		want uint16
	}{
		{"zero is underflow", 0, 0},
		{"below 0.25ms is underflow", 0.2499, 0},
		{"NaN is underflow", math.NaN(), 0},
		{"0.25ms is the first regular bin", 0.25, 1},
		{"1ms", 1, 1 + 2*histSubBins},
		{"1.0625ms is the next sub-bin", 1.0625, 2 + 2*histSubBins},
		{"one hour is below the top", 3_600_000, numBins - 1 - 1},
		{"beyond 2^22ms is the top bin", 1e9, numBins - 1},
		{"infinity is the top bin", math.Inf(1), numBins - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := binOf(tt.ms)
			if tt.name == "one hour is below the top" {
				if got >= numBins-1 || got < numBins-histSubBins {
					t.Fatalf("binOf(%v) = %d, want within the highest octave below %d", tt.ms, got, numBins-1)
				}
				return
			}
			if got != tt.want {
				t.Fatalf("binOf(%v) = %d, want %d", tt.ms, got, tt.want)
			}
		})
	}
}

// TestBinRelativeError checks the documented bound: a bin's reported value is
// within 1/33 (3.03%) of every value that falls in it, from 0.25 ms up.
func TestBinRelativeError(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	for range 200_000 {
		v := math.Exp(rng.Float64()*math.Log(3_600_000/0.25)) * 0.25
		rep := binValue(int(binOf(v)))
		worst = max(worst, math.Abs(rep-v)/v)
	}
	if bound := 1.0 / 33; worst > bound+1e-12 {
		t.Fatalf("worst relative error %.4f > %.4f", worst, bound)
	}
	if worst < 0.02 {
		t.Fatalf("worst relative error %.4f is implausibly small: the bins are not 1/16 octave wide", worst)
	}
	// The underflow bin: absolute error at most 0.125 ms.
	for _, v := range []float64{0, 0.1, 0.2499} {
		if rep := binValue(int(binOf(v))); math.Abs(rep-v) > 0.125 {
			t.Fatalf("underflow value %v reported as %v", v, rep)
		}
	}
}

func TestHistogramQuantile(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dists := map[string]func() float64{
		"uniform 100-300ms": func() float64 { return 100 + 200*rng.Float64() },
		"lognormal":         func() float64 { return math.Exp(5 + rng.NormFloat64()) },
		"bimodal":           func() float64 { return []float64{80, 4000}[rng.IntN(2)] * (1 + 0.1*rng.Float64()) },
	}
	for name, draw := range dists {
		t.Run(name, func(t *testing.T) {
			var h histogram
			vals := make([]float64, 5000)
			for i := range vals {
				vals[i] = draw()
				h.add(binOf(vals[i]))
			}
			slices.Sort(vals)
			for _, q := range []float64{0.5, 0.95, 0.99} {
				exact := vals[int(math.Ceil(q*float64(len(vals))))-1] // nearest rank
				got, ok := h.quantile(q)
				if !ok {
					t.Fatal("quantile of a filled histogram not ok")
				}
				if rel := math.Abs(got-exact) / exact; rel > 1.0/33 {
					t.Errorf("q%.2f = %.2f, exact %.2f: relative error %.4f", q, got, exact, rel)
				}
			}
		})
	}
	var empty histogram
	if _, ok := empty.quantile(0.5); ok {
		t.Fatal("quantile of an empty histogram is ok")
	}
}
