package drift

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
)

// positionMeansMaps is positionMeans as it was written with maps, the
// reference the slice version must match bit for bit.
func positionMeansMaps(mode []string, cycles []*Cycle, prompt int) []PositionBaseline {
	pos := make([]PositionBaseline, len(mode))
	for j := range mode {
		sums := map[string]float64{}
		var top1, top1sq, floor float64
		n := 0
		for _, cy := range cycles {
			toks := cy.Obs[prompt].Tokens
			if len(toks) <= j || !aligned(toks, mode, j) {
				continue
			}
			t := &toks[j]
			n++
			lp := lookup(t, mode[j])
			top1 += lp
			top1sq += lp * lp
			fl := floorOf(t)
			floor += fl
			seen := map[string]bool{t.Token: true}
			sums[t.Token] += t.Logprob
			for _, a := range t.Top {
				if !seen[a.Token] {
					seen[a.Token] = true
					sums[a.Token] += a.Logprob
				}
			}
			// a token shown in other cycles but not this one counts at
			// this cycle's floor
			for tok := range sums {
				if !seen[tok] {
					sums[tok] += fl
				}
			}
		}
		if n == 0 {
			pos = pos[:j]
			break
		}
		pb := PositionBaseline{Top1: top1 / float64(n), Floor: floor / float64(n), N: n}
		if n > 1 {
			pb.Var = max(0, (top1sq-top1*top1/float64(n))/float64(n-1))
		}
		for tok, sum := range sums {
			pb.Alts = append(pb.Alts, Alt{Token: tok, Logprob: sum / float64(n)})
		}
		slices.SortFunc(pb.Alts, func(a, b Alt) int {
			return cmp.Or(cmp.Compare(b.Logprob, a.Logprob), strings.Compare(a.Token, b.Token))
		})
		pb.Alts = pb.Alts[:min(len(pb.Alts), 8)]
		pos[j] = pb
	}
	return pos
}

// TestPositionMeansMatchesMaps: on random cycles (tokens repeated across
// positions and cycles, alternatives that repeat the sampled token,
// cycles that leave the mode), the slice version gives exactly what the
// map version gave.
func TestPositionMeansMatchesMaps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vocab := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}
	for trial := range 200 {
		nPos := 1 + r.IntN(8)
		mode := make([]string, nPos)
		for j := range mode {
			mode[j] = vocab[r.IntN(4)]
		}
		var cycles []*Cycle
		for range 2 + r.IntN(12) {
			var toks []Token
			for j := range nPos - r.IntN(2) {
				tok := mode[j]
				if r.IntN(6) == 0 {
					tok = vocab[r.IntN(len(vocab))]
				}
				tk := Token{Token: tok, Logprob: -r.Float64() * 3}
				for range r.IntN(6) {
					tk.Top = append(tk.Top, Alt{Token: vocab[r.IntN(len(vocab))], Logprob: -r.Float64() * 5})
				}
				toks = append(toks, tk)
			}
			cycles = append(cycles, &Cycle{Obs: []Observation{{Tokens: toks}}})
		}
		got, want := positionMeans(mode, cycles, 0), positionMeansMaps(mode, cycles, 0)
		if diff := gocmp.Diff(want, got); diff != "" {
			t.Fatalf("trial %d (-maps +slices):\n%s", trial, diff)
		}
	}
}
