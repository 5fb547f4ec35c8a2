package config

import (
	"path/filepath"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/probes"
)

// This file is the one mapping from the file to the components' Settings
// (route.go has the router's, adapters.go the leaf adapters').
// TestMappingReachesEverySetting ties it to both sides: every key reaches a
// setting, and every setting is reached by a key.

// setIf sets *dst to *v when the key was given (v not nil).
func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

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
	setDur(&s.LoadBeat, a.LoadBeat)
	setDur(&s.TTL, a.TTL)
	setDur(&s.Expiry, a.Expiry)
	setDur(&s.LoadMaxAge, a.LoadMaxAge)
	setIf(&s.MinRequests, a.MinRequests)
	setIf(&s.ConsecutiveFailures, a.ConsecutiveFailures)
	setIf(&s.ConsecutiveStalls, a.ConsecutiveStalls)
	setIf(&s.ConsecutiveThrottled, a.ConsecutiveThrottled)
	setIf(&s.ThrottledRunCounts, a.ThrottledRunCounts)
	setIf(&s.HalfOpenSuccesses, a.HalfOpenSuccesses)
	setIf(&s.RecentMinRequests, a.RecentMinRequests)
	setIf(&s.FailureRate, a.FailureRate)
	setIf(&s.ThrottleRate, a.ThrottleRate)
	setIf(&s.ThrottleRateCounts, a.ThrottleRateCounts)
	setIf(&s.ThrottleRefuseRate, a.ThrottleRefuseRate)
	setIf(&s.SlowFactor, a.SlowFactor)
	setIf(&s.EWMAAlpha, a.EWMAAlpha)
	setIf(&s.HalfOpenWeight, a.HalfOpenWeight)
	setIf(&s.MaxOpenFraction, a.MaxOpenFraction)
	setIf(&s.MaxWeightStep, a.MaxWeightStep)
	setIf(&s.OpenJitter, a.OpenJitter)
	setIf(&s.PoolThrottleHold, a.PoolThrottleHold)
	setIf(&s.ClientErrorRate, a.ClientErrorRate)
	setIf(&s.ClientErrorMargin, a.ClientErrorMargin)
	if a.OpenJitter != nil && *a.OpenJitter == 0 {
		s.OpenJitter = -1 // "open_jitter: 0" means none; the analyzer reads 0 as the default
	}
	return s
}

