package toylm

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// ReportSettings configure WriteReport. The zero value is the run of
// docs/DRIFT.md with seed 0.
type ReportSettings struct {
	// Cycles is the number of null cycles per noise level, split over
	// Backends independent enrolments. If zero, 2000 is used.
	Cycles int
	// Backends is the number of independent enrolments. If zero, 20.
	Backends int
	// Trials is the number of trials per variant and noise level for
	// power and delay. If zero, 50.
	Trials int
	// MaxDelay is the number of cycles a power trial waits for detection.
	// If zero, 10.
	MaxDelay int
	// PeerTrials is the number of trials of the three-peer outlier test
	// per noise level. If zero, 20.
	PeerTrials int
	// Seed seeds every run.
	Seed uint64
	// Enrol is the minimum number of enrolment cycles (probes.enrol). If
	// zero, 8.
	Enrol int
	// EnrolMin is the minimum enrolment span (probes.enrol_min). If zero,
	// there is none.
	EnrolMin time.Duration
	// Interval is the time between cycles (the probe schedule). If zero,
	// 5 minutes.
	Interval time.Duration
	// Workers is how many null backends run at once (Harness.Workers). If
	// zero, 1.
	Workers int
	// Tier is what the monitors judge (TierNames): the sampled probes
	// alone, the teacher-forced scores for subtle changes, or both. If
	// empty, "teacher", serve's default.
	Tier string
	// Noise is the noise model (NoiseModels): "independent" (the default)
	// measures NoiseLevels and LoadRegime, "correlated" adds
	// CorrelatedNoise.
	Noise string
	// LegacyS4 judges the sampled tier as before its persistence test
	// (Harness.LegacyS4), for comparison.
	LegacyS4 bool
}

func (s ReportSettings) withDefaults() ReportSettings {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&s.Cycles, 2000)
	def(&s.Backends, 20)
	def(&s.Trials, 50)
	def(&s.MaxDelay, 10)
	def(&s.PeerTrials, 20)
	def(&s.Enrol, 8)
	if s.Interval == 0 {
		s.Interval = 5 * time.Minute
	}
	return s
}

// harness is the Harness of s (defaults applied), over the default suite,
// judging s.Tier with s.Workers null backends at once.
func (s ReportSettings) harness() (*Harness, error) {
	suite, err := drift.LoadSuite("")
	if err != nil {
		return nil, err
	}
	mode, err := TierMode(s.Tier)
	if err != nil {
		return nil, err
	}
	h := &Harness{Suite: suite, Enrol: s.Enrol, EnrolMin: s.EnrolMin, Interval: s.Interval, Ref: New(Config{}),
		Teacher: mode, Workers: s.Workers, LegacyS4: s.LegacyS4}
	if s.EnrolMin == 0 {
		h.EnrolMin = -1
	}
	return h, nil
}

