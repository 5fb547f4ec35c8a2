package drift

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// ErrNoLogprobs is a probe error: a backend enrolled with logprobs answered
// without them. It is never a drift verdict.
var ErrNoLogprobs = errors.New("probes: backend enrolled with logprobs answered without them")

// ErrSuiteMismatch reports a cycle that does not match the monitor's suite.
var ErrSuiteMismatch = errors.New("probes: cycle does not match the suite")

// MonitorSettings configure a Monitor. The zero value works except Suite.
type MonitorSettings struct {
	// Suite is the prompt suite. Required.
	Suite *Suite
	// Enrol is how many cycles enrolment takes at least. If zero, 8.
	Enrol int
	// EnrolMin is the minimum span from the first to the last enrolment
	// cycle. If zero, 2h; negative means none.
	EnrolMin time.Duration
	// Params are the decision thresholds.
	Params Params
	// Teacher is how teacher-forced scores are judged where the backend
	// supports them. If empty, TeacherOnly.
	Teacher TeacherMode
}

// Monitor is the pure drift logic of one backend: enrolment, statistics,
// the status machine and the black-box path. It does no I/O and is not safe
// for concurrent use; the Prober serialises calls per backend.
type Monitor struct {
	Pool, Backend string

	suite    *Suite
	enrol    int
	enrolMin time.Duration
	p        Params

	enrolStart time.Time
	enrolling  []*Cycle
	baseline   *Baseline
	det        Detector
	// recent are the last judged cycles, oldest first: MMDWindow of them
	// for a black-box backend (the MMD test's sample), PersistWindow for
	// a logprob backend (the persistence test's window); durable
	recent   []*Cycle
	identity *Identity
	prev     *Cycle // the last judged cycle, for S4
	last     Result

	teacherSetting TeacherMode
	tch            teacherState // the teacher-forced tier (teacher_monitor.go)
}

// NewMonitor returns a monitor that starts enrolling, or continues from b
// when b is a baseline of the same suite (nil: enrol).
func NewMonitor(pool, backend string, s MonitorSettings, b *Baseline) *Monitor {
	m := &Monitor{Pool: pool, Backend: backend, suite: s.Suite, enrol: s.Enrol, enrolMin: s.EnrolMin, p: s.Params.WithDefaults(), teacherSetting: s.Teacher}
	if m.enrol == 0 {
		m.enrol = 8
	}
	m.enrol = max(m.enrol, 3)
	if m.enrolMin == 0 {
		m.enrolMin = 2 * time.Hour
	}
	if b != nil && b.SuiteHash == s.Suite.Hash {
		m.baseline = b
		m.det.Status = fleetwatch.DriftOK
		id := b.Identity
		m.identity = &id
	} else {
		m.det.Status = fleetwatch.DriftUnknown
	}
	return m
}

// Baseline is the current baseline, nil while enrolling.
func (m *Monitor) Baseline() *Baseline { return m.baseline }

// Status is the backend's drift status against its baseline and since when.
func (m *Monitor) Status() (fleetwatch.DriftStatus, time.Time) { return m.det.Status, m.det.Since }

// Last is the result of the last observed cycle.
func (m *Monitor) Last() Result { return m.last }

// EnrolCycles is the number of cycles collected towards the baseline.
func (m *Monitor) EnrolCycles() int { return len(m.enrolling) }

// Detector is the detector's state: the status, the CUSUM and a pending
// identity suspicion.
func (m *Monitor) Detector() Detector { return m.det }

// Rebaseline drops the baseline and restarts enrolment.
func (m *Monitor) Rebaseline(now time.Time) {
	m.baseline, m.enrolling, m.recent, m.prev = nil, nil, nil, nil
	m.det = Detector{Status: fleetwatch.DriftUnknown, Since: now}
	m.tch = teacherState{}
}

// Result is what one cycle did.
type Result struct {
	At time.Time
	// Enrolling is set while the backend has no baseline; Enrolled when
	// this cycle completed the baseline.
	Enrolling, Enrolled bool
	Stats               Stats
	Signal              Signal
	// PValue is the MMD test's p-value (black-box backends), NaN when not
	// run.
	PValue float64
	// IdentityChanges lists metadata changes since the previous cycle: an
	// event that warrants an extra cycle, never a verdict by itself.
	IdentityChanges []string
	// IdentityTier lists the identity-tier fields that differ from the
	// baseline's this cycle: an immediate suspect (Signal.Identity).
	IdentityTier []IdentityChange
	// Teacher holds the teacher-forced statistics when the baseline has
	// a teacher tier.
	Teacher *TeacherStats
	// Tools is the tool-call tier's result (nil without tool probes).
	Tools      *ToolResult
	Transition *Transition
	// Alert is set when the status changed.
	Alert *fleetwatch.DriftAlert
}

