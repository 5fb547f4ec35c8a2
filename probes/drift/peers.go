package drift

import (
	"sort"
)

// PeerDistance is the distance between two baselines of the same suite: the
// mean over prompts of |lp_a - lp_b| of a's top-1 token along a's modal
// sequence up to the first divergence, symmetrised. Without logprobs on
// either side it is NaN.
func PeerDistance(a, b *Baseline) float64 {
	return (oneWay(a, b) + oneWay(b, a)) / 2
}

func oneWay(a, b *Baseline) float64 {
	sum, n := 0.0, 0
	for i := range min(len(a.Prompts), len(b.Prompts)) {
		pa, pb := &a.Prompts[i], &b.Prompts[i]
		for j := range min(len(pa.Positions), len(pb.Positions)) {
			other := pb.Positions[j].Floor
			if pb.Mode[j] == pa.Mode[j] {
				other = pb.Positions[j].Top1
			} else {
				for _, alt := range pb.Positions[j].Alts {
					if alt.Token == pa.Mode[j] {
						other = alt.Logprob
						break
					}
				}
			}
			sum += abs(pa.Positions[j].Top1 - other)
			n++
			if pb.Mode[j] != pa.Mode[j] {
				break
			}
		}
	}
	if n == 0 {
		return nan()
	}
	return sum / float64(n)
}

// PeerVerdict is the outcome of comparing the baselines of one pool.
type PeerVerdict struct {
	// Outlier is the backend that differs from the others (3 or more
	// peers), or "".
	Outlier string
	// Candidate is the backend with the largest median distance to the
	// others (3 or more peers), named Outlier only when the rule holds.
	Candidate string
	// OutlierDistance is the candidate's median distance to the others;
	// OthersDistance the median pairwise distance among the others.
	OutlierDistance, OthersDistance float64
	// PairDiffers is set with exactly 2 peers whose distance is at least
	// PeerMinNats; neither is blamed.
	PairDiffers bool
	Pair        [2]string
	// Distances holds every pairwise distance, keyed "a|b" with a < b.
	Distances map[string]float64
}

// ComparePeers compares the baselines of one pool's backends (keyed by
// backend id; only logprob baselines of the same suite count). With 3 or
// more it names the outlier whose median distance to the others is >=
// PeerMinNats and >= PeerRatio x the others' median pairwise distance; with
// 2 it reports that the pair differs.
func ComparePeers(baselines map[string]*Baseline, p Params) PeerVerdict {
	p = p.WithDefaults()
	var ids []string
	for id, b := range baselines {
		if b != nil && b.Logprobs {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	v := PeerVerdict{Distances: map[string]float64{}}
	dist := func(a, b string) float64 {
		if a > b {
			a, b = b, a
		}
		return v.Distances[a+"|"+b]
	}
	for i, a := range ids {
		for _, b := range ids[i+1:] {
			if baselines[a].SuiteHash != baselines[b].SuiteHash {
				continue
			}
			v.Distances[a+"|"+b] = PeerDistance(baselines[a], baselines[b])
		}
	}
	switch {
	case len(ids) == 2:
		if d := dist(ids[0], ids[1]); d >= p.PeerMinNats {
			v.PairDiffers, v.Pair = true, [2]string{ids[0], ids[1]}
		}
	case len(ids) >= 3:
		best, bestMed := "", -1.0
		for _, a := range ids {
			var ds []float64
			for _, b := range ids {
				if a != b {
					ds = append(ds, dist(a, b))
				}
			}
			if m := median(ds); m > bestMed {
				best, bestMed = a, m
			}
		}
		var others []float64
		for i, a := range ids {
			for _, b := range ids[i+1:] {
				if a != best && b != best {
					others = append(others, dist(a, b))
				}
			}
		}
		om := median(others)
		v.Candidate, v.OutlierDistance, v.OthersDistance = best, bestMed, om
		if bestMed >= p.PeerMinNats && bestMed >= p.PeerRatio*om {
			v.Outlier = best
		}
	}
	return v
}
