package drift

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Sample is one completion of one prompt, for the two-sample test.
type Sample struct {
	Prompt int      // index in the suite
	Seq    []string // generated tokens
}

// hamming is the Hamming string kernel of Model Equality Testing: the share
// of positions (up to the longer length) where both sequences hold the same
// token. Samples of different prompts have kernel 0.
func hamming(a, b Sample) float64 {
	if a.Prompt != b.Prompt {
		return 0
	}
	n := max(len(a.Seq), len(b.Seq))
	if n == 0 {
		return 1
	}
	same := 0
	for i := range min(len(a.Seq), len(b.Seq)) {
		if a.Seq[i] == b.Seq[i] {
			same++
		}
	}
	return float64(same) / float64(n)
}

// mmd2 is the unbiased estimate of MMD^2 between the samples labelled true
// and false in inY, from the full kernel matrix k.
func mmd2(k [][]float64, inY []bool) float64 {
	var sxx, syy, sxy float64
	var nx, ny int
	for i := range inY {
		if inY[i] {
			ny++
		} else {
			nx++
		}
	}
	if nx < 2 || ny < 2 {
		return 0
	}
	for i := range k {
		for j := range k {
			if i == j {
				continue
			}
			switch {
			case !inY[i] && !inY[j]:
				sxx += k[i][j]
			case inY[i] && inY[j]:
				syy += k[i][j]
			case !inY[i]:
				sxy += k[i][j]
			}
		}
	}
	return sxx/float64(nx*(nx-1)) + syy/float64(ny*(ny-1)) - 2*sxy/float64(nx*ny)
}

// mmdTest is the two-sample test of Model Equality Testing (Gao, Liang,
// Guestrin, ICLR 2025): the unbiased MMD^2 with the Hamming kernel between
// x (the enrolment sample) and y (recent completions), and its permutation
// p-value (1 + #{perm >= observed}) / (1 + permutations). Labels are
// permuted within each prompt, so both sides keep their prompt mix. The
// permutations are drawn from seed.
func mmdTest(x, y []Sample, permutations int, seed uint64) (stat, p float64) {
	all := append(slices.Clone(x), y...)
	k := make([][]float64, len(all))
	for i := range all {
		k[i] = make([]float64, len(all))
		for j := range all {
			k[i][j] = hamming(all[i], all[j])
		}
	}
	inY := make([]bool, len(all))
	for i := len(x); i < len(all); i++ {
		inY[i] = true
	}
	stat = mmd2(k, inY)
	byPrompt := map[int][]int{}
	for i, s := range all {
		byPrompt[s.Prompt] = append(byPrompt[s.Prompt], i)
	}
	groups := make([][]int, 0, len(byPrompt))
	for _, g := range byPrompt {
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	r := rand.New(rand.NewPCG(seed, 0x33d))
	perm := slices.Clone(inY)
	exceed := 0
	for range permutations {
		for _, g := range groups {
			for i := len(g) - 1; i > 0; i-- {
				j := r.IntN(i + 1)
				perm[g[i]], perm[g[j]] = perm[g[j]], perm[g[i]]
			}
		}
		if mmd2(k, perm) >= stat-1e-12 {
			exceed++
		}
	}
	return stat, float64(1+exceed) / float64(1+permutations)
}

// BenjaminiHochberg returns which of the p-values are rejected at false
// discovery rate q (Benjamini and Hochberg, 1995): with p sorted ascending,
// reject the k smallest for the largest k with p_(k) <= k q / m. NaN
// p-values are never rejected and do not count in m.
func BenjaminiHochberg(p []float64, q float64) []bool {
	idx := make([]int, 0, len(p))
	for i, v := range p {
		if !math.IsNaN(v) {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case p[a] < p[b]:
			return -1
		case p[a] > p[b]:
			return 1
		}
		return 0
	})
	m := float64(len(idx))
	last := -1
	for k, i := range idx {
		if p[i] <= float64(k+1)*q/m {
			last = k
		}
	}
	out := make([]bool, len(p))
	for k := 0; k <= last; k++ {
		out[idx[k]] = true
	}
	return out
}

// ClopperPearson is the exact two-sided 1-alpha confidence interval of a
// binomial proportion with k successes in n trials (Clopper and Pearson,
// 1934): the alpha/2 and 1-alpha/2 quantiles of Beta(k, n-k+1) and
// Beta(k+1, n-k).
func ClopperPearson(k, n int, alpha float64) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	if k > 0 {
		lo = betaQuantile(alpha/2, float64(k), float64(n-k+1))
	}
	hi = 1
	if k < n {
		hi = betaQuantile(1-alpha/2, float64(k+1), float64(n-k))
	}
	return lo, hi
}

// betaQuantile inverts the regularised incomplete beta function by bisection.
func betaQuantile(p, a, b float64) float64 {
	lo, hi := 0.0, 1.0
	for range 100 {
		mid := (lo + hi) / 2
		if regIncBeta(mid, a, b) < p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// regIncBeta is I_x(a, b), by the continued fraction of Numerical Recipes
// (betacf) with the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) for convergence.
func regIncBeta(x, a, b float64) float64 {
	switch {
	case x <= 0:
		return 0
	case x >= 1:
		return 1
	}
	la, _ := math.Lgamma(a + b)
	lb, _ := math.Lgamma(a)
	lc, _ := math.Lgamma(b)
	front := math.Exp(la - lb - lc + a*math.Log(x) + b*math.Log1p(-x))
	if x < (a+1)/(a+b+2) {
		return front * betaCF(x, a, b) / a
	}
	return 1 - front*betaCF(1-x, b, a)/b
}

func betaCF(x, a, b float64) float64 {
	const tiny = 1e-300
	qab, qap, qam := a+b, a+1, a-1
	c, d := 1.0, 1-qab*x/qap
	if math.Abs(d) < tiny {
		d = tiny
	}
	d = 1 / d
	h := d
	for m := 1; m <= 300; m++ {
		fm := float64(m)
		aa := fm * (b - fm) * x / ((qam + 2*fm) * (a + 2*fm))
		d = 1 + aa*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + aa/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		h *= d * c
		aa = -(a + fm) * (qab + fm) * x / ((a + 2*fm) * (qap + 2*fm))
		d = 1 + aa*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + aa/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 3e-14 {
			break
		}
	}
	return h
}
