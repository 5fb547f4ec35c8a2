package drift

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// BaselineVersion is the version of the stored baseline format.
const BaselineVersion = 1

// Baseline is what a backend is compared with: per prompt, the modal greedy
// sequence and the mean top-k logprobs along it, plus the leave-one-out null
// distribution of each statistic.
type Baseline struct {
	V         int              `json:"v"`
	Pool      string           `json:"pool"`
	Backend   string           `json:"backend"`
	Suite     string           `json:"suite"`
	SuiteHash string           `json:"suite_hash"`
	Created   time.Time        `json:"created"`
	From      time.Time        `json:"from"` // first enrolment cycle
	To        time.Time        `json:"to"`   // last enrolment cycle
	Cycles    int              `json:"cycles"`
	Logprobs  bool             `json:"logprobs"`
	Prompts   []PromptBaseline `json:"prompts"`
	Null      NullModel        `json:"null"`
	Identity  Identity         `json:"identity"`
	Reason    string           `json:"reason,omitempty"`
	// Teacher is the teacher-forced tier (teacher_monitor.go): a baseline
	// over the suite's fixed texts, nil when the backend did not score
	// them at enrolment.
	Teacher *Baseline `json:"teacher,omitempty"`
	// Tools is the tool-call baseline (nil without tool probes).
	Tools *ToolBaseline `json:"tools,omitempty"`
}

// PromptBaseline is the baseline of one prompt.
type PromptBaseline struct {
	ID        string             `json:"id"`
	Kind      string             `json:"kind"`
	Mode      []string           `json:"mode"`       // modal greedy token sequence
	ModeShare float64            `json:"mode_share"` // share of cycles that produced it
	Positions []PositionBaseline `json:"positions"`  // one per Mode token (logprob backends)
	Samples   [][]string         `json:"samples"`    // every enrolment sequence, for the MMD test
}

// PositionBaseline is the mean logprob picture at one position of the modal
// sequence, over the enrolment cycles whose prefix matched the mode there.
type PositionBaseline struct {
	Top1  float64 `json:"top1"`  // mean logprob of Mode[j]
	Alts  []Alt   `json:"alts"`  // mean logprob of every token seen in the top-k, most likely first
	Floor float64 `json:"floor"` // mean lowest top-k logprob
	N     int     `json:"n"`     // aligned cycles
	// Var is the sample variance of the top-1 logprob over those cycles:
	// the baseline's own error, which the persistence tests subtract
	// (sampled tier: sampledPersistence; teacher tier: teacher_monitor.go).
	// Zero in baselines stored before the sampled tier used it.
	Var float64 `json:"var,omitempty"`
}

// NullStat is the null distribution of one statistic: the leave-one-out
// values, their median Mu and robust scale Sigma = max(1.4826 x MAD, floor).
type NullStat struct {
	Mu     float64   `json:"mu"`
	Sigma  float64   `json:"sigma"`
	Values []float64 `json:"values"`
}

// Z standardises s; NaN when there is no null (Sigma 0).
func (n NullStat) Z(s float64) float64 {
	if n.Sigma == 0 {
		return math.NaN()
	}
	return (s - n.Mu) / n.Sigma
}

// NullModel holds the null distribution of every statistic.
type NullModel struct {
	S1 NullStat `json:"s1"`
	S2 NullStat `json:"s2"`
	S3 NullStat `json:"s3"`
	// S4 is the null of the persistent delta, from every pair of
	// enrolment cycles compared with the profile of the others (leave two
	// out).
	S4 NullStat `json:"s4"`
}

// Marshal encodes b for a baseline store (probes.Store).
func (b *Baseline) Marshal() ([]byte, error) { return json.Marshal(b) }

// UnmarshalBaseline decodes a stored baseline.
func UnmarshalBaseline(data []byte) (*Baseline, error) {
	var b Baseline
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("probes: decode baseline: %w", err)
	}
	if b.V != BaselineVersion {
		return nil, fmt.Errorf("probes: baseline version %d, want %d", b.V, BaselineVersion)
	}
	return &b, nil
}

// buildProfile computes the per-prompt modes and mean logprobs of cycles,
// without the null model. Cycles must all be of suite s.
func buildProfile(s *Suite, cycles []*Cycle, logprobs bool) []PromptBaseline {
	out := make([]PromptBaseline, len(s.Prompts))
	for i, p := range s.Prompts {
		pb := PromptBaseline{ID: p.ID, Kind: p.Kind}
		counts := map[string]int{}
		var first []string // key -> the first cycle order, for a deterministic mode
		seqs := make([][]string, len(cycles))
		for c, cy := range cycles {
			seqs[c] = cy.Obs[i].Sequence()
			k := strings.Join(seqs[c], "\x00")
			if counts[k] == 0 {
				first = append(first, k)
			}
			counts[k]++
		}
		best := first[0]
		for _, k := range first {
			if counts[k] > counts[best] {
				best = k
			}
		}
		for _, seq := range seqs {
			if strings.Join(seq, "\x00") == best {
				pb.Mode = seq
				break
			}
		}
		pb.ModeShare = float64(counts[best]) / float64(len(cycles))
		pb.Samples = seqs
		if logprobs {
			pb.Positions = positionMeans(pb.Mode, cycles, i)
		}
		out[i] = pb
	}
	return out
}

