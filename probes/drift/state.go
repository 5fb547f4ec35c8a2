package drift

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// StateVersion is the version of the stored drift state format.
const StateVersion = 1

// DriftState is what a backend's drift judgement needs to survive a restart
// or a move to another owner: its status against its baseline and against
// its peers, the CUSUM with its cooldown, a pending identity suspicion,
// the last alert, whether it is quarantined, and what the next cycle is
// compared with (the last judged cycle for S4, the last identity seen). It
// belongs to one baseline (BaselineCreated): a state of another baseline,
// or of another suite, is ignored.
type DriftState struct {
	V               int                    `json:"v"`
	Pool            string                 `json:"pool"`
	Backend         string                 `json:"backend"`
	SuiteHash       string                 `json:"suite_hash"`
	BaselineCreated time.Time              `json:"baseline_created"`
	Status          fleetwatch.DriftStatus `json:"status"` // against the baseline
	Since           time.Time              `json:"since"`
	CUSUM           CUSUM                  `json:"cusum"`
	// ToolCUSUM is the tool-call tier's CUSUM.
	ToolCUSUM CUSUM `json:"tool_cusum"`
	// Quiet counts the quiet cycles of a drifted backend towards recovery.
	Quiet int `json:"quiet"`
	// IdentityPending is set while the backend is suspect because its
	// identity tier changed.
	IdentityPending bool                   `json:"identity_pending,omitempty"`
	Peers           fleetwatch.DriftStatus `json:"peers"`
	PeersSince      time.Time              `json:"peers_since"`
	// Quarantined is true when the backend is drifted and the wiring
	// quarantines drifted backends (weight 0).
	Quarantined bool                   `json:"quarantined"`
	LastAlert   *fleetwatch.DriftAlert `json:"last_alert,omitempty"`
	Score       float64                `json:"score"`
	Threshold   float64                `json:"threshold"`
	LastCycle   time.Time              `json:"last_cycle"`
	Identity    *Identity              `json:"identity,omitempty"`
	Prev        *Cycle                 `json:"prev,omitempty"`
	// Recent are the last judged cycles: of a black-box backend, the MMD
	// sample; of a logprob backend, the sampled persistence test's window.
	Recent []*Cycle `json:"recent,omitempty"`
	// TeacherCUSUM is the teacher-forced tier's CUSUM, when the baseline
	// has that tier (its previous scores are Prev's).
	TeacherCUSUM *CUSUM `json:"teacher_cusum,omitempty"`
}

// UnmarshalState decodes a stored drift state.
func UnmarshalState(data []byte) (*DriftState, error) {
	var s DriftState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("probes: decode drift state: %w", err)
	}
	if s.V != StateVersion {
		return nil, fmt.Errorf("probes: drift state version %d, want %d", s.V, StateVersion)
	}
	return &s, nil
}

// ExportState is the monitor's part of its backend's DriftState.
func (m *Monitor) ExportState() DriftState {
	s := DriftState{V: StateVersion, Pool: m.Pool, Backend: m.Backend, SuiteHash: m.suite.Hash,
		Status: m.det.Status, Since: m.det.Since, CUSUM: m.det.CUSUM, ToolCUSUM: m.det.ToolCUSUM, Quiet: m.det.Quiet,
		IdentityPending: m.det.IdentityPending, Identity: m.identity, Prev: m.prev,
		Score: finite(m.last.Signal.Score), Threshold: m.last.Signal.Thresh, LastCycle: m.last.At}
	if m.baseline != nil {
		s.BaselineCreated = m.baseline.Created
	}
	if len(m.recent) > 0 {
		s.Recent = append([]*Cycle(nil), m.recent...)
	}
	m.exportTeacher(&s)
	return s
}

// ImportState continues from a stored state when it belongs to the
// monitor's baseline and suite; it reports whether it did.
func (m *Monitor) ImportState(s *DriftState) bool {
	if m.baseline == nil || s.SuiteHash != m.suite.Hash || !s.BaselineCreated.Equal(m.baseline.Created) {
		return false
	}
	switch s.Status {
	case fleetwatch.DriftOK, fleetwatch.DriftSuspect, fleetwatch.DriftDrifted:
	default:
		return false
	}
	m.det = Detector{Status: s.Status, Since: s.Since, CUSUM: s.CUSUM, ToolCUSUM: s.ToolCUSUM, Quiet: s.Quiet, IdentityPending: s.IdentityPending}
	if s.Identity != nil {
		id := *s.Identity
		m.identity = &id
	}
	if s.Prev != nil && len(s.Prev.Obs) == len(m.suite.Prompts) {
		m.prev = s.Prev
	}
	for _, c := range s.Recent {
		if c != nil && len(c.Obs) == len(m.suite.Prompts) {
			m.recent = append(m.recent, c)
		}
	}
	m.importTeacher(s)
	// the last cycle's statistics are not stored: S2's z is unknown (NaN)
	m.last = Result{At: s.LastCycle, Signal: Signal{Score: s.Score, Thresh: s.Threshold}, Stats: Stats{S2: math.NaN()}}
	return true
}
