package route

import (
	"fmt"
	"io"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// routerMetrics are the router's metrics in its Settings.Metrics set:
//
//	fleetwatch_route_attempts_total{pool,backend,code}  attempts by backend and status (0: no answer)
//	fleetwatch_route_requests_total{pool,code}          client requests by the status they got (499: client left)
//	fleetwatch_route_retries_total{pool}                retried attempts
//	fleetwatch_route_shed_total{pool}                   picks refused because every backend is open
//	fleetwatch_route_retry_budget_exhausted_total{pool} retries refused by the retry budget
//	fleetwatch_route_pick_duration_seconds              time spent in the picker (histogram)
//	fleetwatch_route_load_reports_total{pool,result}    ORCA load reports read (ok) or not understood (invalid)
//	fleetwatch_route_retry_hint_malformed_total{pool,source} retry hints of 429/5xx answers that did not parse, ignored
//	                                                    (source: a retryhint.Sources value)
//	fleetwatch_route_stream_errors_total{pool,backend,reason} 2xx streams that failed on the way, published
//	                                                    as outcome error (reason: error_event or cut; check.go)
//	fleetwatch_route_model_mismatch_total{pool,backend} answers that named another model than the one asked for
//	fleetwatch_route_tool_call_broken_total{pool,backend} answers whose required tool call is missing or whose
//	                                                    arguments are not JSON
//	fleetwatch_route_fake_stream_total{pool,backend}    streams whose content arrived at once after the wait
//
// and, written at scrape time from the pools' current state, so that a
// backend a decision no longer names leaves no stale series:
//
//	fleetwatch_route_decision_age_seconds{pool}   age of the decision applied (-1: none yet)
//	fleetwatch_route_in_flight{pool,backend}      this router's requests in progress
//	fleetwatch_route_backend_weight{pool,backend} the weight of the decision applied
//	fleetwatch_route_backend_open{pool,backend}   1 when the decision applied is open
//
// and the shadow-mode series of shadow.go (fleetwatch_route_shadow_*).
//
// Pool and backend labels only ever name configured pools and backends
// (the applied snapshot is filtered to them), never an id from outside.
// The OutcomePublisher adds fleetwatch_route_events_* to the set it is
// given.
type routerMetrics struct {
	set         *metrics.Set
	pickSeconds *metrics.Histogram

	// counters caches labelled counters, so the hot path formats no names.
	counters sync.Map // counterKey -> *metrics.Counter
}

type counterKey struct {
	kind          uint8
	pool, backend string
	source        string // kindHintMalformed: a retryhint.Sources value; kindStreamError: the reason
	code          int
}

const (
	kindAttempt uint8 = iota
	kindRequest
	kindRetry
	kindShed
	kindBudget
	kindLoadOK
	kindLoadInvalid
	kindHintMalformed
	kindStreamError
	kindModelMismatch
	kindToolCallBroken
	kindFakeStream
)

func newRouterMetrics(set *metrics.Set, rt *Router) *routerMetrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &routerMetrics{
		set:         set,
		pickSeconds: set.GetOrCreateHistogram(`fleetwatch_route_pick_duration_seconds`),
	}
	set.RegisterMetricsWriter(rt.writeGauges)
	set.RegisterMetricsWriter(rt.writeShadow)
	return m
}

