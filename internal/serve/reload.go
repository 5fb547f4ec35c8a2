package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Reloading the configuration (docs/OPERATIONS.md "Changing the
// configuration"): SIGHUP (cmd) and POST /-/reload call Reload, which reads
// the file again and applies it whole or not at all. An invalid file, or
// one that changes a key only a restart applies (config.RestartKeys), is
// refused with its key and line and the running configuration is kept, as
// nginx keeps its old configuration; what is applied is logged and
// answered, and every attempt is counted, as Prometheus does:
//
//	fleetwatch_config_last_reload_successful               1 when the last reload succeeded (or none was tried), else 0
//	fleetwatch_config_last_reload_success_timestamp_seconds when the running configuration was loaded
//	fleetwatch_config_reloads_total{result="success|failure"}
//
// What a reload applies: the analyzer's settings, limits and configured
// pools and backends (analyzer.Reconfigure keeps the windows and breakers of
// what stays), the drift probes' targets, schedule, suite and review
// (probes.Prober.Update keeps the monitors of the targets that stay), and
// the metrics scraper's targets.

// ErrNoConfigFile is returned by Reload when serve was started without a
// configuration file.
var ErrNoConfigFile = errors.New("serve: no configuration file to reload (started without --config)")

// ErrNotReloadable is returned by Reload once Run is shutting down.
var ErrNotReloadable = errors.New("serve: shutting down: no reload")

// reloadState is the server's part for reloads.
type reloadState struct {
	mu     sync.Mutex      // serialises reloads; guards runCtx, done and prober
	runCtx context.Context // Run's context once it runs (the probes' parent)
	done   bool            // Run is stopping: reloads are refused
	prober *probes.Prober  // the drift prober, kept across restarts of the probes

	// probes is held (read) by restoreDrift and (write) while a reload
	// restarts the probes, so that a restore never meets a prober being
	// updated.
	probes sync.RWMutex

	live     atomic.Pointer[config.Config] // the running configuration once reloaded; nil: Server.cfg
	scrapers chan *scraper                 // hands a new scraper to runScrapers

	successful *metrics.Gauge
	successAt  *metrics.Gauge
	successes  *metrics.Counter
	failures   *metrics.Counter
}

// config returns the running configuration: the one given to New until a
// reload replaced it. Keys under config.RestartKeys are the same in both.
func (s *Server) config() *config.Config {
	if c := s.rl.live.Load(); c != nil {
		return c
	}
	return s.cfg
}

// registerReloadMetrics creates the reload metrics; the configuration given
// to New counts as loaded successfully now.
func (s *Server) registerReloadMetrics() {
	s.rl.successful = s.metrics.NewGauge("fleetwatch_config_last_reload_successful", nil)
	s.rl.successAt = s.metrics.NewGauge("fleetwatch_config_last_reload_success_timestamp_seconds", nil)
	s.rl.successes = s.metrics.NewCounter(`fleetwatch_config_reloads_total{result="success"}`)
	s.rl.failures = s.metrics.NewCounter(`fleetwatch_config_reloads_total{result="failure"}`)
	s.rl.successful.Set(1)
	s.rl.successAt.Set(float64(time.Now().UnixNano()) / 1e9)
	s.rl.scrapers = make(chan *scraper, 1)
}

// ReloadResult is what an applied reload changed.
type ReloadResult struct {
	File string `json:"file"`
	// Changes are the keys that differ from the running configuration,
	// with their line in the file.
	Changes []config.Change `json:"changes"`
	// Analyzer is what the analyzer changed (pools and backends added,
	// removed or changed).
	Analyzer analyzer.Reconfigured `json:"analyzer"`
	// Probes is what happened to the drift probes: "unchanged",
	// "restarted", "started", "stopped", "disabled" (none ran and none
	// run: probes.disabled or --no-probes), or "updated" before they run.
	Probes string `json:"probes"`
	// Scrape is "unchanged" or "restarted" (the metrics_url scraper).
	Scrape string `json:"scrape"`
	// Warnings are what the reload could not apply of keys it accepted.
	Warnings []string `json:"warnings,omitempty"`
}

// Summary is the result in one line, for the log.
func (r ReloadResult) Summary() string {
	if len(r.Changes) == 0 {
		return "configuration " + r.File + " unchanged"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "configuration %s reloaded: %d change(s)", r.File, len(r.Changes))
	for _, l := range []struct {
		what string
		ids  []string
	}{
		{"pools added", r.Analyzer.PoolsAdded}, {"pools removed", r.Analyzer.PoolsRemoved}, {"pools changed", r.Analyzer.PoolsChanged},
		{"backends added", r.Analyzer.BackendsAdded}, {"backends removed", r.Analyzer.BackendsRemoved},
		{"windows resized", r.Analyzer.WindowsResized},
	} {
		if len(l.ids) > 0 {
			fmt.Fprintf(&b, "; %s: %s", l.what, strings.Join(l.ids, ", "))
		}
	}
	fmt.Fprintf(&b, "; probes %s; scrape %s", r.Probes, r.Scrape)
	for _, w := range r.Warnings {
		b.WriteString("; warning: " + w)
	}
	return b.String()
}

// Reload reads the configuration file (Options.ConfigFile) again, applies
// Options.AdjustConfig (the command line's overrides) and, when the result
// is valid and changes no key under config.RestartKeys, applies it: see
// the comment at the top of reload.go. Otherwise it returns the error (a
// *config.Error naming the key and line, or a *config.RestartError) and
// the running configuration is kept whole. Reloads are serialised; each is
// counted in the reload metrics and logged.
func (s *Server) Reload() (ReloadResult, error) {
	s.rl.mu.Lock()
	defer s.rl.mu.Unlock()
	res, err := s.reload()
	if err != nil {
		s.rl.failures.Inc()
		s.rl.successful.Set(0)
		s.logf("reload refused, the running configuration is kept: %v", err)
		return res, err
	}
	s.rl.successes.Inc()
	s.rl.successful.Set(1)
	s.rl.successAt.Set(float64(time.Now().UnixNano()) / 1e9)
	s.logf("%s", res.Summary())
	return res, nil
}

// reload is Reload with s.rl.mu held.
func (s *Server) reload() (ReloadResult, error) {
	file := s.opts.ConfigFile
	res := ReloadResult{File: file, Probes: "unchanged", Scrape: "unchanged"}
	if s.rl.done {
		return res, ErrNotReloadable
	}
	if file == "" {
		return res, ErrNoConfigFile
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return res, fmt.Errorf("config: %w", err)
	}
	prev := s.config()
	next, changes, err := config.ParseReload(prev, data, file, s.opts.AdjustConfig)
	if err != nil {
		return res, err
	}
	res.Changes = changes
	if len(changes) == 0 {
		return res, nil
	}
	getenv := s.opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	// Everything that can refuse the file is checked before anything
	// changes: the analyzer's configuration, the probe suite and settings.
	ac := next.AnalyzerSettings(s.seed)
	if _, err := analyzer.New(ac); err != nil {
		return res, fmt.Errorf("config %s: %w", file, err)
	}
	probesChanged := !reflect.DeepEqual(prev.ProbeSettings(getenv), next.ProbeSettings(getenv)) ||
		!reflect.DeepEqual(prev.Probes, next.Probes) || prev.Review != next.Review
	if probesChanged && !next.Probes.Disabled {
		suite, err := drift.LoadSuite(next.Probes.Suite)
		if err != nil {
			return res, &config.Error{File: file, Key: "probes.suite", Msg: err.Error()}
		}
		ps := next.ProbeSettings(getenv)
		ps.Suite = suite
		check := ps
		check.Metrics = metrics.NewSet()
		if _, err := probes.New(check); err != nil {
			return res, fmt.Errorf("config %s: %w", file, err)
		}
	}

	// Apply: the analyzer first, so that the drift statuses the restarted
	// probes load for new backends find them; then the probes, the one
	// step that does I/O and may fail (the analyzer goes back to prev
	// then); then the scraper and the configuration itself.
	if res.Analyzer, err = s.an.Reconfigure(ac); err != nil { // checked above: cannot fail
		return res, fmt.Errorf("config %s: %w", file, err)
	}
	if probesChanged {
		if res.Probes, err = s.reloadProbes(prev, next); err != nil {
			if _, err2 := s.an.Reconfigure(prev.AnalyzerSettings(s.seed)); err2 != nil {
				s.logf("reload: the analyzer could not go back to the running configuration: %v", err2)
			}
			return res, err
		}
	}
	if ss := next.ScrapeSettings(); !reflect.DeepEqual(prev.ScrapeSettings(), ss) {
		s.swapScraper(ss)
		res.Scrape = "restarted"
	}
	s.rl.live.Store(next)
	res.Warnings = reloadWarnings(prev, next)
	return res, nil
}

// reloadWarnings says what of an accepted file only a restart applies.
func reloadWarnings(prev, next *config.Config) []string {
	var w []string
	if !reflect.DeepEqual(prev.IngestUpstreams(), next.IngestUpstreams()) {
		w = append(w, "the HTTP ingest adapters map upstreams (the backends' urls) as at start until a restart")
	}
	if a, b := prev.CollectorSettings().StreamMaxAge, next.CollectorSettings().StreamMaxAge; a != b {
		w = append(w, fmt.Sprintf("the stream of outcomes keeps %v (set at start) until a restart, not %v", a, b))
	}
	return w
}

// reloadProbes applies a new probes or review block, or new probe targets:
// it stops the running probes, updates the prober (the monitors of the
// targets that stay are kept) and starts them again. Before Run the
// prober is only updated, and Run starts it. If the new probes cannot
// start, the old settings are started again and the error returned.
func (s *Server) reloadProbes(prev, next *config.Config) (string, error) {
	s.rl.probes.Lock()
	defer s.rl.probes.Unlock()
	ctx := s.rl.runCtx
	if ctx == nil { // Run has not started the probes yet: it will, from next
		return "updated before start", nil
	}
	wasRunning := s.stopProbes()
	if next.Probes.Disabled {
		if !wasRunning { // disabled before too (--no-probes): nothing ran, nothing stopped
			return "disabled", nil
		}
		return "stopped", nil
	}
	what := "restarted"
	if !wasRunning {
		what = "started"
	}
	if err := s.startProbesFrom(ctx, next); err != nil {
		if wasRunning {
			if err2 := s.startProbesFrom(ctx, prev); err2 != nil {
				s.logf("reload: the drift probes could not be started again: %v", err2)
			}
		}
		return "", fmt.Errorf("serve: reload: drift probes: %w", err)
	}
	return what, nil
}

// startProbesFrom starts the drift probes of cfg, reusing the prober of an
// earlier start (probes.Prober.Update), and records them in s.drift.
func (s *Server) startProbesFrom(ctx context.Context, cfg *config.Config) error {
	d, err := startProbes(ctx, s.probeDepsOf(cfg, s.rl.prober))
	if err != nil {
		return err
	}
	s.rl.prober = d.prober
	s.mu.Lock()
	s.drift = d
	s.mu.Unlock()
	return nil
}

// startProbes starts the drift probes and the review schedule of the
// running configuration (unless probes.disabled) under Run's ctx, and
// records ctx for the probes later reloads start: drift statuses flow
// into the analyzer (and so into the snapshots) and alerts into the status
// page. The stored drift states are loaded before it returns;
// restoreDrift reaches the probes from then on. stopDrift stops them.
func (s *Server) startProbes(ctx context.Context) error {
	s.rl.mu.Lock() // a reload now waits, then sees the probes started
	defer s.rl.mu.Unlock()
	s.rl.runCtx = ctx
	if s.config().Probes.Disabled {
		return nil
	}
	return s.startProbesFrom(ctx, s.config())
}

// stopProbes stops the running drift probes, if any, and forgets them. It
// reports whether some were running.
func (s *Server) stopProbes() bool {
	s.mu.Lock()
	d := s.drift
	s.drift = nil
	s.mu.Unlock()
	if d != nil {
		d.Stop()
	}
	return d != nil
}

// stopDrift refuses reloads from now on and stops the running drift
// probes, whichever start (Run's or a reload's) made them.
func (s *Server) stopDrift() {
	s.rl.mu.Lock()
	s.rl.done = true
	s.rl.mu.Unlock()
	s.stopProbes()
}

// swapScraper hands a scraper of ss to runScrapers (none when ss has no
// targets), replacing the running one.
func (s *Server) swapScraper(ss config.ScrapeSettings) {
	var sc *scraper
	if len(ss.Targets) > 0 {
		sc = newScraper(ss, s.decides, s.loads, s.metrics, s.logf)
	}
	select {
	case <-s.rl.scrapers: // a swap not taken yet: replaced
	default:
	}
	s.rl.scrapers <- sc
}

// runScrapers runs the scraper (s.scraper, then each one a reload hands
// over) until ctx ends. A replaced scraper is stopped before the next
// starts, and the per-backend series of targets it no longer has are
// dropped.
func (s *Server) runScrapers(ctx context.Context) {
	sc := s.scraper
	for {
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if sc != nil {
				sc.run(sctx, s.metrics)
			}
		}()
		var next *scraper
		select {
		case <-ctx.Done():
			cancel()
			<-done
			return
		case next = <-s.rl.scrapers:
		}
		cancel()
		<-done
		if sc != nil {
			keep := map[config.ScrapeTarget]bool{}
			if next != nil {
				for _, t := range next.targets {
					keep[t] = true
				}
			}
			for _, t := range sc.targets {
				if !keep[t] {
					labels := scrapeLabels(t)
					s.metrics.UnregisterMetric("fleetwatch_load_scrapes_total" + labels)
					s.metrics.UnregisterMetric("fleetwatch_load_scrape_failures_total" + labels)
				}
			}
		}
		sc = next
	}
}

