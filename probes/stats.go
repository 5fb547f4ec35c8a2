package probes

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
	// (PersistentDelta); NaN on the first cycle or without logprobs.
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

// PersistentDelta is S4, the part of the aligned top-1 delta that persists
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
func PersistentDelta(b *Baseline, c, prev *Cycle) float64 {
	return signedSqrt(persistentProduct(b, c, prev))
}

func signedSqrt(m float64) float64 { return math.Copysign(math.Sqrt(math.Abs(m)), m) }

// persistentProduct is the m of PersistentDelta, in nats^2.
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
