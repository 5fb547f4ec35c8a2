package drift

import (
	"math"
	"slices"
)

// Stats are one cycle's statistics against a baseline.
type Stats struct {
	// S1 is the share of stable prompts whose greedy sequence differs from
	// the baseline mode (all prompts when the suite has no stable ones).
	S1 float64
	// S2 is the mean |lp_now - lp_base| of the baseline's top-1 token over
	// positions up to and including the first divergence, pooled over
	// prompts. NaN without logprobs.
	S2 float64
	// S3 is the mean over prompts of the mean |lp_now - lp_base| at the
	// first position over the union of both top-k sets. NaN without
	// logprobs.
	S3 float64
	// S4 is the persistent delta against the previous cycle
	// (persistentDelta); NaN on the first cycle or without logprobs.
	S4 float64
	// Positions is how many positions S2 averaged.
	Positions int
	// ExactMatch is the share of all prompts whose sequence equals the mode.
	ExactMatch float64
	// Mismatched and Stable count S1's numerator and denominator.
	Mismatched, Stable int
}

// Measure computes the statistics of cycle c against baseline b. The cycle
// must be of b's suite.
func Measure(b *Baseline, c *Cycle) Stats {
	var st Stats
	exact := 0
	var sum2 float64
	var sum3 float64
	n3 := 0
	anyStable := false
	for i := range b.Prompts {
		anyStable = anyStable || b.Prompts[i].Kind == KindStable
	}
	for i := range b.Prompts {
		pb := &b.Prompts[i]
		o := &c.Obs[i]
		same := slices.Equal(pb.Mode, o.Sequence())
		if same {
			exact++
		}
		if pb.Kind == KindStable || !anyStable {
			st.Stable++
			if !same {
				st.Mismatched++
			}
		}
		if !b.Logprobs || !o.HasLogprobs {
			continue
		}
		d, n := alignedDelta(pb, o.Tokens)
		sum2 += d
		st.Positions += n
		if len(pb.Positions) > 0 && len(o.Tokens) > 0 {
			sum3 += firstTokenDelta(&pb.Positions[0], &o.Tokens[0])
			n3++
		}
	}
	st.ExactMatch = float64(exact) / float64(len(b.Prompts))
	if st.Stable > 0 {
		st.S1 = float64(st.Mismatched) / float64(st.Stable)
	}
	st.S2, st.S3, st.S4 = math.NaN(), math.NaN(), math.NaN()
	if st.Positions > 0 {
		st.S2 = sum2 / float64(st.Positions)
	}
	if n3 > 0 {
		st.S3 = sum3 / float64(n3)
	}
	return st
}

// alignedDelta sums |lp_now - lp_base| of the baseline's top-1 token along
// the modal sequence until the first divergence (included: the context there
// is still the same), and returns the sum and the number of positions.
func alignedDelta(pb *PromptBaseline, toks []Token) (float64, int) {
	sum, n := 0.0, 0
	for j := range pb.Positions {
		if j >= len(toks) {
			break
		}
		sum += abs(lookup(&toks[j], pb.Mode[j]) - pb.Positions[j].Top1)
		n++
		if toks[j].Token != pb.Mode[j] {
			break
		}
	}
	return sum, n
}

// firstTokenDelta is the mean |lp_now - lp_base| over the union of the
// baseline's alternatives and the current top-k at one position; a token
// missing on one side counts at that side's floor.
func firstTokenDelta(base *PositionBaseline, now *Token) float64 {
	k := max(len(now.Top), 1)
	sum, n := 0.0, 0
	seen := map[string]bool{}
	for _, a := range base.Alts[:min(len(base.Alts), k)] {
		seen[a.Token] = true
		sum += abs(lookup(now, a.Token) - a.Logprob)
		n++
	}
	add := func(tok string, lp float64) {
		if seen[tok] {
			return
		}
		seen[tok] = true
		baseLP := base.Floor
		for _, a := range base.Alts {
			if a.Token == tok {
				baseLP = a.Logprob
				break
			}
		}
		sum += abs(lp - baseLP)
		n++
	}
	add(now.Token, now.Logprob)
	for _, a := range now.Top {
		add(a.Token, a.Logprob)
	}
	return sum / float64(n)
}

func abs(x float64) float64 { return math.Abs(x) }

// median of xs (NaN when empty); xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func nan() float64 { return math.NaN() }

// persistentDelta is S4, the part of the aligned top-1 delta that persists
// from one cycle to the next: with d_t = lp_now - lp_base at each position
// aligned with the mode in both cycles c and prev, m = mean(d_t x d_{t-1})
// and S4 = sign(m) sqrt(|m|), in nats: the root mean square of the shift the
// two cycles share. Run-to-run noise is independent between cycles and
// averages out of the product, while a changed artefact shifts the same
// positions the same way every cycle; so S4 sees a Q8-class change through
// noise that swamps it in S2, and does not jump when one cycle is noisier
// than the others (the load regime). Without a change, m still holds the
// baseline's own squared error, about v/n for n enrolment cycles of noise
// variance v; the leave-two-out null rescales its products by (n-2)/n so
// that its mean is that of the full baseline. NaN without common positions.
func persistentDelta(b *Baseline, c, prev *Cycle) float64 {
	return signedSqrt(persistentProduct(b, c, prev))
}

func signedSqrt(m float64) float64 { return math.Copysign(math.Sqrt(math.Abs(m)), m) }

