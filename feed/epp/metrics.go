package epp

import (
	"fmt"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// eppMetrics are the endpoint picker's series in its Settings.Metrics set:
//
//	fleetwatch_epp_picks_total{pool,result}           picks by result: ok, shed (every backend open:
//	                                                  429), no_endpoint (no eligible endpoint: 503)
//	fleetwatch_epp_sheds_total{pool,reason}           ImmediateResponses by dropped reason
//	                                                  (rejected-saturated 429, rejected-no-endpoints 503;
//	                                                  pool "-" when no pool serves the request)
//	fleetwatch_epp_served_elsewhere_total{pool}       answers served by an endpoint the picker did not
//	                                                  name (the data plane ignored the pick)
//	fleetwatch_epp_served_fallback_total{pool}        answers served by a fallback of the answer's list
//	fleetwatch_epp_unreported_total{pool}             picks whose outcome the data plane never showed
//	                                                  (no response phase, or an endpoint outside the pool)
//	fleetwatch_epp_outcomes_total{pool,code}          outcome events by status
//	fleetwatch_epp_stream_errors_total{pool,backend,reason} 2xx SSE answers that failed on their way
//	                                                  (reason: error_event or cut), published as outcome error
//	fleetwatch_epp_grpc_errors_total{reason}          ext_proc streams that failed: recv (the data plane's
//	                                                  stream broke), send, protocol (a message out of order)
//	fleetwatch_epp_pick_duration_seconds              time spent picking (histogram)
//
// Pool and backend labels only name configured pools and backends.
type eppMetrics struct {
	set         *metrics.Set
	pickSeconds *metrics.Histogram
	counters    sync.Map // counterKey -> *metrics.Counter
}

type counterKey struct {
	kind                  uint8
	pool, backend, reason string
	code                  int
}

const (
	kindPick uint8 = iota
	kindShed
	kindServedElsewhere
	kindServedFallback
	kindUnreported
	kindOutcome
	kindStreamError
	kindGRPCError
)

func newMetrics(set *metrics.Set) *eppMetrics {
	if set == nil {
		set = metrics.NewSet()
	}
	return &eppMetrics{set: set, pickSeconds: set.GetOrCreateHistogram(`fleetwatch_epp_pick_duration_seconds`)}
}

func (m *eppMetrics) counter(k counterKey) *metrics.Counter {
	if c, ok := m.counters.Load(k); ok {
		return c.(*metrics.Counter)
	}
	pool := promlabel.Quote(k.pool)
	var name string
	switch k.kind {
	case kindPick:
		name = fmt.Sprintf(`fleetwatch_epp_picks_total{pool=%s,result=%s}`, pool, promlabel.Quote(k.reason))
	case kindShed:
		name = fmt.Sprintf(`fleetwatch_epp_sheds_total{pool=%s,reason=%s}`, pool, promlabel.Quote(k.reason))
	case kindServedElsewhere:
		name = fmt.Sprintf(`fleetwatch_epp_served_elsewhere_total{pool=%s}`, pool)
	case kindServedFallback:
		name = fmt.Sprintf(`fleetwatch_epp_served_fallback_total{pool=%s}`, pool)
	case kindUnreported:
		name = fmt.Sprintf(`fleetwatch_epp_unreported_total{pool=%s}`, pool)
	case kindOutcome:
		name = fmt.Sprintf(`fleetwatch_epp_outcomes_total{pool=%s,code="%d"}`, pool, k.code)
	case kindStreamError:
		name = fmt.Sprintf(`fleetwatch_epp_stream_errors_total{pool=%s,backend=%s,reason=%s}`,
			pool, promlabel.Quote(k.backend), promlabel.Quote(k.reason))
	case kindGRPCError:
		name = fmt.Sprintf(`fleetwatch_epp_grpc_errors_total{reason=%s}`, promlabel.Quote(k.reason))
	}
	c, _ := m.counters.LoadOrStore(k, m.set.GetOrCreateCounter(name))
	return c.(*metrics.Counter)
}

func (m *eppMetrics) pick(pool, result string) *metrics.Counter {
	return m.counter(counterKey{kind: kindPick, pool: pool, reason: result})
}

func (m *eppMetrics) shed(pool, reason string) *metrics.Counter {
	return m.counter(counterKey{kind: kindShed, pool: pool, reason: reason})
}

func (m *eppMetrics) servedElsewhere(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindServedElsewhere, pool: pool})
}

func (m *eppMetrics) servedFallback(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindServedFallback, pool: pool})
}

func (m *eppMetrics) unreported(pool string) *metrics.Counter {
	return m.counter(counterKey{kind: kindUnreported, pool: pool})
}

func (m *eppMetrics) outcome(pool string, code int) *metrics.Counter {
	return m.counter(counterKey{kind: kindOutcome, pool: pool, code: code})
}

func (m *eppMetrics) streamError(pool, backend, reason string) *metrics.Counter {
	return m.counter(counterKey{kind: kindStreamError, pool: pool, backend: backend, reason: reason})
}

func (m *eppMetrics) grpcError(reason string) *metrics.Counter {
	return m.counter(counterKey{kind: kindGRPCError, reason: reason})
}