// limits converts the limits block; absent keys stay zero, the analyzer's
// "default".
func (l LimitsConfig) limits() analyzer.Limits {
	var out analyzer.Limits
	for _, f := range []struct {
		dst *int
		v   *int
	}{{&out.MaxPools, l.MaxPools}, {&out.MaxBackendsPerPool, l.MaxBackendsPerPool}, {&out.MaxBackends, l.MaxBackends}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	return out
}

// Configured reports whether backend is listed under pool in the file (for
// feed.PublisherSettings.Configured: a truncated snapshot keeps configured
// backends before unconfigured ones).
func (c *Config) Configured(pool, backend string) bool {
	for _, p := range c.Pools {
		if p.ID != pool {
			continue
		}
		for _, b := range p.Backends {
			if b.ID == backend {
				return true
			}
		}
	}
	return false
}

// AnalyzerSettings is the analyzer's configuration. seed drives the open-time
// jitter and the epoch: give each process its own, so that two analyzers
// started together neither jitter alike nor share an epoch.
func (c *Config) AnalyzerSettings(seed uint64) analyzer.Config {
	ac := analyzer.Config{
		Settings:   c.Analyzer.settings(),
		Limits:     c.Limits.limits(),
		Quarantine: c.Probes.Quarantine,
		Seed:       seed,
	}
	for _, p := range c.Pools {
		pc := analyzer.PoolConfig{
			ID:       p.ID,
			Mode:     fleetwatch.Mode(p.Mode),
			AllOpen:  fleetwatch.AllOpen(p.AllOpen),
			Shadow:   fleetwatch.Shadow(p.Shadow),
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
	return ac
}

// ProbeTargets is one probe target per configured backend with a URL; API
// keys are read with getenv from the variables the file names.
func (c *Config) ProbeTargets(getenv func(string) string) []probes.Target {
	var out []probes.Target
	for _, p := range c.Pools {
		for _, b := range p.Backends {
			if b.URL == "" {
				continue
			}
			t := probes.Target{Pool: p.ID, Backend: b.ID, URL: b.URL, PreferModels: p.Models,
				Model: b.ProbeModel, Endpoint: b.ProbeEndpoint, BudgetTokensPerDay: c.Probes.BudgetTokensPerDay}
			setIf(&t.BudgetTokensPerDay, p.ProbeBudgetTokensPerDay)
			setIf(&t.BudgetTokensPerDay, b.ProbeBudgetTokensPerDay)
			if b.CostPerMTok != nil {
				t.CostPerMTok = new(*b.CostPerMTok)
			}
			if b.APIKeyEnv != "" {
				t.APIKey = getenv(b.APIKeyEnv)
			}
			out = append(out, t)
		}
	}
	return out
}

// ProbeSettings is the file's part of the probes' Settings: targets,
// schedule, timeout and enrolment. The caller adds the suite (ProbeSuite
// names it), the store, the sink and the clock.
func (c *Config) ProbeSettings(getenv func(string) string) probes.Settings {
	ps := probes.Settings{
		Targets:    c.ProbeTargets(getenv),
		Schedule:   c.Probes.Schedule,
		Enrol:      c.Probes.Enrol,
		Quarantine: c.Probes.Quarantine,
	}
	if c.Probes.Timeout != nil {
		ps.Timeout = c.Probes.Timeout.Duration
	}
	if c.Probes.EnrolMin != nil {
		ps.EnrolMin = c.Probes.EnrolMin.Duration
		if ps.EnrolMin == 0 {
			ps.EnrolMin = -1 // configured 0: no minimum span
		}
	}
	return ps
}

// ReviewSettings is the file's part of the drift review's settings: the
// schedule and the directory of the Markdown digests (default
// <data>/reviews).
func (c *Config) ReviewSettings() probes.ReviewSettings {
	dir := c.Review.Dir
	if dir == "" {
		dir = filepath.Join(c.Data, "reviews")
	}
	return probes.ReviewSettings{Schedule: c.Review.Schedule, Dir: dir}
}

// CollectorSettings is the file's part of the collector's Settings: the
// prefix, JetStream or not, the durable intake and its bounds, and how long
// FW_OUTCOMES keeps accepted events (twice the analyzer's window, at least
// 10 minutes, so that a restart replays a full window). The caller adds the
// clock, the metrics and the hooks.
func (c *Config) CollectorSettings() collector.Settings {
	intake, capture := c.IntakeMode()
	s := collector.Settings{
		Prefix:         c.Prefix,
		NoJetStream:    c.NATS.NoJetStream,
		Intake:         intake,
		Capture:        capture,
		IntakeMaxBytes: c.Ingest.MaxBytes,
		StreamMaxAge:   max(2*c.Analyzer.settings().WithDefaults().Window, 10*time.Minute),
		StreamReplicas: c.HA.Replicas,
	}
	if c.Ingest.MaxAge != nil {
		s.IntakeMaxAge = c.Ingest.MaxAge.Duration
	}
	return s
}

// IntakeMode is how outcome events are kept while no serve runs
// (ingest.durable): unset, the capture beside the core path whenever the
// server has JetStream (capture); true, the durable intake (intake, which
// needs JetStream); false, neither.
func (c *Config) IntakeMode() (intake, capture bool) {
	if c.Ingest.Durable != nil {
		return *c.Ingest.Durable, false
	}
	return false, !c.NATS.NoJetStream
}

// StoreDir is the embedded NATS server's JetStream store (default
// <data>/nats).
func (c *Config) StoreDir() string {
	if c.NATS.StoreDir != "" {
		return c.NATS.StoreDir
	}
	return filepath.Join(c.Data, "nats")
}
