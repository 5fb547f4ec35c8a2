package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// settings converts a YAML analyzer block into analyzer.Settings; absent
// keys stay zero, which the analyzer reads as "default" (global block) or
// "inherit" (a pool's block).
func (a AnalyzerConfig) settings() analyzer.Settings {
	var s analyzer.Settings
	setDur := func(dst *time.Duration, d *Duration) {
		if d != nil {
			*dst = d.Duration
		}
	}
	setDur(&s.Window, a.Window)
	setDur(&s.Bucket, a.Bucket)
	setDur(&s.IdleGap, a.IdleGap)
	setDur(&s.OpenBase, a.OpenBase)
	setDur(&s.OpenMax, a.OpenMax)
	setDur(&s.Heartbeat, a.Heartbeat)
	setDur(&s.TTL, a.TTL)
	setDur(&s.Expiry, a.Expiry)
	setInt := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	setInt(&s.MinRequests, a.MinRequests)
	setInt(&s.ConsecutiveFailures, a.ConsecutiveFailures)
	setInt(&s.HalfOpenSuccesses, a.HalfOpenSuccesses)
	setFloat := func(dst *float64, v *float64) {
		if v != nil {
			*dst = *v
		}
	}
	setFloat(&s.FailureRate, a.FailureRate)
	setFloat(&s.ThrottleRate, a.ThrottleRate)
	setFloat(&s.SlowFactor, a.SlowFactor)
	setFloat(&s.EWMAAlpha, a.EWMAAlpha)
	setFloat(&s.HalfOpenWeight, a.HalfOpenWeight)
	setFloat(&s.MaxOpenFraction, a.MaxOpenFraction)
	setFloat(&s.MaxWeightStep, a.MaxWeightStep)
	setFloat(&s.OpenJitter, a.OpenJitter)
	if a.OpenJitter != nil && *a.OpenJitter == 0 {
		s.OpenJitter = -1 // "open_jitter: 0" means none; the analyzer reads 0 as the default
	}
	return s
}

// analyzerConfig builds the analyzer's configuration from the file.
func (c *Config) analyzerConfig() (analyzer.Config, error) {
	ac := analyzer.Config{
		Settings:   c.Analyzer.settings(),
		Quarantine: c.Probes.Quarantine,
		// Each process draws its own open-time jitter and epoch: two
		// analyzers started together must not jitter alike or share an epoch.
		Seed: rand.Uint64(),
	}
	for _, p := range c.Pools {
		pc := analyzer.PoolConfig{
			ID:       p.ID,
			Mode:     fleetwatch.Mode(p.Mode),
			AllOpen:  fleetwatch.AllOpen(p.AllOpen),
			Settings: p.Analyzer.settings(),
		}
		if p.AffinityTolerance != nil {
			pc.AffinityTolerance = *p.AffinityTolerance
		}
		for _, b := range p.Backends {
			pc.Backends = append(pc.Backends, analyzer.BackendConfig{ID: b.ID, Priority: b.Priority, CostPerMTok: b.CostPerMTok})
		}
		ac.Pools = append(ac.Pools, pc)
	}
	return ac, nil
}

// The status page's view of the server (statusSource).

// Ingest returns the collector's counters for the status page.
func (s *daemon) Ingest() ingestCounts {
	st := s.col.Stats()
	ic := ingestCounts{
		Received:        int64(st.AcceptedTotal()),
		Accepted:        int64(st.AcceptedTotal()),
		RejectsByReason: map[string]int64{},
		Skewed:          int64(st.Skewed),
		Dropped:         int64(st.Dropped),
	}
	for reason, n := range st.Rejected {
		if n > 0 {
			ic.RejectsByReason[string(reason)] = int64(n)
		}
		ic.Rejected += int64(n)
	}
	ic.Received += ic.Rejected
	return ic
}

// DriftAlerts returns the latest n drift alerts, newest first.
func (s *daemon) DriftAlerts(n int) []fleetwatch.DriftAlert {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]fleetwatch.DriftAlert, 0, min(n, len(s.alerts)))
	for i := len(s.alerts) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, s.alerts[i])
	}
	return out
}

// maxKeptAlerts bounds the drift alerts kept in memory for the status page.
const maxKeptAlerts = 200

// noteAlert remembers a drift alert for the status page.
func (s *daemon) noteAlert(a fleetwatch.DriftAlert) {
	s.mu.Lock()
	s.alerts = append(s.alerts, a)
	if len(s.alerts) > maxKeptAlerts {
		s.alerts = append(s.alerts[:0], s.alerts[len(s.alerts)-maxKeptAlerts:]...)
	}
	s.mu.Unlock()
}

// NextReview is when the drift review runs next (zero when not scheduled).
func (s *daemon) NextReview() time.Time {
	if s.cfg.Probes.Disabled || s.cfg.Review.Schedule == "" {
		return time.Time{}
	}
	sched, err := cronParser.Parse(s.cfg.Review.Schedule)
	if err != nil {
		return time.Time{}
	}
	return sched.Next(time.Now())
}

func (s *daemon) statusRoutes(mux *http.ServeMux) { statusRoutes(mux, s, s.hist) }

func (s *daemon) recordHistory(snaps []fleetwatch.Snapshot) { s.hist.record(snaps) }

// startProbes starts the drift probes and the review schedule; drift
// statuses flow into the analyzer (and so into the snapshots) and alerts
// into the status page.
func (s *daemon) startProbes(ctx context.Context) (func(), error) {
	return startProbes(ctx, probeDeps{
		cfg:      s.cfg,
		nc:       s.nc,
		js:       s.js,
		prefix:   s.cfg.Prefix,
		setDrift: s.an.SetDrift,
		metrics:  s.metrics,
		logf:     s.logf,
		onAlert: func(a fleetwatch.DriftAlert) {
			s.noteAlert(a)
			if s.onAlert != nil {
				s.onAlert(a)
			}
		},
	})
}