// Observe evaluates one cycle. fdr decides, for a black-box backend, whether
// its p-value is rejected after Benjamini-Hochberg across backends (nil:
// compare with Params.FDR alone).
func (m *Monitor) Observe(c *Cycle, fdr func(p float64) bool) (Result, error) {
	if len(c.Obs) != len(m.suite.Prompts) {
		return Result{}, fmt.Errorf("%w: %d observations for %d prompts", ErrSuiteMismatch, len(c.Obs), len(m.suite.Prompts))
	}
	r := Result{At: c.At, PValue: math.NaN()}
	if m.identity != nil {
		r.IdentityChanges = m.identity.Changes(c.Identity)
	}
	id := c.Identity
	m.identity = &id
	if m.baseline == nil {
		return m.enrolCycle(c, r)
	}
	b := m.baseline
	if b.Logprobs && !c.hasLogprobs() {
		return r, ErrNoLogprobs
	}
	if err := m.teacherCheck(c); err != nil {
		return r, err
	}
	r.Stats = Measure(b, c)
	r.Stats.S4 = persistentDelta(b, c, m.prev)
	var ps Persistence
	if b.Logprobs {
		if len(m.recent) == 0 && m.prev != nil {
			m.recent = []*Cycle{m.prev} // a state stored before the window
		}
		ps = SampledPersistence(b, c, m.recent)
		m.recent = append(m.recent, c)
		if len(m.recent) > PersistWindow {
			m.recent = slices.Delete(m.recent, 0, 1)
		}
	}
	m.prev = c
	if b.Logprobs {
		r.Signal = logprobSignal(r.Stats, ps, b.Null, &m.det.CUSUM, m.p)
	} else {
		r.Signal, r.PValue = m.blackBoxSignal(c, r.Stats, fdr)
	}
	r.Signal, r.Teacher = m.teacherSignal(c, r.Signal)
	r.Tools, r.Signal = m.toolTier(c, r.Signal)
	tier := b.Identity.TierChanges(c.Identity)
	if bf, tf := b.Identity.Fingerprint, c.TrafficFingerprint; bf != "" && tf != "" && tf != bf && c.Identity.Fingerprint != bf {
		// traffic and the probe agree that the fingerprint is not the
		// baseline's: a metadata event backed by the probe's identity
		tier = append(tier, IdentityChange{Field: "system_fingerprint", Before: bf, After: c.Identity.Fingerprint})
	}
	if len(tier) > 0 {
		r.IdentityTier = tier
		r.Signal.Identity, r.Signal.Quiet = true, false
		phrases := make([]string, len(tier))
		for i, ch := range tier {
			phrases[i] = ch.String()
		}
		r.Signal.Reason = "identity changed against the baseline: " + strings.Join(phrases, ", ") + "; " + r.Signal.Reason
		if !r.Signal.Gross && !r.Signal.Alarm {
			// the identity tier decides: its score is the number of
			// changed fields, against 1
			r.Signal.Score, r.Signal.Thresh = float64(len(tier)), 1
		}
	}
	if tr, ok := m.det.Step(c.At, r.Signal, m.p); ok {
		r.Transition = &tr
		m.teacherAfterStep(&tr)
		a := m.alert(c, r, tr)
		r.Alert = &a
	}
	m.last = r
	return r, nil
}

// maxEnrolKeep bounds the enrolment cycles kept (a minimum span at a short
// schedule would otherwise keep hundreds).
const maxEnrolKeep = 48

func (m *Monitor) enrolCycle(c *Cycle, r Result) (Result, error) {
	if len(m.enrolling) == 0 {
		m.enrolStart = c.At
	}
	m.enrolling = append(m.enrolling, c)
	m.teacherEnrolCycle(c)
	// Keep the newest, bounded: at least 2 x enrol cycles, and every cycle
	// of the last enrolMin (the baseline then sees the whole minimum span,
	// so the numeric paths load moves through in it), at most maxEnrolKeep.
	for len(m.enrolling) > 2*m.enrol && (len(m.enrolling) > maxEnrolKeep || c.At.Sub(m.enrolling[0].At) > m.enrolMin) {
		m.enrolling = m.enrolling[1:]
	}
	r.Enrolling = true
	if len(m.enrolling) < m.enrol || (m.enrolMin > 0 && c.At.Sub(m.enrolStart) < m.enrolMin) {
		m.last = r
		return r, nil
	}
	b, err := BuildBaseline(m.suite, m.enrolling, m.p.SigmaFloor)
	if err != nil {
		return r, err
	}
	if err := m.attachTeacher(b, m.enrolling); err != nil {
		return r, err
	}
	b.Pool, b.Backend, b.Created, b.From = m.Pool, m.Backend, c.At, m.enrolStart
	m.baseline, m.enrolling = b, nil
	m.det = Detector{Status: fleetwatch.DriftOK, Since: c.At}
	r.Enrolling, r.Enrolled = false, true
	m.last = r
	return r, nil
}

