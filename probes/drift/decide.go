package drift

import (
	"fmt"
	"math"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// Params are the decision thresholds of docs/DRIFT.md. The zero value of
// every field selects its default. Every change re-runs `fleetwatch drift
// sim` at all three noise levels.
type Params struct {
	// SigmaFloor floors each null scale, in nats. If zero, 0.002.
	SigmaFloor float64
	// GrossNats and GrossZ: a gross change fires at once when S - mu0 >=
	// GrossNats and z >= GrossZ. If zero, 0.1 and 12.
	GrossNats, GrossZ float64
	// CUSUMCap caps each z fed to the CUSUM. If zero, 10.
	CUSUMCap float64
	// CUSUMSlack is the reference value k subtracted each cycle. If zero, 0.5.
	CUSUMSlack float64
	// CUSUMThreshold is h: the CUSUM alarms when C > h. If zero, 8.
	CUSUMThreshold float64
	// MinExcessNats is the absolute floor: the mean excess since the CUSUM
	// left 0, as a root mean square shift of the top-1 logprob, must reach
	// it (above fp16 rounding, below Q8). If zero, 0.005.
	MinExcessNats float64
	// ConfirmZ is the z a suspect backend's next cycle needs to confirm
	// (with the CUSUM still above h). If zero, 2.
	ConfirmZ float64
	// Cooldown is how many cycles after a reset the CUSUM cannot alarm. If
	// zero, 3.
	Cooldown int
	// Recover is how many quiet cycles (z < QuietZ on S2 and S3) return a
	// drifted backend to ok. If zero, 3.
	Recover int
	// QuietZ: see Recover. If zero, 3.
	QuietZ float64
	// PeerMinNats and PeerRatio name a peer outlier: its median distance to
	// the others is >= PeerMinNats and >= PeerRatio x the others' median
	// pairwise distance. If zero, 0.05 and 3.
	PeerMinNats, PeerRatio float64
	// FDR is the Benjamini-Hochberg level across black-box backends. If
	// zero, 0.005.
	FDR float64
	// Permutations of the MMD test. If zero, 999.
	Permutations int
	// MMDWindow is how many recent cycles form the MMD test's sample. If
	// zero, 4.
	MMDWindow int
	// Tools are the tool-call tier's thresholds (toolsignal.go).
	Tools ToolParams
}

func (p Params) WithDefaults() Params {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.SigmaFloor, 0.002)
	def(&p.GrossNats, 0.1)
	def(&p.GrossZ, 12)
	def(&p.CUSUMCap, 10)
	def(&p.CUSUMSlack, 0.5)
	def(&p.CUSUMThreshold, 8)
	def(&p.MinExcessNats, 0.005)
	def(&p.ConfirmZ, 2)
	def(&p.QuietZ, 3)
	def(&p.PeerMinNats, 0.05)
	def(&p.PeerRatio, 3)
	def(&p.FDR, 0.005)
	if p.Cooldown == 0 {
		p.Cooldown = 3
	}
	if p.Recover == 0 {
		p.Recover = 3
	}
	if p.Permutations == 0 {
		p.Permutations = 999
	}
	if p.MMDWindow == 0 {
		p.MMDWindow = 4
	}
	p.Tools = p.Tools.WithDefaults()
	return p
}

// CUSUM is a one-sided Page CUSUM on standardised statistics with the mean
// absolute excess since it last left zero:
// C = max(0, C + min(z, cap) - k).
type CUSUM struct {
	C         float64
	RunExcess float64 // sum of S - mu0 since C left 0
	RunN      int
	Cooldown  int // cycles left in which it cannot alarm
}

// Update feeds one cycle's z and excess (S - mu0) and reports whether the
// CUSUM alarms: C > h, the mean excess of the run >= floor (in the
// statistic's units), and no cooldown.
func (c *CUSUM) Update(z, excess, floor float64, p Params) bool {
	if math.IsNaN(z) {
		return false
	}
	wasZero := c.C == 0
	c.C = max(0, c.C+min(z, p.CUSUMCap)-p.CUSUMSlack)
	switch {
	case c.C == 0:
		c.RunExcess, c.RunN = 0, 0
	case wasZero:
		c.RunExcess, c.RunN = excess, 1
	default:
		c.RunExcess += excess
		c.RunN++
	}
	if c.Cooldown > 0 {
		c.Cooldown--
		return false
	}
	return c.C > p.CUSUMThreshold && c.MeanExcess() >= floor
}

