package analyzer

import "math"

// The TTFT histogram is log-linear (the HDR-histogram layout): every power of
// two between histMinMs and histMaxMs is split into histSubBins equal-width
// bins. The bin of a value is read straight from its float64 bits (exponent
// and the top four mantissa bits), so binning costs a few instructions and
// no logarithm.
//
// Error bound: a bin [lo, hi) with hi = lo*(1+1/16) reports 2*lo*hi/(lo+hi),
// the value whose relative distance to both ends is equal, so a reported
// quantile is within (hi-lo)/(hi+lo) = 1/33 (3.03%) of the true sample at
// that rank for values from 0.25 ms up. Values below 0.25 ms (including 0)
// share one underflow bin reported as 0.125 ms, an absolute error of at most
// 0.125 ms. Values at or above 2^22 ms (about 70 minutes,
// beyond the protocol's 1 hour limit) share the top bin.
const (
	histSubBinBits = 4
	histSubBins    = 1 << histSubBinBits // bins per power of two
	histMinExp     = -2                  // 2^-2 ms = 0.25 ms: the lowest bin's lower bound
	histMaxExp     = 22                  // 2^22 ms: the upper bound of the highest bin
	histOctaves    = histMaxExp - histMinExp
	// numBins counts the underflow bin and histOctaves x histSubBins bins.
	numBins = 1 + histOctaves*histSubBins
)

// histMinMs is the lower bound of the first regular bin.
var histMinMs = math.Ldexp(1, histMinExp)

// binOf returns the histogram bin of a TTFT in milliseconds.
func binOf(ms float64) uint16 {
	if !(ms >= histMinMs) { // also NaN
		return 0
	}
	bits := math.Float64bits(ms)
	exp := int(bits>>52&0x7ff) - 1023
	if exp >= histMaxExp {
		return numBins - 1
	}
	sub := int(bits >> (52 - histSubBinBits) & (histSubBins - 1))
	return uint16(1 + (exp-histMinExp)*histSubBins + sub)
}

// binValue returns the value a bin reports: the point of equal relative
// error to both of its ends.
func binValue(bin int) float64 {
	if bin <= 0 {
		return histMinMs / 2
	}
	octave, sub := (bin-1)/histSubBins, (bin-1)%histSubBins
	lo := math.Ldexp(1+float64(sub)/histSubBins, octave+histMinExp)
	hi := lo + math.Ldexp(1.0/histSubBins, octave+histMinExp)
	return 2 * lo * hi / (lo + hi)
}

// histogram counts samples per bin.
type histogram struct {
	counts [numBins]uint32
	total  uint64
}

func (h *histogram) add(bin uint16) {
	h.counts[bin]++
	h.total++
}

func (h *histogram) subAll(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] -= c
	}
	h.total -= o.total
}

func (h *histogram) remove(bin uint16) {
	h.counts[bin]--
	h.total--
}

// quantile returns the q-quantile (0 < q <= 1) by nearest rank: the value of
// the bin holding the ceil(q*total)-th smallest sample. ok is false when the
// histogram is empty.
func (h *histogram) quantile(q float64) (v float64, ok bool) {
	var out [1]float64
	if !h.quantiles([]float64{q}, out[:]) {
		return 0, false
	}
	return out[0], true
}

// quantiles computes the quantiles qs (ascending) into out in one pass over
// the bins; false when the histogram is empty.
func (h *histogram) quantiles(qs []float64, out []float64) bool {
	if h == nil || h.total == 0 {
		return false
	}
	next := 0
	rank := func(q float64) uint64 { return max(uint64(math.Ceil(q*float64(h.total))), 1) }
	want := rank(qs[0])
	var seen uint64
	for i, c := range h.counts {
		seen += uint64(c)
		for seen >= want {
			out[next] = binValue(i)
			next++
			if next == len(qs) {
				return true
			}
			want = rank(qs[next])
		}
	}
	for ; next < len(qs); next++ {
		out[next] = binValue(numBins - 1)
	}
	return true
}