// scrapeLabels are the labels of a target's scrape series (scraper.run).
func scrapeLabels(t config.ScrapeTarget) string {
	return fmt.Sprintf("{pool=%s,backend=%s}", promlabel.Quote(t.Pool), promlabel.Quote(t.Backend))
}

// handleReload is POST /-/reload (behind the API's authentication): 200
// with the result, 400 with the error (its key and line) when the file is
// refused, 500 when applying it failed, 503 once shutting down.
func (s *Server) handleReload(w http.ResponseWriter, _ *http.Request) {
	res, err := s.Reload()
	w.Header().Set("Content-Type", "application/json")
	if err == nil {
		w.WriteHeader(http.StatusOK)
		json.NewEncoder(w).Encode(struct {
			Status  string `json:"status"`
			Summary string `json:"summary"`
			ReloadResult
		}{"success", res.Summary(), res})
		return
	}
	body := struct {
		Status  string          `json:"status"`
		Error   string          `json:"error"`
		Key     string          `json:"key,omitempty"`
		Line    int             `json:"line,omitempty"`
		Restart []config.Change `json:"restart,omitempty"`
	}{Status: "error", Error: err.Error()}
	code := http.StatusInternalServerError
	var ce *config.Error
	var re *config.RestartError
	var se *analyzer.SettingError
	switch {
	case errors.As(err, &ce):
		code, body.Key, body.Line = http.StatusBadRequest, ce.Key, ce.Line
	case errors.As(err, &re):
		code, body.Restart = http.StatusBadRequest, re.Changes
	case errors.As(err, &se):
		code, body.Key = http.StatusBadRequest, se.Key
	case errors.Is(err, ErrNoConfigFile), errors.Is(err, os.ErrNotExist):
		code = http.StatusBadRequest
	case errors.Is(err, ErrNotReloadable):
		code = http.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}