// persistentProduct is the m of persistentDelta, in nats^2.
func persistentProduct(b *Baseline, c, prev *Cycle) float64 {
	if prev == nil || !b.Logprobs {
		return math.NaN()
	}
	sum, n := 0.0, 0
	for i := range b.Prompts {
		pb := &b.Prompts[i]
		a, p := c.Obs[i].Tokens, prev.Obs[i].Tokens
		if !c.Obs[i].HasLogprobs || !prev.Obs[i].HasLogprobs {
			continue
		}
		for j := range pb.Positions {
			if j >= len(a) || j >= len(p) {
				break
			}
			da := lookup(&a[j], pb.Mode[j]) - pb.Positions[j].Top1
			dp := lookup(&p[j], pb.Mode[j]) - pb.Positions[j].Top1
			sum += da * dp
			n++
			if a[j].Token != pb.Mode[j] || p[j].Token != pb.Mode[j] {
				break
			}
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// PersistWindow is how many previous judged cycles the sampled tier's
// persistence test multiplies the current cycle's deltas with (their mean
// delta at each position).
const PersistWindow = 4

// pathMargin multiplies the persistence the enrolment showed (P of
// Persistence): a numeric path the enrolment did not see is as far from
// the enrolment's mean as a seen one, or farther (for k seen paths of
// exchangeable offsets, (k+1)/(k-1) times the squared distance: 3 for 2).
const pathMargin = 3.0

// Persistence is the sampled tier's persistence test of one cycle against
// the previous ones (docs/DRIFT.md "The sampled tier's persistence test"):
// with x_j = d_j(now) x dbar_j, dbar_j the mean delta of the previous
// cycles (up to PersistWindow) at position j, over the positions aligned
// with the mode in the current cycle and at least one previous one,
//
//	T = (mean x - B - 3 sB - P) / (sd x / sqrt(n)),  Shift = sign sqrt(|mean x - B - P|)
//
// where B and sB are the baseline's own squared error and its spread (from
// the enrolment variance of each position, as in the teacher tier) and P
// is the persistence the enrolment itself showed beyond this cycle's noise:
// max(0, m_max - B - z se1) times pathMargin (z = sqrt(2 ln N), at least
// 3, for the N pairs of the null), m_max the largest leave-two-out
// product of the S4 null (pairs of enrolment cycles that shared a numeric
// path share offsets, and a later cycle on such a path shows them again).
// T is self-normalised: the noise of this cycle and of the previous ones
// is in both mean x and its standard error, so without a change T stays
// about N(0, 1) or below whatever the noise level of any of them, while a
// persistent shift delta adds about sqrt(n) delta^2 / (sd x).
type Persistence struct {
	T, Shift float64
	// Own and Path are B and P, in nats^2.
	Own, Path float64
	N         int
}

// SampledPersistence is the persistence test of cycle c after prevs
// (oldest first) against b; T and Shift are NaN without a previous cycle,
// with fewer than 8 common positions, or for a baseline stored without
// position variances (before the test existed: the CUSUM then runs on S4's
// z as it did).
func SampledPersistence(b *Baseline, c *Cycle, prevs []*Cycle) Persistence {
	ps := Persistence{T: math.NaN(), Shift: math.NaN()}
	if len(prevs) == 0 || !b.Logprobs || !c.hasLogprobs() {
		return ps
	}
	own, spread := baselineOwnError(b)
	ps.Own = own
	if own == 0 {
		return ps
	}
	var xs, x1s []float64 // against the mean of prevs, and the last one alone
	last := len(prevs) - 1
	for i := range b.Prompts {
		pb := &b.Prompts[i]
		a := c.Obs[i].Tokens
		live := make([]bool, len(prevs)) // still aligned with the mode
		for k, p := range prevs {
			live[k] = p.Obs[i].HasLogprobs
		}
		for j := range pb.Positions {
			if j >= len(a) {
				break
			}
			sum, n := 0.0, 0
			dl := math.NaN()
			for k, p := range prevs {
				if !live[k] {
					continue
				}
				pt := p.Obs[i].Tokens
				if j >= len(pt) {
					live[k] = false
					continue
				}
				d := lookup(&pt[j], pb.Mode[j]) - pb.Positions[j].Top1
				if k == last {
					dl = d
				}
				sum += d
				n++
				if pt[j].Token != pb.Mode[j] {
					live[k] = false
				}
			}
			if n == 0 {
				break
			}
			da := lookup(&a[j], pb.Mode[j]) - pb.Positions[j].Top1
			xs = append(xs, da*sum/float64(n))
			if !math.IsNaN(dl) {
				x1s = append(x1s, da*dl)
			}
			if a[j].Token != pb.Mode[j] {
				break
			}
		}
	}
	ps.N = len(xs)
	if len(xs) < 8 {
		return ps
	}
	mean, se := meanSE(xs)
	_, se1 := meanSE(x1s)
	if !(se > 0) {
		return ps
	}
	hi := math.Inf(-1)
	for _, v := range b.Null.S4.Values {
		hi = max(hi, v*math.Abs(v))
	}
	// the null's products are of pairs of cycles: their noise is that of
	// a pair (se1), not of the mean over the window
	if math.IsNaN(se1) {
		se1 = se
	}
	// the largest of N pairs' noise is about sqrt(2 ln N) of them: 3.1
	// for the 120 pairs of 16 enrolment cycles, 3.4 for the 300 of 25
	z := 3.0
	if n := len(b.Null.S4.Values); n > 1 {
		z = max(z, math.Sqrt(2*math.Log(float64(n))))
	}
	ps.Path = pathMargin * max(0, hi-own-z*se1)
	excess := mean - own - ps.Path
	ps.T = (excess - 3*spread) / se
	ps.Shift = signedSqrt(excess)
	return ps
}

// meanSE is the mean of xs and its standard error (NaN for fewer than 2).
func meanSE(xs []float64) (mean, se float64) {
	if len(xs) < 2 {
		return math.NaN(), math.NaN()
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
}
