package drift

import (
	"fmt"
	"math"
	"strings"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// TeacherMode says how a backend's teacher-forced scores enter its drift
// decision, where the backend supports them (docs/DECISIONS.md
// "Teacher-forced probes").
type TeacherMode string

const (
	// TeacherBoth judges the sampled probes and the teacher-forced scores
	// as two tiers through the same rules, each with its own null and
	// CUSUM: gross if either is gross, an alarm if either alarms, quiet
	// when both are.
	TeacherBoth TeacherMode = "both"
	// TeacherOnly judges subtle changes on the teacher-forced scores
	// alone where supported: their CUSUM replaces the sampled probes'
	// (which the load regime can push over its threshold), while a gross
	// change still fires on either tier (a swap or a Q4-class change moves
	// the greedy outputs at once, at no extra cost). The sampled probes
	// still run, for the gross rule, the identity tier and the evidence.
	// The default, chosen by measurement (docs/DRIFT.md).
	TeacherOnly TeacherMode = "only"
	// TeacherOff never scores texts: sampled probes only.
	TeacherOff TeacherMode = "off"
)

// teacherState is a monitor's teacher tier: its CUSUM and previous cycle
// (for the persistent delta), and whether enrolment found the backend
// unable to score prompts.
type teacherState struct {
	CUSUM CUSUM
	Prev  *Cycle // the previous judged cycle's scores, as a cycle of the teacher suite
	// Unsupported is set when an enrolment cycle came without scores: the
	// baseline will have no teacher tier, so later enrolment cycles do not
	// ask.
	Unsupported bool
}

// TeacherStats are one cycle's teacher-forced statistics against the
// baseline's teacher tier, over the positions of the fixed texts (all
// aligned: the texts do not change):
//   - S2 (in Stats) as for the sampled probes, mean |lp_now - lp_base|;
//   - S4 (in Stats), the persistent delta as for the sampled probes
//     (evidence);
//   - T4, the persistence test: with x_j = d_j(now) x d_j(previous cycle)
//     at every position j, T4 = (mean x - B - 3 sB) / (sd x / sqrt(n)).
//     B is the baseline's own squared error, which every cycle shares
//     (the mean over positions of the enrolment variance / cycles) and sB
//     the spread of its realised value (sqrt(2 sum (var_j/cycles)^2) / n):
//     the baseline's error is the same in every later cycle, so without
//     the margin a baseline that happens to be off by more than B would
//     push the CUSUM up cycle after cycle. Each cycle's own noise is in
//     both the mean and its standard error, so T4 stays about N(0, 1) or
//     below without a change whatever the noise level of this cycle, the
//     previous one or the enrolment (the load regime), and grows as
//     sqrt(n) x shift^2 / noise^2 with one;
//   - Persist, sqrt(mean x - B) in nats (signed): the RMS shift the two
//     cycles share beyond the baseline's own error, which the CUSUM's
//     absolute floor applies to;
//   - each text's mean token logprob now and in the baseline (evidence).
type TeacherStats struct {
	Stats
	T4, Persist                      float64
	MeanLogprob, BaselineMeanLogprob map[string]float64
	Signal                           Signal
}

// teacherSuite is the pseudo-suite a teacher baseline is built over: one
// prompt of kind KindTeacher per fixed text.
func teacherSuite(s *Suite) *Suite {
	ts := &Suite{Name: s.Name + "/teacher", Hash: s.Hash}
	for _, t := range s.Teacher {
		ts.Prompts = append(ts.Prompts, Prompt{ID: t.ID, Kind: KindTeacher, Text: t.Text})
	}
	return ts
}

// teacherCycle is c's teacher scores as a cycle of the teacher suite.
func teacherCycle(c *Cycle) *Cycle {
	return &Cycle{At: c.At, Obs: c.Teacher, Identity: c.Identity}
}

func (m *Monitor) teacherMode() TeacherMode {
	if m.teacherSetting == "" {
		return TeacherOnly
	}
	return m.teacherSetting
}

// WantsTeacher reports whether the next cycle should score the suite's
// fixed texts: the suite has some and the mode allows, and the backend is
// enrolling (and was not found unable to) or its baseline has a teacher
// tier.
func (m *Monitor) WantsTeacher() bool {
	if len(m.suite.Teacher) == 0 || m.teacherMode() == TeacherOff {
		return false
	}
	if m.baseline == nil {
		return !m.tch.Unsupported
	}
	return m.baseline.Teacher != nil
}

// teacherEnrolCycle notes an enrolment cycle without scores.
func (m *Monitor) teacherEnrolCycle(c *Cycle) {
	if len(c.Teacher) != len(m.suite.Teacher) {
		m.tch.Unsupported = true
	}
}

// attachTeacher builds b's teacher tier from the enrolment cycles when all
// of them carry scores of every text: the profile of each text and the
// leave-one-out (S2, S3) and leave-two-out (S4) nulls, as BuildBaseline
// does for the sampled probes. The per-cycle samples are dropped: the
// texts never change, so they are the mode repeated.
func (m *Monitor) attachTeacher(b *Baseline, cycles []*Cycle) error {
	if len(m.suite.Teacher) == 0 || m.teacherMode() == TeacherOff {
		return nil
	}
	tcs := make([]*Cycle, len(cycles))
	for i, c := range cycles {
		if len(c.Teacher) != len(m.suite.Teacher) {
			return nil
		}
		tcs[i] = teacherCycle(c)
	}
	tb, err := BuildBaseline(teacherSuite(m.suite), tcs, m.p.SigmaFloor)
	if err != nil {
		return err
	}
	for i := range tb.Prompts {
		pb := &tb.Prompts[i]
		pb.Samples = nil
		for j := range pb.Positions {
			pos := &pb.Positions[j]
			pos.Var = 0 // the teacher tier's own, over fully aligned cycles
			ss, n := 0.0, 0
			for _, c := range tcs {
				if toks := c.Obs[i].Tokens; j < len(toks) && aligned(toks, pb.Mode, j+1) {
					d := toks[j].Logprob - pos.Top1
					ss += d * d
					n++
				}
			}
			if n > 1 {
				pos.Var = ss / float64(n-1)
			}
		}
	}
	tb.Identity = Identity{}
	b.Teacher = tb
	return nil
}

// teacherCheck fails a cycle of a backend enrolled with teacher scores that
// came without them.
func (m *Monitor) teacherCheck(c *Cycle) error {
	if m.baseline.Teacher != nil && m.teacherMode() != TeacherOff && len(c.Teacher) != len(m.suite.Teacher) {
		return &ProbeError{Kind: ErrKindNoPromptLogprobs, Op: "teacher-forced scores", Err: fmt.Errorf("%w: %d of %d texts scored", ErrNoPromptLogprobs, len(c.Teacher), len(m.suite.Teacher))}
	}
	return nil
}

// teacherSignal measures the cycle's teacher tier and combines it with the
// sampled probes' signal s by the mode. It returns s unchanged (and nil)
// when the baseline has no teacher tier.
func (m *Monitor) teacherSignal(c *Cycle, s Signal) (Signal, *TeacherStats) {
	tb := m.baseline.Teacher
	if tb == nil || m.teacherMode() == TeacherOff {
		return s, nil
	}
	tc := teacherCycle(c)
	ts := &TeacherStats{Stats: Measure(tb, tc)}
	ts.S4 = persistentDelta(tb, tc, m.tch.Prev)
	ts.T4, ts.Persist = persistenceTest(tb, tc, m.tch.Prev)
	m.tch.Prev = tc
	ts.MeanLogprob, ts.BaselineMeanLogprob = map[string]float64{}, map[string]float64{}
	for i, pb := range tb.Prompts {
		now, base := 0.0, 0.0
		for _, pos := range pb.Positions {
			base += pos.Top1
		}
		toks := c.Teacher[i].Tokens
		for _, t := range toks {
			now += t.Logprob
		}
		if len(pb.Positions) > 0 && len(toks) > 0 {
			ts.MeanLogprob[pb.ID], ts.BaselineMeanLogprob[pb.ID] = now/float64(len(toks)), base/float64(len(pb.Positions))
		}
	}
	t := teacherLogprobSignal(ts, tb.Null, &m.tch.CUSUM, m.p)
	ts.Signal = t
	if m.teacherMode() == TeacherOnly {
		return replaceSignal(s, t), ts
	}
	return combineSignals(s, t), ts
}

// combineSignals judges two tiers together: gross or alarming if either
// is, confirming if either does, quiet when both are. The score and the
// threshold are the deciding tier's (the sampled one's when both or
// neither decide).
func combineSignals(s, t Signal) Signal {
	out := Signal{
		Gross: s.Gross || t.Gross, Alarm: s.Alarm || t.Alarm, Confirm: s.Confirm || t.Confirm,
		Quiet: s.Quiet && t.Quiet, Identity: s.Identity || t.Identity,
		Score: s.Score, Thresh: s.Thresh, Reason: s.Reason + "; " + t.Reason,
	}
	if t.Gross && !s.Gross || t.Alarm && !s.Alarm && !s.Gross {
		out.Score, out.Thresh = t.Score, t.Thresh
		out.Reason = t.Reason + "; sampled: " + s.Reason
	}
	return out
}

// replaceSignal is the teacher tier t deciding, with the sampled tier s's
// gross rule kept: s's accumulating test (its CUSUM, or the black-box
// MMD) and its confirmation are not used.
func replaceSignal(s, t Signal) Signal {
	out := t
	out.Identity = s.Identity || t.Identity
	out.Quiet = t.Quiet && s.Quiet
	out.Reason = t.Reason + "; sampled: " + s.Reason
	if s.Gross && !t.Gross {
		out.Gross = true
		out.Score, out.Thresh = s.Score, s.Thresh
		out.Reason = s.Reason + "; " + t.Reason
	}
	return out
}

// teacherAfterStep resets the teacher CUSUM on every verdict, as the
// detector resets its own.
func (m *Monitor) teacherAfterStep(tr *Transition) {
	if tr != nil && tr.To != fleetwatch.DriftSuspect {
		m.tch.CUSUM.Reset(m.p.Cooldown)
	}
}

// teacherEvidence adds the teacher tier's figures to an alert's evidence.
func teacherEvidence(extra map[string]any, tb *Baseline, ts *TeacherStats, cu CUSUM) {
	if ts == nil || tb == nil {
		return
	}
	extra["teacher_texts"] = len(tb.Prompts)
	extra["teacher_positions"] = ts.Positions
	extra["teacher_s2"] = finite(ts.S2)
	extra["teacher_s2_z"] = finite(tb.Null.S2.Z(ts.S2))
	extra["teacher_s4"] = finite(ts.S4)
	extra["teacher_t4"] = finite(ts.T4)
	extra["teacher_persistent_shift"] = finite(ts.Persist)
	extra["teacher_cusum"] = cu.C
	var moved []string
	for _, p := range tb.Prompts {
		if d := ts.MeanLogprob[p.ID] - ts.BaselineMeanLogprob[p.ID]; math.Abs(d) > 0 {
			moved = append(moved, fmt.Sprintf("%s %+.4f", p.ID, d))
		}
	}
	extra["teacher_mean_logprob_delta"] = strings.Join(moved, ", ")
}

// exportTeacher adds the teacher tier to a drift state.
func (m *Monitor) exportTeacher(s *DriftState) {
	if m.baseline != nil && m.baseline.Teacher != nil {
		cu := m.tch.CUSUM
		s.TeacherCUSUM = &cu
	}
}

// importTeacher continues the teacher tier from a drift state: its CUSUM,
// and the previous scores from the stored previous cycle.
func (m *Monitor) importTeacher(s *DriftState) {
	if m.baseline.Teacher == nil {
		return
	}
	if s.TeacherCUSUM != nil {
		m.tch.CUSUM = *s.TeacherCUSUM
	}
	if s.Prev != nil && len(s.Prev.Teacher) == len(m.suite.Teacher) {
		m.tch.Prev = teacherCycle(s.Prev)
	}
}

// persistenceTest is T4 and Persist of TeacherStats for cycle c of the
// teacher suite after prev; NaN without a previous cycle or with fewer than
// 8 common positions.
func persistenceTest(b *Baseline, c, prev *Cycle) (t4, persist float64) {
	if prev == nil {
		return math.NaN(), math.NaN()
	}
	mean, se, n := productMoments(b, c, prev)
	if n < 8 {
		return math.NaN(), math.NaN()
	}
	own, spread := baselineOwnError(b)
	excess := mean - own
	if se == 0 {
		return math.NaN(), signedSqrt(excess)
	}
	return (excess - 3*spread) / se, signedSqrt(excess)
}

// productMoments are the mean and standard error of the products x_j =
// d_j(c) x d_j(prev) of the two cycles' top-1 deltas against b along the
// positions aligned with the mode in both (up to and including the first
// divergence), and their number.
func productMoments(b *Baseline, c, prev *Cycle) (mean, se float64, n int) {
	var xs []float64
	for i := range b.Prompts {
		pb := &b.Prompts[i]
		a, p := c.Obs[i].Tokens, prev.Obs[i].Tokens
		for j := range pb.Positions {
			if j >= len(a) || j >= len(p) {
				break
			}
			da := lookup(&a[j], pb.Mode[j]) - pb.Positions[j].Top1
			dp := lookup(&p[j], pb.Mode[j]) - pb.Positions[j].Top1
			xs = append(xs, da*dp)
			if a[j].Token != pb.Mode[j] || p[j].Token != pb.Mode[j] {
				break
			}
		}
	}
	if len(xs) < 2 {
		return math.NaN(), math.NaN(), len(xs)
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	se = math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
	return mean, se, len(xs)
}

// baselineOwnError is B and sB of TeacherStats: the expected mean squared
// error of the baseline's position means and the spread of its realised
// value.
func baselineOwnError(b *Baseline) (own, spread float64) {
	n, sq := 0, 0.0
	for i := range b.Prompts {
		for _, pos := range b.Prompts[i].Positions {
			if pos.N == 0 {
				continue
			}
			v := pos.Var / float64(pos.N)
			own += v
			sq += v * v
			n++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return own / float64(n), math.Sqrt(2*sq) / float64(n)
}

// maxValue is the largest of a null's values (NaN when none).
func maxValue(n NullStat) float64 {
	if len(n.Values) == 0 {
		return math.NaN()
	}
	hi := n.Values[0]
	for _, v := range n.Values {
		hi = max(hi, v)
	}
	return hi
}

// teacherLogprobSignal turns the teacher tier's statistics into a Signal
// by the rules of the sampled tier, on the statistics that suit scores of
// fixed texts:
//   - gross: S2 at least GrossNats above the largest enrolment value (not
//     the median: a text's rare tokens carry the whole logit noise, so S2
//     follows the noise level, and a cycle noisier than most of the
//     enrolment must not look gross) and z2 >= GrossZ;
//   - the CUSUM on T4 (already a z) with Persist as the excess the floor
//     MinExcessNats applies to;
//   - confirm when T4 or z2 >= ConfirmZ; quiet when T4 < QuietZ and S2 is
//     not both above every enrolment value and z2 >= QuietZ.
func teacherLogprobSignal(st *TeacherStats, null NullModel, cu *CUSUM, p Params) Signal {
	z2 := null.S2.Z(st.S2)
	worst := maxValue(null.S2)
	s := Signal{
		Gross:   st.S2-worst >= p.GrossNats && z2 >= p.GrossZ,
		Alarm:   cu.Update(st.T4, st.Persist, p.MinExcessNats, p),
		Confirm: st.T4 >= p.ConfirmZ || z2 >= p.ConfirmZ,
		Quiet:   !(st.T4 >= p.QuietZ) && !(z2 >= p.QuietZ && st.S2 > worst),
	}
	if s.Gross {
		s.Score, s.Thresh = z2, p.GrossZ
		s.Reason = fmt.Sprintf("teacher-forced: gross change: S2 %.4f nats over %d positions (baseline %.4f, at most %.4f in enrolment, z %.1f)",
			st.S2, st.Positions, null.S2.Mu, worst, z2)
		return s
	}
	s.Score, s.Thresh = cu.C, p.CUSUMThreshold
	s.Reason = fmt.Sprintf("teacher-forced: CUSUM %.1f (threshold %.0f) on the persistence test: T4 %.1f, shared shift %.4f nats, mean excess %.4f nats (floor %.3f); S2 %.4f nats z %.1f over %d positions",
		cu.C, p.CUSUMThreshold, st.T4, st.Persist, cu.MeanExcess(), p.MinExcessNats, st.S2, z2, st.Positions)
	return s
}

// DecidingCUSUM is the teacher tier's CUSUM when it, not the sampled one,
// decides subtle changes (TeacherOnly with a teacher tier): what the
// status and the fleetwatch_drift_cusum gauge show.
func (m *Monitor) DecidingCUSUM() (CUSUM, bool) {
	if m.baseline == nil || m.baseline.Teacher == nil || m.teacherMode() != TeacherOnly {
		return CUSUM{}, false
	}
	return m.tch.CUSUM, true
}
