package drift

import (
	"fmt"
	"math"
	"strings"
)

// ToolParams are the tool tier's thresholds (docs/DRIFT.md "Tool-call
// probes"). The zero value of every field selects its default; every
// change re-runs `fleetwatch drift sim --tools-only`.
type ToolParams struct {
	// GrossPoints and GrossZ: a gross change fires at once when a rate
	// fell by at least GrossPoints from the baseline's and the binomial
	// test's z is at least GrossZ. If zero, 0.2 (20 points) and 3.72
	// (p 0.0001).
	GrossPoints, GrossZ float64
	// CUSUMThreshold is h of the tool tier's CUSUM (same cap and slack as
	// the logprob tier's). If zero, 3.
	CUSUMThreshold float64
	// MinFall is the absolute floor: the mean fall since the CUSUM left 0
	// must reach it. If zero, 0.05 (5 points).
	MinFall float64
	// MinFailure floors the baseline's failure rate in the binomial test,
	// so that a baseline without a single failure does not make one
	// failure an alarm. If zero, 0.01.
	MinFailure float64
	// PeerPoints: a backend whose enrolment rates are lower than the
	// pooled rates of its peers by at least PeerPoints, with z >= GrossZ,
	// is a tool-call outlier. If zero, 0.1 (10 points).
	PeerPoints float64
}

// DefaultToolParams are the tool tier's thresholds with every default.
func DefaultToolParams() ToolParams { return ToolParams{}.WithDefaults() }

func (p ToolParams) WithDefaults() ToolParams {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.GrossPoints, 0.2)
	def(&p.GrossZ, 3.72)
	def(&p.CUSUMThreshold, 3)
	def(&p.MinFall, 0.05)
	def(&p.MinFailure, 0.01)
	def(&p.PeerPoints, 0.1)
	return p
}

// ToolStats are one cycle's tool-call statistics against the baseline.
// A rate without prompts of its kind is 0.
type ToolStats struct {
	Counts     ToolCounts `json:"counts"`
	Baseline   ToolCounts `json:"baseline_counts"`
	ValidRate  float64    `json:"valid_call_rate"`
	BaseValid  float64    `json:"baseline_valid_call_rate"`
	NoCallRate float64    `json:"no_call_rate"`
	BaseNoCall float64    `json:"baseline_no_call_rate"`
	// PValid and PNoCall are the one-sided exact binomial p-values of this
	// cycle's failures under the baseline's failure rate (floored at
	// MinFailure); P is the smaller, Bonferroni-corrected for the two
	// tests; Z = Phi^-1(1 - P).
	PValid  float64 `json:"p_valid"`
	PNoCall float64 `json:"p_no_call"`
	P       float64 `json:"p_value"`
	Z       float64 `json:"z"`
	// Fall is the larger fall of the two rates from the baseline's (0.2 is
	// 20 points); negative when both rose.
	Fall float64 `json:"fall"`
}

// ToolResult is what the tool tier found in one cycle.
type ToolResult struct {
	ToolStats
	CUSUM float64 `json:"cusum"`
	// Bad is an example of a wrong answer this cycle: the first prompt
	// that the baseline answered correctly most often among those
	// answered wrongly now.
	Bad *ToolObservation `json:"bad_call,omitempty"`
}

// measureTools compares one cycle's judged tool observations with the
// baseline.
func measureTools(b *ToolBaseline, obs []ToolObservation, p ToolParams) ToolStats {
	return compareCounts(b.Counts, CountTools(obs), p)
}

