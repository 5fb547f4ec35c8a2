package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
)

// routeMetrics are the router's own metrics, served on its /metrics in the
// Prometheus text format:
//
//	fleetwatch_route_attempts_total{pool,backend,code}  attempts by backend and status (0: no answer)
//	fleetwatch_route_requests_total{pool,code}          client requests by the status they got (499: client left)
//	fleetwatch_route_retries_total{pool}                retried attempts
//	fleetwatch_route_shed_total{pool}                   picks refused because every backend is open
//	fleetwatch_route_retry_budget_exhausted_total{pool} retries refused by the retry budget
//	fleetwatch_route_pick_duration_seconds              time spent in the picker (histogram)
//	fleetwatch_route_events_published_total             outcome events handed to NATS
//	fleetwatch_route_events_dropped_total               outcome events lost (queue full, NATS down)
type routeMetrics struct {
	set         *metrics.Set
	pickSeconds *metrics.Histogram

	// counters caches labelled counters, so the hot path formats no names.
	counters sync.Map // counterKey -> *metrics.Counter
}

type counterKey struct {
	kind          uint8
	pool, backend string
	code          int
}

const (
	kindAttempt uint8 = iota
	kindRequest
	kindRetry
	kindShed
	kindBudget
)

func newRouteMetrics() *routeMetrics {
	set := metrics.NewSet()
	return &routeMetrics{
		set:         set,
		pickSeconds: set.NewHistogram(`fleetwatch_route_pick_duration_seconds`),
	}
}

func (m *routeMetrics) counter(k counterKey) *metrics.Counter {
	if c, ok := m.counters.Load(k); ok {
		return c.(*metrics.Counter)
	}
	var name string
	switch k.kind {
	case kindAttempt:
		name = fmt.Sprintf(`fleetwatch_route_attempts_total{pool=%s,backend=%s,code="%d"}`,
			strconv.Quote(k.pool), strconv.Quote(k.backend), k.code)
	case kindRequest:
		name = fmt.Sprintf(`fleetwatch_route_requests_total{pool=%s,code="%d"}`, strconv.Quote(k.pool), k.code)
	case kindRetry:
		name = fmt.Sprintf(`fleetwatch_route_retries_total{pool=%s}`, strconv.Quote(k.pool))
	case kindShed:
		name = fmt.Sprintf(`fleetwatch_route_shed_total{pool=%s}`, strconv.Quote(k.pool))
	case kindBudget:
		name = fmt.Sprintf(`fleetwatch_route_retry_budget_exhausted_total{pool=%s}`, strconv.Quote(k.pool))
	}
	c, _ := m.counters.LoadOrStore(k, m.set.GetOrCreateCounter(name))
	return c.(*metrics.Counter)
}

func (m *routeMetrics) attempt(pool, backend string, code int) *metrics.Counter {
	return m.counter(counterKey{kind: kindAttempt, pool: pool, backend: backend, code: code})
}

func (m *routeMetrics) clientCode(pool string, code int) *metrics.Counter {
	return m.counter(counterKey{kind: kindRequest, pool: pool, code: code})
}

func (m *routeMetrics) retry(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindRetry, pool: pool})
}

func (m *routeMetrics) shed(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindShed, pool: pool})
}

func (m *routeMetrics) budgetExhausted(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindBudget, pool: pool})
}

// write serves /metrics: the router's set, then per-backend gauges computed
// now from the pools, so removed backends leave no stale series:
//
//	fleetwatch_route_in_flight{pool,backend}      this router's requests in progress
//	fleetwatch_route_backend_weight{pool,backend} the weight of the decision applied
//	fleetwatch_route_backend_open{pool,backend}   1 when the decision applied is open
//	fleetwatch_route_decision_age_seconds{pool}   age of the decision applied (-1: none yet)
func (m *routeMetrics) write(w io.Writer, rt *router) {
	m.set.WritePrometheus(w)
	now := time.Now()
	for _, id := range slices.Sorted(maps.Keys(rt.pools)) {
		p := rt.pools[id]
		pool := strconv.Quote(id)
		snap := p.applied.Load()
		age := -1.0
		if snap.Epoch != configEpoch {
			age = now.Sub(snap.At.Time).Seconds()
		}
		fmt.Fprintf(w, "fleetwatch_route_decision_age_seconds{pool=%s} %g\n", pool, age)
		for _, b := range snap.Backends {
			be := strconv.Quote(b.Backend)
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