// MeanExcess is the mean S - mu0 since C left zero (0 when it is zero).
func (c *CUSUM) MeanExcess() float64 {
	if c.RunN == 0 {
		return 0
	}
	return c.RunExcess / float64(c.RunN)
}

// Reset zeroes the CUSUM and starts a cooldown of n cycles.
func (c *CUSUM) Reset(n int) { *c = CUSUM{Cooldown: n} }

// Signal is one cycle's evidence, as the status machine sees it.
type Signal struct {
	Gross   bool // a change large enough to act on at once
	Alarm   bool // the accumulating test alarms this cycle
	Confirm bool // this cycle on its own supports a pending alarm
	Quiet   bool // this cycle is within the baseline's noise
	// Identity is set when the identity tier (models, version, vLLM's
	// configuration info) differs from the baseline's this cycle.
	Identity bool
	Score    float64 // reported with the threshold it is compared with
	Thresh   float64
	Reason   string
}

// Detector is the drift status machine of one backend against its baseline:
// ok -> suspect on an alarm or an identity change; suspect -> drifted when
// the next cycle confirms (the alarm again with z >= ConfirmZ, or the
// identity change still there, or an identity suspicion backed by the
// logprob tier), back to ok otherwise; any -> drifted on a gross change;
// drifted -> ok after Recover quiet cycles with the baseline's identity.
// Every verdict resets the CUSUM with a cooldown.
type Detector struct {
	Status fleetwatch.DriftStatus
	Since  time.Time
	CUSUM  CUSUM
	// Quiet counts a drifted backend's consecutive quiet cycles.
	Quiet int
	// IdentityPending is set while the backend is suspect because of an
	// identity change.
	IdentityPending bool
	// ToolCUSUM is the tool-call tier's CUSUM, reset with CUSUM.
	ToolCUSUM CUSUM
}

// Transition is a status change.
type Transition struct {
	From, To fleetwatch.DriftStatus
	Signal   Signal
}

// Step applies one cycle's signal at now and returns the transition, if any.
func (d *Detector) Step(now time.Time, s Signal, p Params) (Transition, bool) {
	from := d.Status
	if from == "" || from == fleetwatch.DriftUnknown {
		from = fleetwatch.DriftOK
		d.Status = fleetwatch.DriftOK
	}
	to := from
	pending := false
	switch from {
	case fleetwatch.DriftOK:
		switch {
		case s.Gross:
			to = fleetwatch.DriftDrifted
		case s.Alarm:
			to = fleetwatch.DriftSuspect
		case s.Identity:
			to, pending = fleetwatch.DriftSuspect, true
		}
	case fleetwatch.DriftSuspect:
		switch {
		case s.Gross || s.Alarm && s.Confirm:
			to = fleetwatch.DriftDrifted
		case d.IdentityPending && s.Identity:
			to = fleetwatch.DriftDrifted
			s.Reason = "the identity change persisted for a second cycle: " + s.Reason
		case d.IdentityPending && (s.Alarm || s.Confirm):
			to = fleetwatch.DriftDrifted
			s.Reason = "the identity change is confirmed by the logprob tier: " + s.Reason
		case !d.IdentityPending && s.Identity:
			to = fleetwatch.DriftDrifted
			s.Reason = "the alarm is confirmed by an identity change: " + s.Reason
		default:
			to = fleetwatch.DriftOK
			s.Reason = "not confirmed: " + s.Reason
		}
	case fleetwatch.DriftDrifted:
		if s.Quiet && !s.Identity {
			d.Quiet++
		} else {
			d.Quiet = 0
		}
		if d.Quiet >= p.Recover {
			to = fleetwatch.DriftOK
			s.Reason = fmt.Sprintf("back within the baseline's noise for %d cycles: %s", d.Quiet, s.Reason)
		}
	}
	if to == from {
		return Transition{}, false
	}
	d.Status, d.Since, d.Quiet, d.IdentityPending = to, now, 0, pending
	if to != fleetwatch.DriftSuspect {
		d.CUSUM.Reset(p.Cooldown)
		d.ToolCUSUM.Reset(p.Cooldown)
	}
	return Transition{From: from, To: to, Signal: s}, true
}