// compareCounts tests counts c against the rates of base: the exact
// one-sided binomial test of c's failures under base's failure rate.
func compareCounts(base, c ToolCounts, p ToolParams) ToolStats {
	p = p.WithDefaults()
	st := ToolStats{Counts: c, Baseline: base,
		ValidRate: c.ValidRate(), BaseValid: base.ValidRate(),
		NoCallRate: c.NoCallRate(), BaseNoCall: base.NoCallRate(),
		PValid: 1, PNoCall: 1, Fall: math.Inf(-1)}
	tests := 0
	if c.ShouldCall > 0 && base.ShouldCall > 0 {
		tests++
		q0 := max(1-st.BaseValid, p.MinFailure)
		st.PValid = binomialUpper(c.ShouldCall-c.ArgsValid, c.ShouldCall, q0)
		st.Fall = st.BaseValid - st.ValidRate
	}
	if c.ShouldNotCall > 0 && base.ShouldNotCall > 0 {
		tests++
		q0 := max(1-st.BaseNoCall, p.MinFailure)
		st.PNoCall = binomialUpper(c.ShouldNotCall-c.NoCall, c.ShouldNotCall, q0)
		st.Fall = max(st.Fall, st.BaseNoCall-st.NoCallRate)
	}
	st.P = min(1, float64(max(tests, 1))*min(st.PValid, st.PNoCall))
	st.Z = probit(st.P)
	if math.IsInf(st.Fall, -1) {
		st.Fall = 0
	}
	for _, r := range []*float64{&st.ValidRate, &st.BaseValid, &st.NoCallRate, &st.BaseNoCall} {
		if math.IsNaN(*r) {
			*r = 0 // no such prompts; JSON has no NaN
		}
	}
	return st
}

// binomialUpper is P(X >= k) for X ~ Binomial(n, q): the one-sided exact
// p-value of k failures or more.
func binomialUpper(k, n int, q float64) float64 {
	switch {
	case k <= 0:
		return 1
	case k > n:
		return 0
	case q <= 0:
		return 0
	case q >= 1:
		return 1
	}
	lq, l1q := math.Log(q), math.Log1p(-q)
	ln, _ := math.Lgamma(float64(n + 1))
	sum := 0.0
	for j := k; j <= n; j++ {
		lj, _ := math.Lgamma(float64(j + 1))
		lnj, _ := math.Lgamma(float64(n - j + 1))
		sum += math.Exp(ln - lj - lnj + float64(j)*lq + float64(n-j)*l1q)
	}
	return min(sum, 1)
}

// probit is the z of a one-sided p-value, Phi^-1(1 - p), kept within
// [-10, 40] so that p = 1 and p = 0 stay finite.
func probit(p float64) float64 {
	if p >= 1 {
		return -10
	}
	if p <= 0 {
		return 40
	}
	return min(max(math.Sqrt2*math.Erfcinv(2*p), -10), 40)
}

// toolSignal turns the tool statistics into a Signal with the decision
// rules of the logprob tier: a gross change at once, a one-sided CUSUM on
// z with an absolute floor on the mean fall, confirmation at ConfirmZ.
func toolSignal(st ToolStats, cu *CUSUM, p Params) Signal {
	tp := p.Tools.WithDefaults()
	cp := p
	cp.CUSUMThreshold = tp.CUSUMThreshold
	alarm := cu.Update(st.Z, st.Fall, tp.MinFall, cp)
	s := Signal{
		Gross:   st.Fall >= tp.GrossPoints && st.Z >= tp.GrossZ,
		Alarm:   alarm,
		Confirm: st.Z >= p.ConfirmZ,
		Quiet:   st.Z < p.QuietZ,
	}
	summary := st.summary()
	switch {
	case s.Quiet && !s.Alarm && !s.Gross:
		s.Score, s.Thresh = cu.C, tp.CUSUMThreshold
		s.Reason = "tool calls in line with the baseline: " + st.rates()
	case s.Gross:
		s.Score, s.Thresh = st.Z, tp.GrossZ
		s.Reason = fmt.Sprintf("gross change in tool calls: %s (gross: a fall of >= %.0f points with z >= %.2f)", summary, 100*tp.GrossPoints, tp.GrossZ)
	default:
		s.Score, s.Thresh = cu.C, tp.CUSUMThreshold
		s.Reason = fmt.Sprintf("tool calls: %s; CUSUM %.1f (threshold %.0f), mean fall %.0f points (floor %.0f)",
			summary, cu.C, tp.CUSUMThreshold, 100*cu.MeanExcess(), 100*tp.MinFall)
	}
	return s
}

