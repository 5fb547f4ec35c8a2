package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

func init() {
	register("serve", "run collector, analyzer, feed, probes and the HTTP server", runServe)
}

// serveFlags are serve's command-line flags (demo shares them).
type serveFlags struct {
	nats        natsFlags
	http        string
	data        string
	natsListen  string
	noJetStream bool
	noProbes    bool
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	f.nats.register(fs)
	fs.StringVar(&f.http, "http", "", "HTTP listen address for /metrics, /healthz, /api/decisions and the status page (default 127.0.0.1:8080)")
	fs.StringVar(&f.data, "data", "", "data directory: embedded NATS store, drift reviews (default ./data)")
	fs.StringVar(&f.natsListen, "nats-listen", "", "listen address of the embedded NATS server when --nats is empty (default 127.0.0.1:4222)")
	fs.BoolVar(&f.noJetStream, "no-jetstream", false, "run without JetStream: no replay on restart, no KV, no drift stream")
	fs.BoolVar(&f.noProbes, "no-probes", false, "do not run drift probes")
}

// config loads the configuration file and applies the flags over it.
func (f *serveFlags) config() (*Config, error) {
	cfg, err := f.nats.loadConfig()
	if err != nil {
		return nil, err
	}
	if f.http != "" {
		cfg.HTTP.Listen = f.http
	}
	if f.data != "" {
		cfg.Data = f.data
	}
	if f.natsListen != "" {
		cfg.NATS.Listen = f.natsListen
	}
	if f.noJetStream {
		cfg.NATS.NoJetStream = true
	}
	if f.noProbes {
		cfg.Probes.Disabled = true
	}
	return cfg, nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	s, err := startServer(ctx, cfg, &f.nats, stdout, stderr)
	if err != nil {
		return err
	}
	return s.wait()
}

// daemon is one running fleetwatch: NATS connection (and embedded server),
// collector, analyzer, feed publisher, probes and the HTTP server.
type daemon struct {
	cfg    *Config
	subj   fleetwatch.Subjects
	stdout io.Writer
	logf   func(format string, args ...any)

	embedded *natsrv.Server // nil with --nats
	nc       *nats.Conn
	js       jetstream.JetStream // nil without JetStream

	an       *analyzer.Analyzer
	col      *collector.Collector
	pub      *feed.Publisher
	metrics  *metrics.Set
	httpSrv  *http.Server
	httpAddr string
	urgent   chan struct{}
	hist     *history

	decisionLatency *metrics.Histogram
	unpublished     *metrics.Counter // snapshots not sent while NATS was unreachable
	evalDuration    *metrics.Histogram

	// onTransition, when set, is called (outside any lock) for every breaker
	// transition; demo uses it to narrate.
	onTransition func(analyzer.Transition)
	// onAlert, when set, is called for every drift alert (demo narrates).
	onAlert func(fleetwatch.DriftAlert)

	mu       sync.Mutex // guards urgentAt, alerts
	urgentAt time.Time  // when the oldest unhandled urgent signal arrived
	alerts   []fleetwatch.DriftAlert

	stopProbes func()
	done       chan struct{}
	runErr     error
}