func (m *routerMetrics) counter(k counterKey) *metrics.Counter {
	if c, ok := m.counters.Load(k); ok {
		return c.(*metrics.Counter)
	}
	pool := promlabel.Quote(k.pool)
	var name string
	switch k.kind {
	case kindAttempt:
		name = fmt.Sprintf(`fleetwatch_route_attempts_total{pool=%s,backend=%s,code="%d"}`,
			pool, promlabel.Quote(k.backend), k.code)
	case kindRequest:
		name = fmt.Sprintf(`fleetwatch_route_requests_total{pool=%s,code="%d"}`, pool, k.code)
	case kindRetry:
		name = fmt.Sprintf(`fleetwatch_route_retries_total{pool=%s}`, pool)
	case kindShed:
		name = fmt.Sprintf(`fleetwatch_route_shed_total{pool=%s}`, pool)
	case kindBudget:
		name = fmt.Sprintf(`fleetwatch_route_retry_budget_exhausted_total{pool=%s}`, pool)
	case kindLoadOK:
		name = fmt.Sprintf(`fleetwatch_route_load_reports_total{pool=%s,result="ok"}`, pool)
	case kindLoadInvalid:
		name = fmt.Sprintf(`fleetwatch_route_load_reports_total{pool=%s,result="invalid"}`, pool)
	case kindHintMalformed:
		name = fmt.Sprintf(`fleetwatch_route_retry_hint_malformed_total{pool=%s,source=%s}`, pool, promlabel.Quote(k.source))
	case kindStreamError:
		name = fmt.Sprintf(`fleetwatch_route_stream_errors_total{pool=%s,backend=%s,reason=%s}`,
			pool, promlabel.Quote(k.backend), promlabel.Quote(k.source))
	case kindModelMismatch:
		name = fmt.Sprintf(`fleetwatch_route_model_mismatch_total{pool=%s,backend=%s}`, pool, promlabel.Quote(k.backend))
	case kindToolCallBroken:
		name = fmt.Sprintf(`fleetwatch_route_tool_call_broken_total{pool=%s,backend=%s}`, pool, promlabel.Quote(k.backend))
	case kindFakeStream:
		name = fmt.Sprintf(`fleetwatch_route_fake_stream_total{pool=%s,backend=%s}`, pool, promlabel.Quote(k.backend))
	}
	c, _ := m.counters.LoadOrStore(k, m.set.GetOrCreateCounter(name))
	return c.(*metrics.Counter)
}

func (m *routerMetrics) attempt(pool, backend string, code int) *metrics.Counter {
	return m.counter(counterKey{kind: kindAttempt, pool: pool, backend: backend, code: code})
}

func (m *routerMetrics) clientCode(pool string, code int) *metrics.Counter {
	return m.counter(counterKey{kind: kindRequest, pool: pool, code: code})
}

func (m *routerMetrics) retry(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindRetry, pool: pool})
}

func (m *routerMetrics) shed(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindShed, pool: pool})
}

func (m *routerMetrics) budgetExhausted(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindBudget, pool: pool})
}

func (m *routerMetrics) loadReport(pool string, valid bool) *metrics.Counter {
	if valid {
		return m.counter(counterKey{kind: kindLoadOK, pool: pool})
	}
	return m.counter(counterKey{kind: kindLoadInvalid, pool: pool})
}

func (m *routerMetrics) hintMalformed(pool, source string) *metrics.Counter {
	return m.counter(counterKey{kind: kindHintMalformed, pool: pool, source: source})
}

func (m *routerMetrics) streamError(pool, backend, reason string) *metrics.Counter {
	return m.counter(counterKey{kind: kindStreamError, pool: pool, backend: backend, source: reason})
}

func (m *routerMetrics) modelMismatch(pool, backend string) *metrics.Counter {
	return m.counter(counterKey{kind: kindModelMismatch, pool: pool, backend: backend})
}

func (m *routerMetrics) toolCallBroken(pool, backend string) *metrics.Counter {
	return m.counter(counterKey{kind: kindToolCallBroken, pool: pool, backend: backend})
}

func (m *routerMetrics) fakeStream(pool, backend string) *metrics.Counter {
	return m.counter(counterKey{kind: kindFakeStream, pool: pool, backend: backend})
}

// writeGauges writes the per-pool and per-backend gauges from the pools'
// current state; the metrics set calls it on every scrape.
func (rt *Router) writeGauges(w io.Writer) {
	now := rt.now()
	for _, id := range rt.core.ids {
		p := rt.core.pools[id]
		pool := promlabel.Quote(id)
		snap := p.applied.Load()
		age := -1.0
		if snap.Epoch != configEpoch {
			age = now.Sub(p.confirmedAt(snap)).Seconds()
		}
		fmt.Fprintf(w, "fleetwatch_route_decision_age_seconds{pool=%s} %g\n", pool, age)
		fmt.Fprintf(w, "fleetwatch_route_pick_candidates{pool=%s} %d\n", pool, p.picker.Compared())
		for _, b := range snap.Backends {
			be := promlabel.Quote(b.Backend)
			open := 0
			if b.State == fleetwatch.StateOpen {
				open = 1
			}
			fmt.Fprintf(w, "fleetwatch_route_in_flight{pool=%s,backend=%s} %d\n", pool, be, p.picker.InFlight(b.Backend))
			fmt.Fprintf(w, "fleetwatch_route_backend_weight{pool=%s,backend=%s} %g\n", pool, be, b.Weight)
			fmt.Fprintf(w, "fleetwatch_route_backend_open{pool=%s,backend=%s} %d\n", pool, be, open)
		}
	}
}
