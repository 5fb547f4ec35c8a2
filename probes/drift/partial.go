package drift

import (
	"math"
	"strings"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// ObservePartial judges a cycle of an enrolled backend whose sampled tier
// the probe budget skipped, on what it paid for: the identity tier
// against the baseline's, and the teacher tier when the cycle scored the
// texts. The sampled probes' statistics and the tool tier see nothing of
// it. It reports whether anything was judged: a cycle with neither a
// teacher tier nor an identity change leaves the status as it was (the
// note in the status says the tiers were skipped).
func (m *Monitor) ObservePartial(c *Cycle, skipped []string) (Result, bool) {
	r := Result{At: c.At, PValue: math.NaN()}
	b := m.baseline
	if b == nil {
		return r, false
	}
	if m.identity != nil {
		c.Identity.Fingerprint = m.identity.Fingerprint // not measured: the sampled answers carry it
		r.IdentityChanges = m.identity.Changes(c.Identity)
	}
	id := c.Identity
	m.identity = &id
	r.Stats = Stats{S2: math.NaN(), S3: math.NaN(), S4: math.NaN()}
	s := Signal{Quiet: true, Reason: "sampled tier skipped by the probe budget"}
	judged := false
	if b.Teacher != nil && m.teacherMode() != TeacherOff && len(c.Teacher) == len(m.suite.Teacher) {
		s, r.Teacher = m.teacherSignal(c, s)
		judged = true
	}
	if tier := b.Identity.TierChanges(c.Identity); len(tier) > 0 {
		judged = true
		r.IdentityTier = tier
		phrases := make([]string, len(tier))
		for i, ch := range tier {
			phrases[i] = ch.String()
		}
		s.Identity, s.Quiet = true, false
		s.Reason = "identity changed against the baseline: " + strings.Join(phrases, ", ") + "; " + s.Reason
		if !s.Gross && !s.Alarm {
			s.Score, s.Thresh = float64(len(tier)), 1
		}
	}
	if !judged {
		return r, false
	}
	r.Signal = s
	if tr, ok := m.det.Step(c.At, s, m.p); ok {
		r.Transition = &tr
		m.teacherAfterStep(&tr)
		a := m.partialAlert(c, r, tr, skipped)
		r.Alert = &a
	}
	m.last = r
	return r, true
}

// partialAlert is the alert of a transition on a cycle whose sampled tier
// was skipped: the identity and teacher evidence only.
func (m *Monitor) partialAlert(c *Cycle, r Result, tr Transition, skipped []string) fleetwatch.DriftAlert {
	b := m.baseline
	ev := fleetwatch.DriftEvidence{Prompts: len(c.Teacher), ModelIDs: c.Identity.ModelIDs,
		Extra: map[string]any{"baseline_cycles": b.Cycles, "skipped_by_budget": skipped}}
	if ev.ModelIDs == nil {
		ev.ModelIDs = []string{}
	}
	if len(r.IdentityTier) > 0 {
		ev.Extra["identity_changes"] = r.IdentityTier
	}
	teacherEvidence(ev.Extra, b.Teacher, r.Teacher, m.tch.CUSUM)
	if f := b.Identity.Fingerprint; f != "" {
		ev.FingerprintBefore = &f
	}
	return fleetwatch.DriftAlert{
		V: fleetwatch.ProtocolVersion, Pool: m.Pool, Backend: m.Backend, At: fleetwatch.At(c.At),
		Status: tr.To, Previous: tr.From, Score: finite(tr.Signal.Score), Threshold: tr.Signal.Thresh,
		Against: fleetwatch.AgainstBaseline, Suite: m.suite.Name, Evidence: ev, Reason: tr.Signal.Reason,
	}
}