// startServer brings everything up in order: NATS, analyzer, publisher,
// collector, replay of the last window, then the evaluation loop and HTTP.
// Nothing is published before the replay is done, so a restart neither
// forgets an open breaker nor opens one on partial data.
func startServer(ctx context.Context, cfg *Config, nf *natsFlags, stdout, stderr io.Writer) (_ *daemon, err error) {
	s := &daemon{
		cfg:     cfg,
		subj:    fleetwatch.Subjects{Prefix: cfg.Prefix},
		stdout:  stdout,
		logf:    func(format string, args ...any) { fmt.Fprintf(stderr, "fleetwatch: "+format+"\n", args...) },
		metrics: metrics.NewSet(),
		urgent:  make(chan struct{}, 1),
		done:    make(chan struct{}),
		hist:    newHistory(defaultHistoryPoints),
	}
	defer func() {
		if err != nil {
			s.shutdownNATS()
		}
	}()

	url := cfg.NATS.URL
	if url == "" {
		store := cfg.NATS.StoreDir
		if store == "" {
			store = filepath.Join(cfg.Data, "nats")
		}
		s.embedded, err = natsrv.Start(natsrv.Settings{
			Listen:      cfg.NATS.Listen,
			StoreDir:    store,
			NoJetStream: cfg.NATS.NoJetStream,
			ServerName:  "fleetwatch",
		})
		if err != nil {
			return nil, fmt.Errorf("embedded NATS on %s: %w (use --nats-listen or --nats)", cfg.NATS.Listen, err)
		}
		url = s.embedded.ClientURL()
		fmt.Fprintf(stdout, "fleetwatch: embedded NATS server at %s (JetStream: %v, store %s)\n", url, s.embedded.JetStream(), store)
	}
	s.nc, err = nf.connectURL("fleetwatch serve", url, s.logf)
	if err != nil {
		return nil, err
	}
	if !cfg.NATS.NoJetStream {
		s.js, err = jetstream.New(s.nc)
		if err != nil {
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, aerr := s.js.AccountInfo(actx)
		cancel()
		if aerr != nil {
			s.logf("JetStream not available (%v): running without replay, KV and drift stream", aerr)
			s.js = nil
		}
	}

	acfg, err := cfg.analyzerConfig()
	if err != nil {
		return nil, err
	}
	if s.an, err = analyzer.New(acfg); err != nil {
		return nil, fmt.Errorf("analyzer: %w", err)
	}
	s.decisionLatency = s.metrics.NewHistogram("fleetwatch_decision_latency_seconds")
	s.evalDuration = s.metrics.NewHistogram("fleetwatch_evaluate_duration_seconds")
	s.unpublished = s.metrics.NewCounter("fleetwatch_decisions_unpublished_total")
	s.registerAnalyzerMetrics()

	s.pub, err = feed.NewPublisher(ctx, s.nc, feed.PublisherSettings{
		Prefix: cfg.Prefix, NoKV: s.js == nil, Metrics: s.metrics, Logf: s.logf,
	})
	if err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	window := acfg.Settings.WithDefaults().Window
	s.col, err = collector.New(s.nc, s.an, collector.Settings{
		Prefix:       cfg.Prefix,
		NoJetStream:  s.js == nil,
		StreamMaxAge: maxDuration(2*window, 10*time.Minute),
		Metrics:      s.metrics,
		Logf:         s.logf,
		OnUrgent:     s.signalUrgent,
	})
	if err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	if s.js != nil {
		if err := s.replay(ctx, window); err != nil {
			s.logf("replay: %v (starting with empty windows)", err)
		}
	}

	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	s.httpAddr = ln.Addr().String()
	s.httpSrv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "fleetwatch: HTTP on http://%s (status page /, /metrics, /api/decisions, /healthz)\n", s.httpAddr)

	if !cfg.Probes.Disabled {
		if s.stopProbes, err = s.startProbes(ctx); err != nil {
			ln.Close()
			return nil, fmt.Errorf("probes: %w", err)
		}
	}

	runCtx, cancel := context.WithCancel(ctx)
	var work sync.WaitGroup // the collector and the evaluation loop
	errs := make(chan error, 2)
	work.Add(2)
	go func() { defer work.Done(); errs <- s.col.Run(runCtx) }()
	go func() { defer work.Done(); s.evaluateLoop(runCtx) }()
	httpDone := make(chan error, 1)
	go func() { httpDone <- s.httpSrv.Serve(ln) }()
	go func() {
		// Whichever ends first (a signal, or a component failing) stops
		// the rest: the collector drains, then a final snapshot goes out,
		// then HTTP and NATS stop.
		var first error
		select {
		case <-ctx.Done():
		case first = <-errs:
		case first = <-httpDone:
		}
		cancel()
		work.Wait()
		s.shutdown()
		close(errs)
		for e := range errs {
			if first == nil && e != nil && !errors.Is(e, context.Canceled) {
				first = e
			}
		}
		if errors.Is(first, http.ErrServerClosed) {
			first = nil
		}
		s.runErr = first
		close(s.done)
	}()
	return s, nil
}

