package probes

import (
	"fmt"
	"io"
	"math"

	"github.com/VictoriaMetrics/metrics"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// proberMetrics are the Prober's series in its *metrics.Set. Per-backend
// gauges are written at scrape time from the current statuses, so they
// follow the targets.
type proberMetrics struct {
	set    *metrics.Set
	cycles *metrics.Counter
	// stateSaves and stateErrors count drift state writes to the
	// state Store and the ones that failed.
	stateSaves, stateErrors *metrics.Counter
	// identityChecks counts the identity-tier checks at start.
	identityChecks *metrics.Counter
}

func newProberMetrics(set *metrics.Set, p *Prober) *proberMetrics {
	m := &proberMetrics{set: set, cycles: set.GetOrCreateCounter("fleetwatch_probe_cycles_total"),
		stateSaves:     set.GetOrCreateCounter("fleetwatch_drift_state_saves_total"),
		stateErrors:    set.GetOrCreateCounter("fleetwatch_drift_state_errors_total"),
		identityChecks: set.GetOrCreateCounter("fleetwatch_probe_identity_checks_total"),
	}
	for _, s := range []fleetwatch.DriftStatus{fleetwatch.DriftOK, fleetwatch.DriftSuspect, fleetwatch.DriftDrifted, fleetwatch.DriftUnknown} {
		m.alerts(s) // present at 0 from the start
	}
	set.RegisterMetricsWriter(func(w io.Writer) {
		for _, st := range p.Statuses() {
			l := fmt.Sprintf(`{pool=%s,backend=%s}`, promlabel.Quote(st.Pool), promlabel.Quote(st.Backend))
			metrics.WriteGaugeFloat64(w, "fleetwatch_drift_score"+l, finite(st.Score))
			metrics.WriteGaugeFloat64(w, "fleetwatch_drift_threshold"+l, finite(st.Threshold))
			metrics.WriteGaugeFloat64(w, "fleetwatch_drift_cusum"+l, st.CUSUM)
			if !math.IsNaN(st.Z) {
				metrics.WriteGaugeFloat64(w, "fleetwatch_drift_s2_z"+l, st.Z)
			}
			// The same encoding as serve's fleetwatch_backend_drift: 0 is
			// healthy, like 0 for a closed breaker.
			metrics.WriteGaugeFloat64(w, "fleetwatch_drift_status"+l, float64(rank[st.Status]-1))
			enrolling := uint64(0)
			if st.Enrolling {
				enrolling = 1
			}
			metrics.WriteGaugeUint64(w, "fleetwatch_probe_enrolling"+l, enrolling)
			writeBudget(w, st)
		}
	})
	return m
}

// probeErrors is the counter of probe errors of one backend and kind.
func (m *proberMetrics) probeErrors(pool, backend, kind string) *metrics.Counter {
	return m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_probe_errors_total{pool=%s,backend=%s,kind=%s}`,
		promlabel.Quote(pool), promlabel.Quote(backend), promlabel.Quote(kind)))
}

// fingerprintEvents is the counter of traffic fingerprint events of one
// backend and kind.
func (m *proberMetrics) fingerprintEvents(pool, backend, kind string) *metrics.Counter {
	return m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_drift_fingerprint_events_total{pool=%s,backend=%s,kind=%s}`,
		promlabel.Quote(pool), promlabel.Quote(backend), promlabel.Quote(kind)))
}

// alerts is the counter of drift alerts by status.
func (m *proberMetrics) alerts(s fleetwatch.DriftStatus) *metrics.Counter {
	return m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_drift_alerts_total{status=%s}`, promlabel.Quote(string(s))))
}

// writeBudget writes a backend's probe budget gauges: the budget and the
// bucket (budgeted backends only) and the spend of the last 24 hours by
// tier, in tokens and, where the price is known, money.
func writeBudget(w io.Writer, st BackendStatus) {
	b := st.Budget
	if b == nil {
		return
	}
	l := fmt.Sprintf(`pool=%s,backend=%s`, promlabel.Quote(st.Pool), promlabel.Quote(st.Backend))
	if b.TokensPerDay > 0 {
		metrics.WriteGaugeUint64(w, "fleetwatch_probe_budget_tokens_per_day{"+l+"}", uint64(b.TokensPerDay))
		metrics.WriteGaugeFloat64(w, "fleetwatch_probe_budget_available_tokens{"+l+"}", b.Available)
	}
	for _, tier := range budgetTiers {
		tl := "{" + l + ",tier=" + promlabel.Quote(tier) + "}"
		metrics.WriteGaugeUint64(w, "fleetwatch_probe_tokens_24h"+tl, uint64(b.Spent[tier]))
		if b.Cost != nil {
			metrics.WriteGaugeFloat64(w, "fleetwatch_probe_cost_24h"+tl, b.Cost[tier])
		}
	}
}

func (m *proberMetrics) backendTier(name, pool, backend, tier string) string {
	return fmt.Sprintf(`%s{pool=%s,backend=%s,tier=%s}`, name,
		promlabel.Quote(pool), promlabel.Quote(backend), promlabel.Quote(tier))
}

// tokens is the counter of the tokens a backend's tier spent.
func (m *proberMetrics) tokens(pool, backend, tier string) *metrics.Counter {
	return m.set.GetOrCreateCounter(m.backendTier("fleetwatch_probe_tokens_total", pool, backend, tier))
}

// cost is the counter of what a backend's tier spent in the money of its
// cost_per_mtok.
func (m *proberMetrics) cost(pool, backend, tier string) *metrics.FloatCounter {
	return m.set.GetOrCreateFloatCounter(m.backendTier("fleetwatch_probe_cost_total", pool, backend, tier))
}

// tierSkipped is the counter of a backend's tier skipped by the budget.
func (m *proberMetrics) tierSkipped(pool, backend, tier string) *metrics.Counter {
	return m.set.GetOrCreateCounter(m.backendTier("fleetwatch_probe_tier_skipped_total", pool, backend, tier))
}

// finite maps NaN and infinities to 0 so that a score always encodes.
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}
