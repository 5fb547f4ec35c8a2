package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/alert"
)

// What operators reach for during an incident: /api/explain (why a backend
// is in its state, with what weight) and the notifications of the alerts
// block (internal/alert), fed from the evaluation loop's transitions, the
// drift alerts and the review digests.

// Explained is the answer of /api/explain: one explanation per backend asked
// for (every backend of the pool when no backend is given).
type Explained struct {
	Pool     string               `json:"pool"`
	Backends []BackendExplanation `json:"backends"`
}

// BackendExplanation is the analyzer's explanation of one backend with its
// last state changes.
type BackendExplanation struct {
	analyzer.Explanation
	// Transitions are the backend's last state changes, newest first.
	Transitions []ExplainTransition `json:"transitions"`
}

// ExplainTransition is one state change with its reason.
type ExplainTransition struct {
	At     fleetwatch.Time  `json:"at"`
	From   fleetwatch.State `json:"from"`
	To     fleetwatch.State `json:"to"`
	Cause  string           `json:"cause"`
	Reason string           `json:"reason"`
}

// explain explains backend of pool at now (every backend of the pool when
// backend is ""); ok is false when the pool or the backend is unknown.
func (s *Server) explain(pool, backend string, now time.Time) (Explained, bool) {
	out := Explained{Pool: pool, Backends: []BackendExplanation{}}
	var es []analyzer.Explanation
	if backend == "" {
		all, found := s.an.ExplainPool(pool, now)
		if !found {
			return out, false
		}
		es = all
	} else {
		e, found := s.an.Explain(pool, backend, now)
		if !found {
			return out, false
		}
		es = []analyzer.Explanation{e}
	}
	for _, e := range es {
		be := BackendExplanation{Explanation: e, Transitions: []ExplainTransition{}}
		for _, t := range s.rec.tlog.newestFirst(pool, e.Backend) {
			be.Transitions = append(be.Transitions, ExplainTransition{At: fleetwatch.At(t.At), From: t.From, To: t.To, Cause: t.Cause, Reason: t.Reason})
		}
		out.Backends = append(out.Backends, be)
	}
	return out, true
}

// handleExplain serves GET /api/explain?pool=P[&backend=B].
func (s *Server) handleExplain(w http.ResponseWriter, r *http.Request) {
	pool, backend := r.URL.Query().Get("pool"), r.URL.Query().Get("backend")
	w.Header().Set("Content-Type", "application/json")
	if pool == "" {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"error": "the pool parameter is required: /api/explain?pool=P[&backend=B]"})
		return
	}
	out, found := s.explain(pool, backend, time.Now())
	if !found {
		w.WriteHeader(http.StatusNotFound)
		what := "pool " + pool
		if backend != "" {
			what = "backend " + backend + " of " + what
		}
		json.NewEncoder(w).Encode(map[string]string{"error": what + " is not known to the analyzer"})
		return
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}

// transitionsPerExplain is how many transitions /api/explain keeps per
// backend.
const transitionsPerExplain = 10

// transitionLog keeps each backend's last transitions, as the analyzer
// reported them (with their causes). A backend's log is forgotten when it
// expires, so ids invented by a publisher leave nothing behind. The zero
// value works.
type transitionLog struct {
	mu   sync.Mutex // guards last
	last map[seriesKey][]analyzer.Transition
}

func (l *transitionLog) record(ts []analyzer.Transition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[seriesKey][]analyzer.Transition{}
	}
	for _, t := range ts {
		k := seriesKey{t.Pool, t.Backend}
		if t.To == "" {
			delete(l.last, k)
			continue
		}
		l.last[k] = appendBounded(l.last[k], t, transitionsPerExplain)
	}
}

// newestFirst returns a backend's logged transitions, newest first.
func (l *transitionLog) newestFirst(pool, backend string) []analyzer.Transition {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.last[seriesKey{pool, backend}]
	out := make([]analyzer.Transition, 0, len(ts))
	for i := len(ts) - 1; i >= 0; i-- {
		out = append(out, ts[i])
	}
	return out
}

// buildAlerts makes the notifier when the file configures receivers.
func (s *Server) buildAlerts() error {
	if len(s.cfg.Alerts.Receivers) == 0 {
		return nil
	}
	getenv := s.opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	as, err := s.cfg.AlertSettings(getenv)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	as.Metrics, as.Logf = s.metrics, s.logf
	n, err := alert.New(as)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.notifier = n
	return nil
}

// afterTransitions logs an evaluation's transitions for /api/explain and
// hands them to the notifier, with the state of every pool they touched.
func (s *Server) afterTransitions(ts []analyzer.Transition, now time.Time) {
	if len(ts) == 0 {
		return
	}
	s.rec.tlog.record(ts)
	if s.notifier == nil {
		return
	}
	pools := map[string]bool{}
	for _, t := range ts {
		s.notifier.Transition(t)
		pools[t.Pool] = true
	}
	for pool := range pools {
		snap, _ := s.an.Snapshot(pool, now) // an unknown pool has no backends
		open, closed := 0, 0
		for _, b := range snap.Backends {
			switch b.State {
			case fleetwatch.StateOpen:
				open++
			case fleetwatch.StateClosed:
				closed++
			}
		}
		s.notifier.PoolState(pool, open, closed, len(snap.Backends), now)
	}
}

// notifyDrift hands a drift alert to the notifier.
func (s *Server) notifyDrift(a fleetwatch.DriftAlert) {
	if s.notifier != nil {
		s.notifier.Drift(a)
	}
}

// notifyReview hands a review digest to the notifier.
func (s *Server) notifyReview(r fleetwatch.DriftReview) {
	if s.notifier != nil {
		s.notifier.Review(r)
	}
}