// positionMeans averages, position by position along mode, the logprobs of
// the cycles still aligned with it (same prefix so far).
func positionMeans(mode []string, cycles []*Cycle, prompt int) []PositionBaseline {
	pos := make([]PositionBaseline, len(mode))
	// sums holds each token shown at the position so far with the sum of
	// its logprobs, in the order first seen; seen marks those this cycle
	// showed. A few dozen tokens at most: slices, not maps (this is most of
	// an enrolment's time).
	var sums []Alt
	var seen []bool
	for j := range mode {
		sums = sums[:0]
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
			seen = append(seen[:0], make([]bool, len(sums))...)
			mark := func(tok string, v float64) {
				i := slices.IndexFunc(sums, func(a Alt) bool { return a.Token == tok })
				if i < 0 {
					sums, seen = append(sums, Alt{Token: tok}), append(seen, false)
					i = len(sums) - 1
				}
				if !seen[i] {
					seen[i] = true
					sums[i].Logprob += v
				}
			}
			mark(t.Token, t.Logprob)
			for _, a := range t.Top {
				mark(a.Token, a.Logprob)
			}
			// a token shown in other cycles but not this one counts at
			// this cycle's floor
			for i := range sums {
				if !seen[i] {
					sums[i].Logprob += fl
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
		pb.Alts = make([]Alt, len(sums))
		for i, a := range sums {
			pb.Alts[i] = Alt{Token: a.Token, Logprob: a.Logprob / float64(n)}
		}
		slices.SortFunc(pb.Alts, func(a, b Alt) int {
			return cmp.Or(cmp.Compare(b.Logprob, a.Logprob), strings.Compare(a.Token, b.Token))
		})
		pb.Alts = pb.Alts[:min(len(pb.Alts), 8)]
		pos[j] = pb
	}
	return pos
}

// aligned reports whether toks[:j] equals mode[:j].
func aligned(toks []Token, mode []string, j int) bool {
	for k := 0; k < j; k++ {
		if toks[k].Token != mode[k] {
			return false
		}
	}
	return true
}

// BuildBaseline enrols a backend from its enrolment cycles (at least 3):
// the profile from all of them and the null model by leave-one-out, every
// cycle compared with the profile of the others. sigmaFloor floors each
// statistic's scale (docs/DRIFT.md: 0.002 nats).
func BuildBaseline(s *Suite, cycles []*Cycle, sigmaFloor float64) (*Baseline, error) {
	if len(cycles) < 3 {
		return nil, fmt.Errorf("probes: enrolment needs at least 3 cycles, have %d", len(cycles))
	}
	logprobs := true
	for _, c := range cycles {
		if len(c.Obs) != len(s.Prompts) {
			return nil, fmt.Errorf("probes: cycle has %d observations, suite %q has %d prompts", len(c.Obs), s.Name, len(s.Prompts))
		}
		logprobs = logprobs && c.hasLogprobs()
	}
	b := &Baseline{
		V: BaselineVersion, Suite: s.Name, SuiteHash: s.Hash,
		From: cycles[0].At, To: cycles[len(cycles)-1].At, Cycles: len(cycles),
		Logprobs: logprobs, Prompts: buildProfile(s, cycles, logprobs),
		Identity: cycles[len(cycles)-1].Identity,
		Tools:    buildToolBaseline(s, cycles),
	}
	var s1, s2, s3 []float64
	rest := make([]*Cycle, 0, len(cycles)-1)
	for i := range cycles {
		rest = append(rest[:0], cycles[:i]...)
		rest = append(rest, cycles[i+1:]...)
		loo := &Baseline{Logprobs: logprobs, Prompts: buildProfile(s, rest, logprobs)}
		st := Measure(loo, cycles[i])
		s1 = append(s1, st.S1)
		s2 = append(s2, st.S2)
		s3 = append(s3, st.S3)
	}
	// S4 compares two cycles: every pair of enrolment cycles against the
	// profile of the others (leave two out); with 8 cycles, 28 values
	var s4 []float64
	if logprobs && len(cycles) >= 4 {
		for i := range cycles {
			for j := i + 1; j < len(cycles); j++ {
				rest = rest[:0]
				for k, c := range cycles {
					if k != i && k != j {
						rest = append(rest, c)
					}
				}
				lto := &Baseline{Logprobs: true, Prompts: buildProfile(s, rest, true)}
				// the baseline's own squared error shrinks as 1/cycles:
				// scale to what the full baseline will show
				m := persistentProduct(lto, cycles[j], cycles[i]) * float64(len(rest)) / float64(len(cycles))
				s4 = append(s4, signedSqrt(m))
			}
		}
	}
	b.Null = NullModel{
		S1: nullStat(s1, sigmaFloor),
		S2: nullStat(s2, sigmaFloor),
		S3: nullStat(s3, sigmaFloor),
		S4: nullStat(s4, sigmaFloor),
	}
	return b, nil
}

// nullStat summarises the null values; NaN values (a statistic that could
// not be measured) are dropped, and with none left the NullStat is zero,
// which Z reports as NaN.
func nullStat(all []float64, floor float64) NullStat {
	var values []float64
	for _, v := range all {
		if !math.IsNaN(v) {
			values = append(values, v)
		}
	}
	if len(values) == 0 {
		return NullStat{}
	}
	mu := median(values)
	dev := make([]float64, len(values))
	for i, v := range values {
		dev[i] = abs(v - mu)
	}
	return NullStat{Mu: mu, Sigma: max(1.4826*median(dev), floor), Values: values}
}