// blackBoxSignal is the path for backends without logprobs: greedy exact
// match (S1) against its leave-one-out null, and the MMD-Hamming test of the
// last MMDWindow cycles against the enrolment sample.
func (m *Monitor) blackBoxSignal(c *Cycle, st Stats, fdr func(float64) bool) (Signal, float64) {
	m.recent = append(m.recent, c)
	if len(m.recent) > m.p.MMDWindow {
		m.recent = m.recent[1:]
	}
	null := m.baseline.Null.S1
	worstNull := 0.0
	for _, v := range null.Values {
		worstNull = max(worstNull, v)
	}
	s := Signal{
		Gross:  st.S1 >= 0.5 && st.S1 >= worstNull+0.25,
		Score:  st.S1,
		Thresh: max(0.5, worstNull+0.25),
	}
	p := math.NaN()
	if len(m.recent) == m.p.MMDWindow {
		var x, y []Sample
		for i, pb := range m.baseline.Prompts {
			for _, seq := range pb.Samples {
				x = append(x, Sample{Prompt: i, Seq: seq})
			}
		}
		for _, rc := range m.recent {
			for i := range rc.Obs {
				y = append(y, Sample{Prompt: i, Seq: rc.Obs[i].Sequence()})
			}
		}
		_, p = mmdTest(x, y, m.p.Permutations, uint64(c.At.UnixNano()))
		rejected := p <= m.p.FDR
		if fdr != nil {
			rejected = fdr(p)
		}
		s.Alarm, s.Confirm = rejected, rejected
	}
	s.Quiet = !s.Gross && !s.Alarm
	s.Reason = fmt.Sprintf("greedy output changed on %d of %d stable prompts (null at most %.2f); MMD p-value %.4g over the last %d cycles",
		st.Mismatched, st.Stable, worstNull, p, len(m.recent))
	return s, p
}

// alert builds the DriftAlert of a transition.
func (m *Monitor) alert(c *Cycle, r Result, tr Transition) fleetwatch.DriftAlert {
	b := m.baseline
	ev := fleetwatch.DriftEvidence{
		Prompts:        len(m.suite.Prompts),
		ExactMatchRate: new(float64(r.Stats.ExactMatch)),
		ModelIDs:       c.Identity.ModelIDs,
		Extra: map[string]any{
			"greedy_mismatch_stable": r.Stats.S1,
			"baseline_cycles":        b.Cycles,
		},
	}
	if ev.ModelIDs == nil {
		ev.ModelIDs = modelsOf(c)
	}
	// the prompts whose greedy output left the mode, with a hash of what
	// came instead, so that a reviewer can compare with later alerts
	changed := map[string]string{}
	for i, pb := range b.Prompts {
		if !slices.Equal(pb.Mode, c.Obs[i].Sequence()) {
			changed[pb.ID] = c.Obs[i].TextHash()
		}
	}
	ev.Extra["changed_prompts"] = changed
	if !math.IsNaN(r.Stats.S2) {
		ev.MeanAbsLogprobDelta = new(float64(r.Stats.S2))
		ev.Extra["s2_baseline_mu"] = b.Null.S2.Mu
		ev.Extra["s2_baseline_sigma"] = b.Null.S2.Sigma
		ev.Extra["s2_z"] = b.Null.S2.Z(r.Stats.S2)
		ev.Extra["s3_first_token_delta"] = finite(r.Stats.S3)
		ev.Extra["s3_z"] = finite(b.Null.S3.Z(r.Stats.S3))
		ev.Extra["s4_persistent_delta"] = finite(r.Stats.S4)
		ev.Extra["s4_z"] = finite(b.Null.S4.Z(r.Stats.S4))
		ev.Extra["positions"] = r.Stats.Positions
		ev.Extra["cusum"] = m.det.CUSUM.C
	}
	if !math.IsNaN(r.PValue) {
		ev.Extra["mmd_p_value"] = r.PValue
	}
	if len(r.IdentityTier) > 0 {
		ev.Extra["identity_changes"] = r.IdentityTier
	}
	teacherEvidence(ev.Extra, b.Teacher, r.Teacher, m.tch.CUSUM)
	if r.Tools != nil {
		ev.Extra["tool_calls"] = r.Tools.evidence()
	}
	if c.TrafficFingerprint != "" {
		ev.Extra["traffic_fingerprint"] = c.TrafficFingerprint
	}
	if f := b.Identity.Fingerprint; f != "" {
		ev.FingerprintBefore = &f
	}
	if f := c.Identity.Fingerprint; f != "" {
		ev.FingerprintAfter = &f
	}
	reason := tr.Signal.Reason
	if ch := b.Identity.Changes(c.Identity); len(ch) > 0 {
		ev.Extra["metadata_changes"] = ch
		reason += "; " + strings.Join(ch, ", ")
	}
	return fleetwatch.DriftAlert{
		V: fleetwatch.ProtocolVersion, Pool: m.Pool, Backend: m.Backend, At: fleetwatch.At(c.At),
		Status: tr.To, Previous: tr.From, Score: finite(tr.Signal.Score), Threshold: tr.Signal.Thresh,
		Against: fleetwatch.AgainstBaseline, Suite: m.suite.Name, Evidence: ev, Reason: reason,
	}
}

func modelsOf(c *Cycle) []string {
	var out []string
	seen := map[string]bool{}
	for i := range c.Obs {
		if md := c.Obs[i].Model; md != "" && !seen[md] {
			seen[md] = true
			out = append(out, md)
		}
	}
	return out
}

// finite maps NaN and infinities to 0 so that a score always encodes.
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}
