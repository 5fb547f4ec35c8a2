package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/feed/route"
)

// The keys of backend load (docs/DECISIONS.md "Backend load"): route's ORCA
// requests (pools[].orca) and serve's reading of the backends' Prometheus
// metrics (pools[].backends[].metrics_url and the scrape block).

// ScrapeConfig is how serve reads the backends' metrics_url.
type ScrapeConfig struct {
	// Interval is the time between two reads of one backend's metrics;
	// default 250ms, at least MinScrapeInterval.
	Interval *Duration `yaml:"interval"`
	// Timeout bounds one read; default 800ms.
	Timeout *Duration `yaml:"timeout"`
}

// MinScrapeInterval is the shortest scrape.interval, the interval at
// which the Kubernetes endpoint picker reads every server by default
// (gateway-api-inference-extension, pkg/epp/server/runserver.go:
// DefaultRefreshMetricsInterval): a backend's metrics are read at most 20
// times a second. Below a second is for fleets whose p99 is worth the
// reads (docs/EVALUATION.md "What the two goals need").
const MinScrapeInterval = 50 * time.Millisecond

// ScrapeTarget is one backend whose metrics serve reads.
type ScrapeTarget struct {
	Pool, Backend string
	URL           string // the metrics URL, "auto" resolved
}

// ScrapeSettings are the file's part of serve's metrics scraper. Zero
// durations mean the scraper's defaults.
type ScrapeSettings struct {
	Targets  []ScrapeTarget
	Interval time.Duration
	Timeout  time.Duration
}

// ScrapeSettings returns the scrape targets (every configured backend with a
// metrics_url) and the block's durations.
func (c *Config) ScrapeSettings() ScrapeSettings {
	var s ScrapeSettings
	if c.Scrape.Interval != nil {
		s.Interval = c.Scrape.Interval.Duration
	}
	if c.Scrape.Timeout != nil {
		s.Timeout = c.Scrape.Timeout.Duration
	}
	for _, p := range c.Pools {
		for _, b := range p.Backends {
			if u, ok := metricsURL(b); ok && u != "" {
				s.Targets = append(s.Targets, ScrapeTarget{Pool: p.ID, Backend: b.ID, URL: u})
			}
		}
	}
	return s
}

// metricsURL resolves a backend's metrics_url: "auto" is its url's scheme
// and host with the path /metrics (vLLM and SGLang serve it there, beside
// /v1). It reports false for "auto" without a url.
func metricsURL(b BackendConfig) (string, bool) {
	if b.MetricsURL != "auto" {
		return b.MetricsURL, true
	}
	u, err := url.Parse(b.URL)
	if err != nil || u.Host == "" {
		return "", false
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/metrics"}).String(), true
}

// validateLoad checks the load keys.
func (c *Config) validateLoad(fail func(key, format string, args ...any) error) error {
	if d := c.Scrape.Interval; d != nil && d.Duration < MinScrapeInterval {
		return fail("scrape.interval", "%v: must be >= %v", d.Duration, MinScrapeInterval)
	}
	if d := c.Scrape.Timeout; d != nil && d.Duration <= 0 {
		return fail("scrape.timeout", "%v: must be > 0", d.Duration)
	}
	for i, p := range c.Pools {
		switch p.ORCA {
		case "", route.ORCAText, route.ORCAJSON, route.ORCAOff:
		default:
			return fail(fmt.Sprintf("pools[%d].orca", i), "%q: want %s, %s or %s", p.ORCA, route.ORCAText, route.ORCAJSON, route.ORCAOff)
		}
		for j, b := range p.Backends {
			key := fmt.Sprintf("pools[%d].backends[%d].metrics_url", i, j)
			raw, ok := metricsURL(b)
			switch {
			case !ok:
				return fail(key, "auto: needs the backend's url")
			case raw == "":
				continue
			}
			if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
				strings.ContainsAny(raw, " \t") {
				return fail(key, "%q: want an http(s) URL or auto", b.MetricsURL)
			}
		}
	}
	return nil
}
