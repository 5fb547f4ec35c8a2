package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// routes is serve's HTTP API: /metrics (Prometheus text), /healthz,
// /api/decisions (every pool's current snapshot), /api/explain (why a
// backend is in its state), the status page and the ingest endpoints
// (ingest.go); all but /healthz behind the configured authentication
// (auth.go).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.metrics.WritePrometheus(w)
		metrics.WriteProcessMetrics(w)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		code, body := s.health(time.Now()) // health.go
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	})
	mux.HandleFunc("GET /api/decisions", func(w http.ResponseWriter, r *http.Request) {
		snaps := s.Snapshots()
		if pool := r.URL.Query().Get("pool"); pool != "" {
			kept := snaps[:0]
			for _, snap := range snaps {
				if snap.Pool == pool {
					kept = append(kept, snap)
				}
			}
			snaps = kept
		}
		if snaps == nil {
			snaps = []fleetwatch.Snapshot{}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(snaps)
	})
	mux.HandleFunc("GET /api/explain", s.handleExplain)     // ops.go
	mux.HandleFunc("GET /api/overrides", s.ovr.handleGet)   // overrides.go
	mux.HandleFunc("POST /api/overrides", s.ovr.handlePost) // overrides.go
	mux.HandleFunc("POST /-/reload", s.handleReload)        // reload.go
	s.statusRoutes(mux)
	s.newIngestHTTP().Register(mux) // POST /v1/outcomes, /v1/ingest/litellm, /v1/traces (ingest.go)
	return s.web.auth.wrap(mux)     // /healthz stays open
}

// registerAnalyzerMetrics writes the per-backend series at scrape time from
// the current snapshots, so removed backends leave no stale series.
func (s *Server) registerAnalyzerMetrics() {
	s.metrics.RegisterMetricsWriter(func(w io.Writer) {
		snaps := s.Snapshots()
		backends := 0
		for _, snap := range snaps {
			backends += len(snap.Backends)
		}
		metrics.WriteGaugeUint64(w, "fleetwatch_pools", uint64(len(snaps)))
		metrics.WriteGaugeUint64(w, "fleetwatch_backends", uint64(backends))
		writeBackendGauges(w, snaps)
		s.writeTransitions(w, snaps)
		st := s.an.Stats()
		for cause, n := range st.HeldByGate {
			metrics.WriteCounterUint64(w, fmt.Sprintf(`fleetwatch_analyzer_held_total{by="gate",cause=%q}`, cause), uint64(n))
		}
		metrics.WriteCounterUint64(w, `fleetwatch_analyzer_held_total{by="cap",cause="any"}`, uint64(st.HeldByCap))
		metrics.WriteCounterUint64(w, `fleetwatch_analyzer_held_total{by="recency",cause="rate"}`, st.HeldByRecency)
		metrics.WriteCounterUint64(w, `fleetwatch_analyzer_held_total{by="median",cause="slow"}`, st.HeldByMedian)
		metrics.WriteCounterUint64(w, "fleetwatch_analyzer_events_shed_total", st.Shed)
	})
}

// backendGauges are the per-backend series, in the order written.
var backendGauges = []struct {
	name  string
	value func(b *fleetwatch.Backend) (float64, bool)
}{
	{"fleetwatch_backend_state", func(b *fleetwatch.Backend) (float64, bool) { return stateValue(b.State), true }},
	{"fleetwatch_backend_weight", func(b *fleetwatch.Backend) (float64, bool) { return b.Weight, true }},
	{"fleetwatch_backend_quota_until_seconds", func(b *fleetwatch.Backend) (float64, bool) {
		if b.QuotaUntil == nil {
			return 0, false
		}
		return float64(b.QuotaUntil.UnixMilli()) / 1000, true
	}},
	{"fleetwatch_backend_ewma_ttft_ms", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.EWMATTFTMs) }},
	{"fleetwatch_backend_p50_ttft_ms", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.P50TTFTMs) }},
	{"fleetwatch_backend_p95_ttft_ms", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.P95TTFTMs) }},
	{"fleetwatch_backend_success_rate", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.SuccessRate) }},
	{"fleetwatch_backend_rate_429", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.Rate429) }},
	{"fleetwatch_backend_requests", func(b *fleetwatch.Backend) (float64, bool) { return float64(b.Requests), true }},
	{"fleetwatch_backend_drift", func(b *fleetwatch.Backend) (float64, bool) { return driftValue(b.Drift), true }},
	{"fleetwatch_backend_p50_tpot_ms", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.P50TPOTMs) }},
	{"fleetwatch_backend_p95_tpot_ms", func(b *fleetwatch.Backend) (float64, bool) { return opt(b.P95TPOTMs) }},
}

func writeBackendGauges(w io.Writer, snaps []fleetwatch.Snapshot) {
	for _, g := range backendGauges {
		for _, snap := range snaps {
			for i := range snap.Backends {
				b := &snap.Backends[i]
				if v, ok := g.value(b); ok {
					metrics.WriteGaugeFloat64(w, fmt.Sprintf("%s{pool=%s,backend=%s}", g.name, promlabel.Quote(snap.Pool), promlabel.Quote(b.Backend)), v)
				}
			}
		}
	}
}

func opt(v *float64) (float64, bool) {
	if v == nil {
		return 0, false
	}
	return *v, true
}

// stateValue encodes a breaker state for the fleetwatch_backend_state gauge.
func stateValue(s fleetwatch.State) float64 {
	switch s {
	case fleetwatch.StateHalfOpen:
		return 1
	case fleetwatch.StateOpen:
		return 2
	}
	return 0
}

// driftValue encodes a drift status for the fleetwatch_backend_drift gauge.
func driftValue(d fleetwatch.DriftStatus) float64 {
	switch d {
	case fleetwatch.DriftOK:
		return 0
	case fleetwatch.DriftSuspect:
		return 1
	case fleetwatch.DriftDrifted:
		return 2
	}
	return -1
}

// writeTransitions writes the transition counters of the backends in snaps
// and forgets those of backends no longer in any snapshot.
func (s *Server) writeTransitions(w io.Writer, snaps []fleetwatch.Snapshot) {
	present := map[[2]string]bool{}
	for _, snap := range snaps {
		for _, b := range snap.Backends {
			present[[2]string{snap.Pool, b.Backend}] = true
		}
	}
	s.rec.mu.Lock()
	keys := make([]transitionKey, 0, len(s.rec.transitions))
	counts := make([]uint64, 0, len(s.rec.transitions))
	for k, n := range s.rec.transitions {
		if !present[[2]string{k.pool, k.backend}] {
			delete(s.rec.transitions, k)
			continue
		}
		keys = append(keys, k)
		counts = append(counts, n)
	}
	s.rec.mu.Unlock()
	for i, k := range keys {
		metrics.WriteCounterUint64(w, fmt.Sprintf(`fleetwatch_breaker_transitions_total{pool=%s,backend=%s,to=%s,cause=%s}`,
			promlabel.Quote(k.pool), promlabel.Quote(k.backend), promlabel.Quote(string(k.to)), promlabel.Quote(k.cause)), counts[i])
	}
}
