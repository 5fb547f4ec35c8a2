package drift

import (
	"fmt"
	"sort"
)

// ToolPeerVerdict is the outcome of comparing the tool baselines of one
// pool: each backend's enrolment counts against the pooled counts of the
// others, with the tool tier's binomial test.
type ToolPeerVerdict struct {
	// Outlier is the backend whose tool calls are worse than the others'
	// (3 or more peers), or "".
	Outlier string
	// Candidate is the backend with the largest z against the others;
	// Stats its test.
	Candidate string
	Stats     ToolStats
	// Thresh is the z the rule needs (GrossZ).
	Thresh float64
	// PairDiffers is set with exactly 2 peers whose rates differ by the
	// rule, either way; neither is blamed.
	PairDiffers bool
	Pair        [2]string
	// Reason says what was found.
	Reason string
}

// CompareToolPeers compares the tool baselines of one pool's backends
// (keyed by backend id; only supported tool baselines of the same suite
// count). With 3 or more, the backend whose rates, tested against the
// pooled counts of the others, are lower by at least PeerPoints with z >=
// GrossZ is the outlier; with 2, the pair differs when either is worse
// than the other by that rule.
func CompareToolPeers(baselines map[string]*Baseline, p Params) ToolPeerVerdict {
	p = p.WithDefaults()
	tp := p.Tools
	var ids []string
	for id, b := range baselines {
		if b != nil && b.Tools != nil && b.Tools.Supported {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	v := ToolPeerVerdict{Thresh: tp.GrossZ}
	if len(ids) < 2 {
		return v
	}
	hash := baselines[ids[0]].SuiteHash
	for _, id := range ids {
		if baselines[id].SuiteHash != hash {
			return v
		}
	}
	best := -1.0
	for _, id := range ids {
		var others ToolCounts
		for _, o := range ids {
			if o != id {
				others.add(baselines[o].Tools.Counts)
			}
		}
		st := compareCounts(others, baselines[id].Tools.Counts, tp)
		if st.Z > best {
			best, v.Candidate, v.Stats = st.Z, id, st
		}
	}
	flagged := v.Stats.Fall >= tp.PeerPoints && v.Stats.Z >= tp.GrossZ
	switch {
	case !flagged:
		v.Reason = "tool calls in line with the peers"
	case len(ids) == 2:
		v.PairDiffers, v.Pair = true, [2]string{ids[0], ids[1]}
		v.Reason = fmt.Sprintf("the tool calls of %s and %s differ at enrolment (%s); with two peers neither is blamed",
			ids[0], ids[1], v.Stats.summary())
	default:
		v.Outlier = v.Candidate
		v.Reason = fmt.Sprintf("tool-call outlier among %d peers at enrolment: %s against the others' pooled rates (needs %.0f points lower with z >= %.2f)",
			len(ids), v.Stats.summary(), 100*tp.PeerPoints, tp.GrossZ)
	}
	return v
}