// WriteReport runs the drift harness of docs/DRIFT.md (`fleetwatch drift
// sim`) over the default suite and writes its Markdown report to w: the
// variants' calibration, the null rates (false alarms), power and delay of
// detection, and the peers' outlier test. It stops with ctx's error
// between two table rows.
func WriteReport(ctx context.Context, w io.Writer, s ReportSettings) error {
	s = s.withDefaults()
	h, err := s.harness()
	if err != nil {
		return err
	}
	suite, ref := h.Suite, h.Ref
	variants := Variants(ref)
	fmt.Fprintf(w, "# fleetwatch drift sim (seed %d, suite %s, tier %s; a cycle every %v, enrolment of at least %d cycles over at least %v, the newest %d kept)\n\n",
		s.Seed, suite.Name, cmp.Or(s.Tier, "teacher"), s.Interval, s.Enrol, s.EnrolMin, 2*s.Enrol)
	fmt.Fprintln(w, "Calibration (measured KL against the reference, nats/token; greedy top-1 agreement):")
	for _, v := range variants {
		if m, ok := variantModel(v, ref); ok {
			fmt.Fprintf(w, "- %s: KL %.5f, top-1 agreement %.3f\n", v.Name, MeasureKL(ref, m), Top1Agreement(ref, m))
		}
	}
	levels, err := Levels(s.Noise)
	if err != nil {
		return err
	}
	var fp16 Variant
	for _, v := range variants {
		if v.Name == "fp16" {
			fp16 = v
		}
	}
	fmt.Fprintln(w, "\n## Null (unchanged backend, and fp16 rounding)")
	fmt.Fprintln(w, "\n| sigma | served | cycles | gross signals | rate (95% CP) | alarms (left ok) | rate (95% CP) | drifted |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	per := s.Cycles / s.Backends
	for _, sigma := range levels {
		for _, v := range []*Variant{nil, &fp16} {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Null(sigma, v, s.Backends, per, s.Seed)
			if err != nil {
				return err
			}
			name := "reference"
			if v != nil {
				name = v.Name
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %d | %s | %d |\n", SigmaName(sigma), name, r.Cycles,
				r.Gross, rateCP(r.Gross, r.Cycles), r.Alarms, rateCP(r.Alarms, r.Cycles), r.Drifted)
		}
	}
	fmt.Fprintf(w, "\n## Power and delay (%d trials per cell; change point right after enrolment)\n", s.Trials)
	fmt.Fprintf(w, "\n| variant | sigma | left ok in 1 cycle (95%% CP) | within 3 | within %d | drifted within %d | median cycles to alarm | median cycles to drifted |\n", s.MaxDelay, s.MaxDelay)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, v := range variants {
		for _, sigma := range levels {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Power(v, sigma, s.Trials, s.MaxDelay, s.Seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", v.Name, SigmaName(sigma),
				propCP(r.Within(1), r.Trials), propCP(r.Within(3), r.Trials), propCP(r.Within(s.MaxDelay), r.Trials),
				propCP(r.DriftedWithin(s.MaxDelay), r.Trials), medianDelay(r.SuspectDelay), medianDelay(r.DriftedDelay))
		}
	}
	fmt.Fprintf(w, "\n## Peers (3 backends, the last one serving the variant from the start; %d trials)\n", s.PeerTrials)
	fmt.Fprintln(w, "\n| variant | sigma | outlier named (95% CP) | wrong backend named | median distance of the farthest backend | median distance among the others |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, v := range variants {
		if v.Name == "swap" || v.Name == "partial-q4-50%" {
			continue
		}
		for _, sigma := range levels {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Peers(v, sigma, 3, s.PeerTrials, s.Seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "| %s | %s | %s | %d | %.4f | %.4f |\n", v.Name, SigmaName(sigma), propCP(r.Named, r.Trials),
				r.WrongName, medianOf(r.Distances), medianOf(r.OthersDistances))
		}
	}
	return WriteToolReport(ctx, w, s) // tool.go
}

// variantModel returns the single model behind a plain variant.
func variantModel(v Variant, ref *Model) (*Model, bool) {
	c, models := v.Build(ref, Options{})
	if len(models) != 1 {
		return nil, false
	}
	m, ok := c.(*Model)
	return m, ok
}

// rateCP formats k/n as a rate with its 95% Clopper-Pearson interval.
func rateCP(k, n int) string {
	lo, hi := drift.ClopperPearson(k, n, 0.05)
	return fmt.Sprintf("%.2g [%.2g, %.2g]", float64(k)/float64(n), lo, hi)
}

// propCP formats k of n with its 95% Clopper-Pearson interval.
func propCP(k, n int) string {
	lo, hi := drift.ClopperPearson(k, n, 0.05)
	return fmt.Sprintf("%d/%d [%.2f, %.2f]", k, n, lo, hi)
}

// medianDelay is the median of the detection delays, counting misses as
// infinite.
func medianDelay(d []int) string {
	s := make([]int, len(d))
	for i, v := range d {
		if v == 0 {
			v = 1 << 30
		}
		s[i] = v
	}
	slices.Sort(s)
	m := s[(len(s)-1)/2]
	if m == 1<<30 {
		return "not detected"
	}
	return fmt.Sprint(m)
}

func medianOf(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// Targets of the false-alarm table (the shared DRIFT.md): gross signals at
// most 1e-3 per cycle, CUSUM alarms at most 1 per 10,000 cycles.
const (
	GrossTarget = 1e-3
	CUSUMTarget = 1e-4
)

// WriteFalseAlarms runs only the null part of the harness (`fleetwatch drift
// sim --null-only`): s.Cycles unchanged cycles of the reference at every
// noise level and under the load regime, split over s.Backends independent
// enrolments of which s.Workers run at once. It writes a Markdown table of
// the gross signals, CUSUM suspects (ok -> suspect), all alarms (left ok)
// and confirmed drifts, each with its rate and exact one-sided 95% upper
// bound (UpperBound95), and says for each bound whether it is within the
// target. It stops with ctx's error between two noise levels.
func WriteFalseAlarms(ctx context.Context, w io.Writer, s ReportSettings) error {
	s = s.withDefaults()
	h, err := s.harness()
	if err != nil {
		return err
	}
	levels, err := Levels(s.Noise)
	if err != nil {
		return err
	}
	per := s.Cycles / s.Backends
	legacy := ""
	if s.LegacyS4 {
		legacy = ", sampled tier on S4's z as before its persistence test"
	}
	fmt.Fprintf(w, "# fleetwatch drift sim --null-only (seed %d, suite %s, tier %s%s; a cycle every %v, enrolment of at least %d cycles over at least %v; %d backends of %d judged cycles per level, %d at once)\n\n",
		s.Seed, h.Suite.Name, cmp.Or(s.Tier, "teacher"), legacy, s.Interval, s.Enrol, s.EnrolMin, s.Backends, per, max(s.Workers, 1))
	fmt.Fprintln(w, "Rates per judged cycle; brackets: exact one-sided 95% Clopper-Pearson upper bound.")
	fmt.Fprintln(w, "\n| sigma | cycles | gross signals | CUSUM suspects (ok -> suspect) | alarms (left ok) | drifted | gross vs 1e-3 | alarms vs 1e-4 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	var total NullResult
	row := func(name string, r NullResult) {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, r.Cycles,
			countUB(r.Gross, r.Cycles), countUB(r.Suspects, r.Cycles), countUB(r.Alarms, r.Cycles), countUB(r.Drifted, r.Cycles),
			verdict(r.Gross, r.Cycles, GrossTarget), verdict(r.Alarms, r.Cycles, CUSUMTarget))
	}
	for _, sigma := range levels {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := h.Null(sigma, nil, s.Backends, per, s.Seed)
		if err != nil {
			return err
		}
		total.add(r)
		row(SigmaName(sigma), r)
	}
	row("all levels", total)
	return nil
}

// countUB formats k events in n cycles as "k (rate <= bound)".
func countUB(k, n int) string {
	return fmt.Sprintf("%d (%.3g <= %.3g)", k, float64(k)/float64(n), UpperBound95(k, n))
}

// verdict says whether the 95% upper bound of k in n is within target, and
// if not by what factor it exceeds it.
func verdict(k, n int, target float64) string {
	ub := UpperBound95(k, n)
	if ub <= target {
		return "within"
	}
	return fmt.Sprintf("above: %.3g, %.1fx the target", ub, ub/target)
}

// UpperBound95 is the exact one-sided 95% Clopper-Pearson upper bound of
// a rate of which k events were seen in n trials: the p at which seeing k
// or fewer has probability 0.05, which is the upper end of the two-sided
// 90% interval. For k = 0 it is 1 - 0.05^(1/n), about 3/n (1.0e-4 for
// 30,000 cycles); for k >= n, or n <= 0, it is 1.
func UpperBound95(k, n int) float64 {
	_, hi := drift.ClopperPearson(k, n, 0.10)
	return hi
}
