package serve

import (
	"net/http"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/probes"
)

// The status page's view of the server (statusSource).

// ingested returns the collector's counters for the status page.
func (s *Server) ingested() ingestCounts {
	st := s.col.Stats()
	ic := ingestCounts{
		Received:            int64(st.AcceptedTotal()),
		Accepted:            int64(st.AcceptedTotal()),
		RejectsByReason:     map[string]int64{},
		Skewed:              int64(st.Skewed),
		Dropped:             int64(st.Dropped),
		CaptureReplayed:     int64(st.CaptureReplayed),
		CaptureUnreplayed:   int64(st.CaptureUnreplayed),
		CaptureDeduplicated: int64(st.CaptureDeduplicated),
		IntakeLost:          int64(st.IntakeLost),

		CaptureUncoveredSeconds: st.CaptureUncoveredSeconds,
	}
	h, _ := s.ingestHealth()
	ic.Mode, _ = h["mode"].(string)
	ic.Loss, _ = h["loss"].(string)
	for reason, n := range st.Rejected {
		if n > 0 {
			ic.RejectsByReason[string(reason)] = int64(n)
		}
		ic.Rejected += int64(n)
	}
	ic.Received += ic.Rejected
	return ic
}

// driftAlerts returns the latest n drift alerts, newest first.
func (s *Server) driftAlerts(n int) []fleetwatch.DriftAlert {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	out := make([]fleetwatch.DriftAlert, 0, min(n, len(s.rec.alerts)))
	for i := len(s.rec.alerts) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, s.rec.alerts[i])
	}
	return out
}

// maxKeptAlerts bounds the drift alerts kept in memory for the status page.
const maxKeptAlerts = 200

// noteAlert remembers a drift alert for the status page.
func (s *Server) noteAlert(a fleetwatch.DriftAlert) {
	s.rec.mu.Lock()
	s.rec.alerts = append(s.rec.alerts, a)
	if len(s.rec.alerts) > maxKeptAlerts {
		s.rec.alerts = append(s.rec.alerts[:0], s.rec.alerts[len(s.rec.alerts)-maxKeptAlerts:]...)
	}
	s.rec.mu.Unlock()
}

// nextReview is when the drift review runs next (zero when not scheduled).
func (s *Server) nextReview() time.Time {
	cfg := s.config()
	if cfg.Probes.Disabled || cfg.Review.Schedule == "" {
		return time.Time{}
	}
	sched, err := probes.ParseSchedule(cfg.Review.Schedule)
	if err != nil {
		return time.Time{}
	}
	return sched.Next(time.Now())
}

// probeBudgets returns the running probes' budgets and spend: the
// backends with a budget or a spend in the last 24 hours.
func (s *Server) probeBudgets() []probeBudget {
	s.mu.Lock()
	d := s.drift
	s.mu.Unlock()
	if d == nil {
		return nil
	}
	return budgetsOf(d.prober.Statuses())
}

// budgetsOf is the page's view of the statuses' budgets.
func budgetsOf(statuses []probes.BackendStatus) []probeBudget {
	var out []probeBudget
	for _, st := range statuses {
		b := st.Budget
		if b == nil || b.TokensPerDay == 0 && b.SpentTotal == 0 {
			continue
		}
		out = append(out, probeBudget{Pool: st.Pool, Backend: st.Backend, Status: st.Status, Note: b.SkipNote(),
			Summary: control.BudgetLine(b), Budget: b})
	}
	return out
}

func (s *Server) statusRoutes(mux *http.ServeMux) { statusRoutes(mux, s, s.hist) }

// probeDepsOf is what startProbes needs to start the probes of cfg;
// prober, when not nil, is the prober of an earlier start to update and
// reuse (a reload).
func (s *Server) probeDepsOf(cfg *config.Config, prober *probes.Prober) probeDeps {
	return probeDeps{
		cfg:          cfg,
		prober:       prober,
		nc:           s.nc,
		js:           s.js,
		prefix:       s.cfg.Prefix,
		getenv:       s.opts.Getenv,
		setDrift:     s.an.SetDrift,
		fingerprints: s.fps,
		metrics:      s.metrics,
		logf:         s.logf,
		onReview:     s.notifyReview,
		owns: func(pool string) bool {
			_, ok, _ := s.leases.Owns(pool, time.Now())
			return ok
		},
		leader: s.leases.Leader,
		onAlert: func(a fleetwatch.DriftAlert) {
			s.noteAlert(a)
			s.notifyDrift(a)
			if s.opts.OnAlert != nil {
				s.opts.OnAlert(a)
			}
		},
	}
}

// record is what happened, for the status page, /metrics and
// /api/explain: the latest drift alerts, the transitions counted per
// series, and each backend's last transitions.
type record struct {
	mu          sync.Mutex // guards alerts and transitions
	alerts      []fleetwatch.DriftAlert
	transitions map[transitionKey]uint64
	tlog        transitionLog
}

// transitionKey names one series of fleetwatch_breaker_transitions_total.
type transitionKey struct {
	pool, backend string
	to            fleetwatch.State
	cause         string
}

// transitionCauses are the causes a counted transition can have (a cause
// added to the analyzer and missing here is still forgotten at the next
// scrape).
var transitionCauses = []string{
	analyzer.CauseFailureRate, analyzer.CauseConsecutive, analyzer.CauseThrottled, analyzer.CauseSlow, analyzer.CauseClientError,
	analyzer.CauseHalfOpenFailure, analyzer.CauseHalfOpenThrottled, analyzer.CauseHalfOpenClientErr, analyzer.CauseOpenElapsed, analyzer.CauseRecovered,
}

// countTransition counts a breaker transition. The series is written at
// scrape time, and only while its backend is in a snapshot, so backend ids
// invented by a publisher leave no series behind once they expire.
//
// An expiry (To "") is not counted: it forgets the backend's counts at
// once, so that they never outlive it when nobody scrapes.
func (s *Server) countTransition(t analyzer.Transition) {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	if t.To == "" {
		for _, to := range []fleetwatch.State{fleetwatch.StateOpen, fleetwatch.StateHalfOpen, fleetwatch.StateClosed} {
			for _, cause := range transitionCauses {
				delete(s.rec.transitions, transitionKey{t.Pool, t.Backend, to, cause})
			}
		}
		return
	}
	if s.rec.transitions == nil {
		s.rec.transitions = map[transitionKey]uint64{}
	}
	s.rec.transitions[transitionKey{t.Pool, t.Backend, t.To, t.Cause}]++
}