// wait blocks until the server has shut down and returns why.
func (s *daemon) wait() error {
	<-s.done
	return s.runErr
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// replay feeds the last window of FW_OUTCOMES through the analyzer,
// evaluating at event time as it goes (without publishing), so breakers
// that were open before a restart are open again.
func (s *daemon) replay(ctx context.Context, window time.Duration) error {
	start := time.Now()
	n, err := s.col.Replay(ctx, start.Add(-window), func(batch []fleetwatch.Event) {
		s.an.Observe(batch)
		if len(batch) > 0 {
			// Evaluate at the batch's event time, as the live loop would
			// have: consecutive-failure trips and their open times are
			// decided then, not at the restart.
			s.an.Evaluate(batch[len(batch)-1].TS)
		}
	})
	if n > 0 || err == nil {
		s.logf("replayed %d events of the last %v from the outcome stream", n, window)
	}
	return err
}

// signalUrgent asks the evaluation loop to run now: an event may have
// tripped a breaker.
func (s *daemon) signalUrgent() {
	s.mu.Lock()
	if s.urgentAt.IsZero() {
		s.urgentAt = time.Now()
	}
	s.mu.Unlock()
	select {
	case s.urgent <- struct{}{}:
	default:
	}
}

// evaluateLoop evaluates on a short tick (state changes go out promptly and
// each pool's heartbeat is honoured by the analyzer) and at once when the
// collector signals an urgent event.
func (s *daemon) evaluateLoop(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.urgent:
		}
		s.evaluate(ctx, time.Now())
	}
}

func (s *daemon) evaluate(ctx context.Context, now time.Time) {
	s.mu.Lock()
	urgentAt := s.urgentAt
	s.urgentAt = time.Time{}
	s.mu.Unlock()

	ev := s.an.Evaluate(now)
	s.evalDuration.UpdateDuration(now)
	s.publish(ctx, ev.Snapshots)
	if !urgentAt.IsZero() && len(ev.Transitions) > 0 {
		s.decisionLatency.UpdateDuration(urgentAt)
	}
	for _, t := range ev.Transitions {
		s.metrics.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_breaker_transitions_total{pool=%s,backend=%s,to=%q,cause=%q}`,
			fleetwatch.QuoteLabel(t.Pool), fleetwatch.QuoteLabel(t.Backend), string(t.To), t.Cause)).Inc()
		s.logf("%s/%s %s -> %s: %s", t.Pool, t.Backend, t.From, t.To, t.Reason)
		if s.onTransition != nil {
			s.onTransition(t)
		}
	}
}

// publish sends snapshots on their subjects and to the KV, and records
// them for the status page. While NATS is unreachable nothing is sent (a
// KV put would wait out its timeout in this loop); the heartbeat publishes
// the current state once the connection is back.
func (s *daemon) publish(ctx context.Context, snaps []fleetwatch.Snapshot) {
	if s.nc.IsConnected() {
		for i := range snaps {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := s.pub.Publish(pctx, &snaps[i]); err != nil {
				s.logf("publish %s: %v", snaps[i].Pool, err)
			}
			cancel()
		}
	} else if len(snaps) > 0 {
		s.unpublished.Add(len(snaps))
	}
	s.recordHistory(snaps)
}

// Snapshots returns the current snapshot of every pool, sorted by pool.
func (s *daemon) Snapshots() []fleetwatch.Snapshot {
	return s.an.Snapshots(time.Now())
}

// shutdown stops in order: collector drained by its Run returning, a final
// snapshot of every pool, probes, HTTP, then NATS.
func (s *daemon) shutdown() {
	if s.stopProbes != nil {
		s.stopProbes()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch {
	case s.an == nil || s.pub == nil || s.nc == nil:
	case !s.nc.IsConnected():
		s.logf("NATS unreachable: no final snapshot (routers keep the last one they have)")
	default:
		final := s.an.Final(time.Now())
		s.publish(ctx, final)
		s.logf("published a final snapshot of %d pools", len(final))
	}
	if s.httpSrv != nil {
		s.httpSrv.Shutdown(ctx)
	}
	s.shutdownNATS()
}

func (s *daemon) shutdownNATS() {
	if s.nc != nil && !s.nc.IsClosed() {
		if !s.nc.IsConnected() {
			s.nc.Close() // nothing to drain towards a server that is gone
		}
		s.nc.Drain()
		deadline := time.Now().Add(3 * time.Second)
		for !s.nc.IsClosed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		s.nc.Close()
	}
	if s.embedded != nil {
		s.embedded.Shutdown()
	}
}