func (st ToolStats) summary() string {
	return fmt.Sprintf("%s; fall %.0f points, binomial p %.2g (z %.1f)", st.rates(), 100*st.Fall, st.P, st.Z)
}

// rates are the rates of the cycle and of the baseline.
func (st ToolStats) rates() string {
	rate := func(name string, k, n int, base float64) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("%s %.0f%% (%d/%d, baseline %.0f%%)", name, 100*float64(k)/float64(n), k, n, 100*base)
	}
	var parts []string
	for _, s := range []string{
		rate("valid-call rate", st.Counts.ArgsValid, st.Counts.ShouldCall, st.BaseValid),
		rate("no-call rate", st.Counts.NoCall, st.Counts.ShouldNotCall, st.BaseNoCall),
	} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, ", ")
}

// toolTier judges the cycle's tool probes against the baseline, feeds the
// tool CUSUM, and merges the tool signal into s (the logprob or black-box
// tier's). Without tool probes, or for a backend that rejected tools at
// enrolment, it returns nil and s unchanged.
func (m *Monitor) toolTier(c *Cycle, s Signal) (*ToolResult, Signal) {
	b := m.baseline
	if b == nil || b.Tools == nil || !b.Tools.Supported || m.suite.Tools == nil || len(c.Tools) != len(m.suite.Tools.Prompts) {
		return nil, s
	}
	st := measureTools(b.Tools, c.Tools, m.p.Tools)
	ts := toolSignal(st, &m.det.ToolCUSUM, m.p)
	r := &ToolResult{ToolStats: st, CUSUM: m.det.ToolCUSUM.C}
	best := -1
	for i, o := range c.Tools {
		if !o.Correct && (best < 0 || b.Tools.Correct[i] > b.Tools.Correct[best]) {
			best = i
		}
	}
	if best >= 0 {
		bad := c.Tools[best]
		r.Bad = &bad
		if !ts.Quiet || ts.Gross || ts.Alarm {
			ts.Reason += "; e.g. " + bad.describe()
		}
	}
	return r, mergeSignals(s, ts)
}

// describe is a one-line account of a wrong answer.
func (o ToolObservation) describe() string {
	if o.Calls == 0 {
		return o.Prompt + ": " + o.Problem
	}
	return fmt.Sprintf("%s: %s(%s): %s", o.Prompt, o.Name, cut(o.Arguments, 80), o.Problem)
}

// mergeSignals combines the signal of the tool tier (t) with the other
// tiers' (s): either tier's gross change or alarm counts, and a cycle is
// quiet only when both are. The score, threshold and reason lead with the
// tier that decides.
func mergeSignals(s, t Signal) Signal {
	out := s
	out.Gross = s.Gross || t.Gross
	out.Alarm = s.Alarm || t.Alarm
	out.Confirm = s.Confirm || t.Confirm
	out.Quiet = s.Quiet && t.Quiet
	toolDecides := t.Gross && !s.Gross || t.Alarm && !s.Gross && !s.Alarm
	if toolDecides {
		out.Score, out.Thresh = t.Score, t.Thresh
		out.Reason = t.Reason + "; " + s.Reason
	} else {
		out.Reason = s.Reason + "; " + t.Reason
	}
	return out
}

// toolEvidence is the alert evidence of the tool tier.
func (r *ToolResult) evidence() map[string]any {
	ev := map[string]any{
		"valid_call_rate_before": finite(r.BaseValid),
		"valid_call_rate_after":  finite(r.ValidRate),
		"no_call_rate_before":    finite(r.BaseNoCall),
		"no_call_rate_after":     finite(r.NoCallRate),
		"counts":                 r.Counts,
		"baseline_counts":        r.Baseline,
		"p_value":                r.P,
		"z":                      r.Z,
		"fall_points":            100 * r.Fall,
		"cusum":                  r.CUSUM,
	}
	if r.Bad != nil {
		ev["bad_call"] = r.Bad
	}
	return ev
}
