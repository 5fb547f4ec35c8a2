package probes

import (
	"errors"
	"reflect"

	"github.com/VictoriaMetrics/metrics"
)

// ErrUpdateWhileRunning is returned by Update while Run runs.
var ErrUpdateWhileRunning = errors.New("probes: Update while Run runs")

// Update replaces the Prober's settings (a configuration reload): targets
// added or removed, a new schedule, timeout, suite or enrolment. A target
// that stays (same pool and backend) keeps its state: its monitor, with
// the baseline and the CUSUM, its peer status, its last alert and its
// status. Its monitor is loaded again from the stores (the baseline and the
// drift state, as at a restart) only when the monitor's own settings
// change (Suite, Enrol, EnrolMin, Params): a new suite means enrolling
// again, as it does at start; an enrolment in progress starts over then.
//
// Fields of s left nil keep the Prober's: Store and States (so that
// in-memory baselines survive), HTTPClient, Metrics. Metrics keeps
// counting in the Prober's set whatever s says.
//
// Update must not be called while Run runs (it returns
// ErrUpdateWhileRunning): call it after Run returned (or before the first
// Run), then Run again. It reopens a closed Prober: Run works again after
// it. It validates s as New does and changes nothing when s is invalid.
func (p *Prober) Update(s Settings) error {
	p.mu.Lock()
	old := p.s
	p.mu.Unlock()
	if s.Store == nil {
		s.Store = old.Store
	}
	if s.States == nil {
		s.States = old.States
	}
	if s.HTTPClient == nil {
		s.HTTPClient = old.HTTPClient
	}
	// New registers a metrics writer of its own: give it a private set.
	scratch := s
	scratch.Metrics = metrics.NewSet()
	q, err := New(scratch)
	if err != nil {
		return err
	}
	q.s.Metrics = old.Metrics
	remonitor := q.suite.Hash != p.suite.Hash || q.s.Enrol != old.Enrol || q.s.EnrolMin != old.EnrolMin ||
		!reflect.DeepEqual(q.s.Params, old.Params)

	p.mu.Lock()
	running := p.running
	p.mu.Unlock()
	if running {
		return ErrUpdateWhileRunning
	}
	for _, k := range q.order {
		st := p.backends[k]
		if st == nil {
			continue // a new target: q's state
		}
		fresh := q.backends[k]
		st.run.Lock()
		if !reflect.DeepEqual(st.t, fresh.t) {
			st.t, st.client = fresh.t, fresh.client
		}
		st.offset = fresh.offset
		if remonitor {
			st.mon = nil
		}
		st.run.Unlock()
		p.mu.Lock()
		st.budget.update(fresh.t.BudgetTokensPerDay, q.suite.Hash != p.suite.Hash) // the spend stays
		p.mu.Unlock()
		q.backends[k] = st
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range q.order {
		st := q.backends[k]
		st.queued = false
		if remonitor {
			st.reported = "" // tell the Sink whatever the status is
		}
	}
	p.s, p.suite, p.sched, p.estimates = q.s, q.suite, q.sched, q.estimates
	p.backends, p.order, p.urgent = q.backends, q.order, q.urgent
	p.closed, p.cancel = false, nil
	return nil
}