// logprobSignal turns a logprob backend's statistics into a Signal: the
// gross rule on S2 and S3, the CUSUM on S4 (the persistent delta), which
// keeps run-to-run noise, however it varies from cycle to cycle, out of the
// accumulated evidence.
//
// The CUSUM runs on the persistence test ps (SampledPersistence), which
// scales each cycle by its own noise, with its Shift as the excess the
// floor applies to; for a baseline without position variances (stored
// before the test existed) it runs on S4's z against the enrolment null.
func logprobSignal(st Stats, ps Persistence, null NullModel, cu *CUSUM, p Params) Signal {
	z2, z3, z4 := null.S2.Z(st.S2), null.S3.Z(st.S3), null.S4.Z(st.S4)
	ex2, ex3, ex4 := st.S2-null.S2.Mu, st.S3-null.S3.Mu, st.S4-null.S4.Mu
	gross2 := ex2 >= p.GrossNats && z2 >= p.GrossZ
	gross3 := ex3 >= p.GrossNats && z3 >= p.GrossZ
	t4 := z4
	confirm := z4 >= p.ConfirmZ || z2 >= p.ConfirmZ || z3 >= p.ConfirmZ
	if ps.Own > 0 {
		// S2 and S3 follow the noise level of the cycle: under load a
		// noisy cycle has them above 2 whatever the artefact, so only the
		// persistence test confirms its own alarm
		t4, ex4 = ps.T, ps.Shift
		confirm = t4 >= p.ConfirmZ
	}
	alarm := cu.Update(t4, ex4, p.MinExcessNats, p)
	s := Signal{
		Gross:   gross2 || gross3,
		Alarm:   alarm,
		Confirm: confirm,
		Quiet:   !(z2 >= p.QuietZ) && !(z3 >= p.QuietZ) && !(t4 >= p.QuietZ),
	}
	switch {
	case s.Gross:
		s.Score, s.Thresh = max(z2, z3), p.GrossZ
		s.Reason = fmt.Sprintf("gross change: S2 %.4f nats (baseline %.4f, z %.1f), S3 %.4f nats (baseline %.4f, z %.1f)",
			st.S2, null.S2.Mu, z2, st.S3, null.S3.Mu, z3)
	default:
		s.Score, s.Thresh = cu.C, p.CUSUMThreshold
		if ps.Own > 0 {
			s.Reason = fmt.Sprintf("CUSUM %.1f (threshold %.0f) on the persistence test: T %.1f, shared shift %.4f nats, mean excess %.4f nats (floor %.3f); S4 %.4f nats (baseline %.4f, z %.1f), S2 %.4f nats z %.1f, S3 z %.1f",
				cu.C, p.CUSUMThreshold, ps.T, ps.Shift, cu.MeanExcess(), p.MinExcessNats, st.S4, null.S4.Mu, z4, st.S2, z2, z3)
		} else {
			s.Reason = fmt.Sprintf("CUSUM %.1f (threshold %.0f) on the persistent delta: S4 %.4f nats (baseline %.4f, z %.1f), mean excess %.4f nats (floor %.3f); S2 %.4f nats z %.1f, S3 z %.1f",
				cu.C, p.CUSUMThreshold, st.S4, null.S4.Mu, z4, cu.MeanExcess(), p.MinExcessNats, st.S2, z2, z3)
		}
	}
	if st.Stable > 0 && st.Mismatched > 0 {
		s.Reason += fmt.Sprintf("; greedy output changed on %d of %d stable prompts", st.Mismatched, st.Stable)
	}
	return s
}
