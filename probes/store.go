package probes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Store persists one value per pool and backend. The Prober keeps the
// baselines in one (Settings.Store: Load returns ErrNoBaseline when there
// is none; the wiring implements it on the JetStream KV bucket
// fw_probe_baselines) and each backend's drift state (drift.DriftState) in
// another (Settings.States: Load returns ErrNoState, or ErrNoBaseline, when
// nothing is stored; the bucket fw_drift).
type Store interface {
	Load(ctx context.Context, pool, backend string) ([]byte, error)
	Save(ctx context.Context, pool, backend string, data []byte) error
}

// ErrNoBaseline is returned by a baseline Store's Load when nothing is stored.
var ErrNoBaseline = errors.New("probes: no baseline")

// ErrNoState is returned by a state Store's Load when nothing is stored.
var ErrNoState = errors.New("probes: no drift state")

// memStates is the in-memory state Store used when none is given.
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
func (p *Prober) loadState(ctx context.Context, st *backendState) *drift.DriftState {
	data, err := p.s.States.Load(ctx, st.t.Pool, st.t.Backend)
	switch {
	case errors.Is(err, ErrNoState), errors.Is(err, ErrNoBaseline), err == nil && len(data) == 0:
		return nil
	case err != nil:
		p.s.Logf("probes: %s/%s: load drift state: %v (starting from the baseline alone)", st.t.Pool, st.t.Backend, err)
		return nil
	}
	s, err := drift.UnmarshalState(data)
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
func (p *Prober) stateLocked(st *backendState) drift.DriftState {
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

// StoredStatus is the status a stored state stands for, as `drift status`
// shows it when no running serve answers: the worse of the baseline and
// peer statuses, the CUSUM, the cooldown, the quarantine and the last
// alert.
func StoredStatus(s *drift.DriftState) BackendStatus {
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
