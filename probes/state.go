package probes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// StateVersion is the version of the stored drift state format.
const StateVersion = 1

// StateStore persists each backend's drift state (DriftState), one value
// per pool and backend. Load returns ErrNoState (or ErrNoBaseline) when
// nothing is stored. The serve wiring implements it on the JetStream KV
// bucket fw_drift.
type StateStore interface {
	Load(ctx context.Context, pool, backend string) ([]byte, error)
	Save(ctx context.Context, pool, backend string, data []byte) error
}

// ErrNoState is returned by a StateStore's Load when nothing is stored.
var ErrNoState = errors.New("probes: no drift state")

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

// exportState is the monitor's part of its backend's DriftState.
func (m *Monitor) exportState() DriftState {
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

// importState continues from a stored state when it belongs to the
// monitor's baseline and suite; it reports whether it did.
func (m *Monitor) importState(s *DriftState) bool {
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

// memStates is the in-memory StateStore used when none is given.
type memStates struct{ memStore }

func (s *memStates) Load(ctx context.Context, pool, backend string) ([]byte, error) {
	d, err := s.memStore.Load(ctx, pool, backend)
	if errors.Is(err, ErrNoBaseline) {
		return nil, ErrNoState
	}
	return d, err
}

// loadState reads the stored state of st's backend; nil when there is none
// or it is unusable (logged).
func (p *Prober) loadState(ctx context.Context, st *backendState) *DriftState {
	data, err := p.s.States.Load(ctx, st.t.Pool, st.t.Backend)
	switch {
	case errors.Is(err, ErrNoState), errors.Is(err, ErrNoBaseline), err == nil && len(data) == 0:
		return nil
	case err != nil:
		p.s.Logf("probes: %s/%s: load drift state: %v (starting from the baseline alone)", st.t.Pool, st.t.Backend, err)
		return nil
	}
	s, err := UnmarshalState(data)
	if err != nil {
		p.s.Logf("probes: %s/%s: stored drift state unusable: %v", st.t.Pool, st.t.Backend, err)
		return nil
	}
	st.saveMu.Lock()
	st.saved = data // what is stored: no need to write it again
	st.saveMu.Unlock()
	return s
}

// stateLocked is the backend's DriftState now. Called with p.mu held.
func (p *Prober) stateLocked(st *backendState) DriftState {
	s := st.monState
	s.Peers, s.PeersSince = st.peer, st.peerSince
	s.LastAlert = st.lastAlert
	s.Quarantined = p.s.Quarantine && st.snap.Status == fleetwatch.DriftDrifted
	return s
}

// saveState writes the backend's state when it differs from what was
// stored last. Saves of one backend are serialised, and each writes the
// state as it is when it runs, so the last write is the newest state. The
// cancellation of ctx does not stop it (a shutdown must not lose the last
// change). Called with no lock held.
func (p *Prober) saveState(ctx context.Context, st *backendState) {
	st.saveMu.Lock()
	defer st.saveMu.Unlock()
	p.mu.Lock()
	loaded := st.monState.V != 0
	s := p.stateLocked(st)
	p.mu.Unlock()
	if !loaded {
		// not loaded yet (a peer's comparison at start): what is stored
		// is newer than anything here
		return
	}
	data, err := json.Marshal(s)
	if err != nil {
		p.s.Logf("probes: %s/%s: encode drift state: %v", st.t.Pool, st.t.Backend, err)
		return
	}
	if bytes.Equal(data, st.saved) {
		return
	}
	// A change made just before shutdown must still be stored: the save
	// outlives the cancellation of the cycle's context (Run waits for it),
	// bounded by the probe timeout.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.s.Timeout)
	defer cancel()
	if err := p.s.States.Save(ctx, st.t.Pool, st.t.Backend, data); err != nil {
		p.metrics.stateErrors.Inc()
		p.s.Logf("probes: %s/%s: save drift state: %v", st.t.Pool, st.t.Backend, err)
		return
	}
	p.metrics.stateSaves.Inc()
	st.saved = data
}

// Restore reloads the baseline and the stored drift state of every target
// of pools (nil: every pool) and tells the Sink each backend's status,
// changed or not: what a new owner of a pool calls when it takes the pool
// over, so that a drifted, quarantined backend stays out of rotation. It
// waits for a running cycle of the backend to finish. Errors are reported
// as probe errors, and the first is returned.
func (p *Prober) Restore(ctx context.Context, pools []string) error {
	var want map[string]bool
	if pools != nil {
		want = map[string]bool{}
		for _, pool := range pools {
			want[pool] = true
		}
	}
	return p.loadAll(ctx, want, true)
}

// BackendStatus is the status a stored state stands for, as `drift status`
// shows it when no running serve answers: the worse of the baseline and
// peer statuses, the CUSUM, the cooldown, the quarantine and the last
// alert.
func (s *DriftState) BackendStatus() BackendStatus {
	peers := s.Peers
	if peers == "" {
		peers = fleetwatch.DriftOK
	}
	bs := BackendStatus{Pool: s.Pool, Backend: s.Backend, Baseline: s.Status, BaselineSince: s.Since, Peers: peers,
		PeersSince: s.PeersSince, Enrolling: s.BaselineCreated.IsZero(), BaselineCreated: s.BaselineCreated,
		Score: s.Score, Threshold: s.Threshold, Z: math.NaN(), CUSUM: s.CUSUM.C, Cooldown: s.CUSUM.Cooldown,
		IdentityPending: s.IdentityPending, Quarantined: s.Quarantined, LastAlert: s.LastAlert, LastCycle: s.LastCycle}
	bs.Status, bs.Since = worse(s.Status, peers), s.Since
	if bs.Status == peers && peers != fleetwatch.DriftOK && bs.Status != s.Status {
		bs.Since = s.PeersSince
	}
	return bs
}
