// Package serve is the fleetwatch daemon as a value: New builds it from a
// configuration (the embedded NATS server or a connection to an existing
// one, the analyzer, the collector, the feed publisher, the drift probes and
// the HTTP server), Run replays the outcome stream and then runs it until
// its context ends, and Close releases whatever New or Run acquired.
//
// Startup is in steps, so that nothing is published on partial data:
// connect (New), build (New), replay (Run, before any snapshot goes out),
// run (Run). Hooks are given in Options, before Run, and are called without
// any lock held.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/internal/alert"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/ha"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

// Options are what the caller of New gives beyond the configuration file.
// The zero value works.
type Options struct {
	// NATSOptions are added to the connection's options (authentication,
	// TLS). Reconnecting forever is always on.
	NATSOptions []nats.Option
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// OnTransition, when set, is called for every breaker transition, from
	// the evaluation loop, with no lock held. It must not block for long.
	OnTransition func(analyzer.Transition)
	// OnAlert, when set, is called for every drift alert, with no lock
	// held.
	OnAlert func(fleetwatch.DriftAlert)
	// OnReady, when set, is called once by Run when the restore and the
	// replay are done and the collector has subscribed (an event published
	// from then on is taken), just before the evaluation loop and the HTTP
	// server start: from then on snapshots are published.
	OnReady func()
	// Getenv reads the API keys the configuration names. If nil,
	// os.Getenv.
	Getenv func(string) string
	// Seed drives the analyzer's open-time jitter and epoch. If zero, a
	// random one, so that two instances never share an epoch.
	Seed uint64
	// ConfigFile is the file Reload reads again (SIGHUP, POST /-/reload);
	// empty: Reload refuses (ErrNoConfigFile).
	ConfigFile string
	// AdjustConfig, when set, is applied to every configuration Reload
	// reads, after the file: the command line's overrides.
	AdjustConfig func(*config.Config) error
}

// Server is one fleetwatch daemon.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): Run may be called once. A
// Run while it runs returns ErrRunning; a Run after Close, or after the
// first Run returned, returns ErrClosed. Close is idempotent and safe
// concurrently with Run: it stops Run as the end of its ctx does (the
// drain), waits for it, and releases what New acquired.
type Server struct {
	cfg  *config.Config
	opts Options
	subj fleetwatch.Subjects
	logf func(format string, args ...any)

	embedded *natsrv.Server // nil when cfg.NATS.URL is set
	nc       *nats.Conn
	js       jetstream.JetStream // nil without JetStream

	an      *analyzer.Analyzer
	seed    uint64           // the analyzer's, also given to a takeover's scratch analyzer
	leases  *ha.Manager      // partitions and leases (every partition is live without JetStream)
	fps     *fingerprintSink // the collector's sink: the analyzer, and the fingerprints of traffic for the probes
	col     *collector.Collector
	pub     *feed.Publisher
	metrics *metrics.Set
	m       serveMetrics
	web     web // the HTTP API (http.go, auth.go)
	hist    *history

	scraper *scraper         // nil without metrics_url targets (scrape.go)
	loads   chan loadReading // the scraper's hand-off to the evaluation loop
	// notifier sends the alerts block's notifications (nil without
	// receivers; ops.go).
	notifier *alert.Notifier
	// ovr holds the operator overrides (overrides.go).
	ovr *overrides

	ensure    chan struct{} // kicks the ensure loop (jsensure.go)
	alone     bool          // no other instance answered at start: the collector catches up on the capture
	published publishTimes  // when each pool was last published (health.go)
	urgency   urgency       // the evaluation loop's wake-up
	tick      time.Duration // the evaluation loop's (evaluateEvery)
	rec       record        // what happened: drift alerts, transition counts and logs (wire.go, ops.go)

	mu    sync.Mutex   // guards drift
	drift *driftProbes // the running drift probes (restoreDrift); nil until Run starts them

	// rl is the state of configuration reloads (reload.go).
	rl   reloadState
	life lifecycle
}

// serveMetrics are the daemon's own series (the components register
// theirs in the same set).
type serveMetrics struct {
	decisionLatency, evalDuration *metrics.Histogram
	unpublished                   *metrics.Counter // snapshots not sent while NATS was unreachable
	ensureErrors                  *metrics.Counter // JetStream resources that could not be ensured again (jsensure.go)
	resyncs                       *metrics.Counter // resync requests answered (resync.go)
	partitionCounters
}

// web is the HTTP API: its listener (a TLS listener when http.tls_cert is
// set: listenHTTP), its server, and its authentication (nil: none
// configured).
type web struct {
	ln   net.Listener
	srv  *http.Server
	auth *httpAuth
}

// urgency wakes the evaluation loop at once when an event may have tripped
// a breaker, and remembers since when.
type urgency struct {
	ch chan struct{}
	mu sync.Mutex // guards at
	at time.Time  // when the oldest unhandled signal arrived
}

// lifecycle is Run's and Close's state (docs/DECISIONS.md "Lifecycles").
type lifecycle struct {
	mu          sync.Mutex    // guards ran, running, runDone, closed
	ran         bool          // Run was called (and took the server)
	running     bool          // that Run has not returned yet
	runDone     chan struct{} // closed when Run returns; nil before Run
	closed      bool
	stop        chan struct{} // closed by Close: ends Run
	stopOnce    sync.Once
	releaseOnce sync.Once
}

// Lifecycle errors of the Server.
var (
	// ErrRunning is returned by Run while the first Run runs.
	ErrRunning = errors.New("serve: already running")
	// ErrClosed is returned by Run after Close, or after the first Run
	// returned (Run may be called once).
	ErrClosed = errors.New("serve: closed")
)

// New connects to NATS (starting the embedded server when the
// configuration has no URL) and builds every component. It starts no
// goroutine of its own and publishes nothing; the HTTP listener is bound,
// so HTTPAddr is known, but served only by Run. On error everything
// acquired is released.
func New(cfg *config.Config, opts Options) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		opts:    opts,
		subj:    fleetwatch.Subjects{Prefix: cfg.Prefix},
		logf:    opts.Logf,
		metrics: metrics.NewSet(),
		ensure:  make(chan struct{}, 1),
		hist:    newHistory(defaultHistoryPoints),
		urgency: urgency{ch: make(chan struct{}, 1)},
		life:    lifecycle{stop: make(chan struct{})},
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := s.connect(); err != nil {
		return nil, err
	}
	if err := s.build(); err != nil {
		return nil, err
	}
	return s, nil
}

// connect starts the embedded server when there is no URL, connects, and
// checks for JetStream.
func (s *Server) connect() error {
	url := s.cfg.NATS.URL
	if url == "" {
		var err error
		s.embedded, err = natsrv.Start(s.cfg.NATSServerSettings())
		if err != nil {
			return fmt.Errorf("serve: embedded NATS on %s: %w (use --nats-listen or --nats)", s.cfg.NATS.Listen, err)
		}
		url = s.embedded.ClientURL()
	}
	opts := append([]nats.Option{
		nats.Name("fleetwatch serve"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(10 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				s.logf("nats: disconnected: %v", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.logf("nats: reconnected to %s", nc.ConnectedUrlRedacted())
			s.kickEnsure() // the server may have come back without some of the streams
		}),
	}, s.opts.NATSOptions...)
	var err error
	if s.nc, err = nats.Connect(url, opts...); err != nil {
		return fmt.Errorf("serve: nats: connect %s: %w", url, err)
	}
	if !s.cfg.NATS.NoJetStream {
		if s.js, err = jetstream.New(s.nc); err != nil {
			return fmt.Errorf("serve: jetstream: %w", err)
		}
		if err := s.askJetStream(url); err != nil {
			return err
		}
	}
	return s.checkPresence()
}

// ErrAnotherInstance is returned by New when another fleetwatch serve runs
// on the same prefix and one of the two has no JetStream: without the
// partition leases two instances would split the outcome events and publish
// competing decisions.
var ErrAnotherInstance = errors.New("serve: another fleetwatch serve runs on this prefix")

// checkPresence asks whether another instance runs on the prefix, and
// refuses to start beside one when either has no JetStream.
func (s *Server) checkPresence() error {
	// No responders answers at once; a slow instance gets two seconds.
	msg, err := s.nc.Request(s.subj.Presence(), nil, 2*time.Second)
	if err != nil {
		s.alone = true
		return nil // no responders (or no answer): alone
	}
	var other struct {
		Instance  string `json:"instance"`
		JetStream bool   `json:"jetstream"`
	}
	_ = json.Unmarshal(msg.Data, &other)
	if s.js != nil && other.JetStream {
		s.logf("ha: instance %s already runs on prefix %s: sharing the partitions with it", other.Instance, s.subj.Prefix)
		return nil
	}
	return fmt.Errorf("%w (%s, %s): without JetStream only one instance may run on a prefix; stop it, use another prefix, or enable JetStream for high availability",
		ErrAnotherInstance, s.subj.Presence(), other.Instance)
}

// build makes the analyzer, the publisher, the collector and the HTTP
// listener.
func (s *Server) build() error {
	seed := s.opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s.seed = seed
	ac := s.cfg.AnalyzerSettings(seed)
	var err error
	if s.an, err = analyzer.New(ac); err != nil {
		return fmt.Errorf("serve: analyzer: %w", err)
	}
	s.tick = evaluateEvery(ac.Settings.WithDefaults())
	s.m = serveMetrics{
		decisionLatency:   s.metrics.NewHistogram("fleetwatch_decision_latency_seconds"),
		evalDuration:      s.metrics.NewHistogram("fleetwatch_evaluate_duration_seconds"),
		resyncs:           s.metrics.NewCounter("fleetwatch_resyncs_total"),
		unpublished:       s.metrics.NewCounter("fleetwatch_decisions_unpublished_total"),
		ensureErrors:      s.metrics.NewCounter("fleetwatch_jetstream_ensure_errors_total"),
		partitionCounters: newPartitionCounters(s.metrics),
	}
	s.registerAnalyzerMetrics()
	s.registerHealthMetrics()
	s.registerReloadMetrics()

	if err := s.newLeases(); err != nil {
		return err
	}
	s.ovr = newOverrides(s)
	if s.js != nil {
		if err := s.untilPlaced("creating the overrides bucket", 10*time.Second, func(ctx context.Context) error { return s.ovr.open(ctx, s.js) }); err != nil {
			return err
		}
	}
	// After the waits above: the rest of the build has its own 10 s.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.pub, err = feed.NewPublisher(ctx, s.nc, feed.PublisherSettings{
		Prefix: s.cfg.Prefix, NoKV: s.js == nil, Metrics: s.metrics, Logf: s.logf,
		// Configured pools and backends are kept first when a snapshot
		// must be truncated (of the running configuration: reloads).
		Configured: func(pool, backend string) bool { return s.config().Configured(pool, backend) },
		KVReplicas: s.cfg.HASettings().Replicas,
	})
	if err != nil {
		return fmt.Errorf("serve: feed publisher: %w", err)
	}
	cs := s.cfg.CollectorSettings()
	cs.NoJetStream = s.js == nil
	if s.js == nil && cs.Capture {
		s.logf("ingest: the NATS server has no JetStream: no capture, so events published while no serve runs are lost, uncounted (see /healthz)")
	}
	cs.CountsIntakeLoss = s.leases.Leader
	cs.CatchUp = func() bool { return s.alone }
	cs.Metrics, cs.Logf, cs.OnUrgent = s.metrics, s.logf, s.signalUrgent
	var sink collector.RefusingSink = s.an
	if s.js != nil {
		// Accepted events go to their partition's subject, for its owner
		// and FW_OUTCOMES; this instance observes at once only those of
		// the partitions it decides.
		n := s.leases.Partitions()
		partitions := make([]string, n)
		for p := range partitions {
			partitions[p] = s.subj.Partition(p)
		}
		cs.StreamSubject = func(pool string) string { return partitions[fleetwatch.PartitionOf(pool, n)] }
		cs.StreamHeader = nats.Header{originHeader: []string{s.leases.ID()}}
		sink = &haSink{leases: s.leases, forwarded: s.m.forwarded, an: s.an}
	}
	s.fps = newFingerprintSink(sink)
	s.col, err = collector.New(s.nc, s.fps, cs)
	if err != nil {
		return fmt.Errorf("serve: collector: %w", err)
	}
	if err := s.buildAlerts(); err != nil {
		return err
	}
	if s.web.ln, err = s.listenHTTP(); err != nil {
		return err
	}
	s.web.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.buildScraper()
	return nil
}

// HTTPAddr is the address the HTTP server listens on (host:port).
func (s *Server) HTTPAddr() string { return s.web.ln.Addr().String() }

// NATSURL is the URL of the NATS server in use (the embedded one's when
// the configuration has no URL).
func (s *Server) NATSURL() string {
	if s.embedded != nil {
		return s.embedded.ClientURL()
	}
	return s.cfg.NATS.URL
}

// JetStream reports whether the server runs with JetStream (replay, KV,
// drift stream).
func (s *Server) JetStream() bool { return s.js != nil }

// Metrics is the daemon's metric set (what /metrics exposes besides the
// process metrics).
func (s *Server) Metrics() *metrics.Set { return s.metrics }

// IngestStats are the collector's counters since start.
func (s *Server) IngestStats() collector.Stats { return s.col.Stats() }

// Run restores the last decisions from the KV bucket and replays the
// outcome stream through the analyzer (see restore), then runs the collector, the evaluation loop, the drift probes and the
// HTTP server until ctx ends or one of them fails. Then it drains: the
// collector stops, a final snapshot of every pool goes out, and HTTP and
// NATS stop. Run returns nil when ctx (or Close) ended it. It may be
// called once: it returns ErrRunning while that Run runs, and ErrClosed
// after it returned or after Close.
func (s *Server) Run(ctx context.Context) error {
	runDone, err := s.begin()
	if err != nil {
		return err
	}
	defer func() { // registered first: runs last, after the drain
		s.release()
		s.life.mu.Lock()
		s.life.running = false
		s.life.mu.Unlock()
		close(runDone)
	}()
	ctx, cancelRun := context.WithCancel(ctx)
	// The deferred cancel also ends the goroutine below.
	defer cancelRun()
	// Close ends Run as ctx does.
	go func() {
		select {
		case <-s.life.stop:
			cancelRun()
		case <-ctx.Done():
		}
	}()

	presence, err := s.answerPresence()
	if err != nil {
		return fmt.Errorf("serve: presence: %w", err)
	}
	defer presence.Unsubscribe()
	ovrSub, err := s.ovr.subscribe(ctx)
	if err != nil {
		return fmt.Errorf("serve: overrides: %w", err)
	}
	defer ovrSub.Unsubscribe()
	s.leases.Start(ctx) // the restore and replay of the partitions taken (nothing without JetStream)
	defer s.stopDrift()
	if err := s.startProbes(ctx); err != nil { // reload.go; reloads start them under ctx too
		return fmt.Errorf("serve: probes: %w", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var work sync.WaitGroup // the collector, the evaluation loop and the leases
	errs := make(chan error, 2)
	work.Go(func() { errs <- s.col.Run(runCtx) })
	// Ready (and the HTTP ingest endpoints) once the collector has
	// subscribed: an event accepted over HTTP from then on is taken.
	select {
	case <-s.col.Ready():
	case err := <-errs:
		work.Wait()
		return fmt.Errorf("serve: collector: %w", err)
	case <-ctx.Done():
	}
	// The overrides in force are loaded before the first snapshot.
	if err := s.ovr.watch(runCtx, &work); err != nil {
		s.logf("%v: overrides are not applied", err)
	}
	if s.opts.OnReady != nil {
		s.opts.OnReady()
	}
	resync := &resyncs{s: s}
	if sub, err := resync.subscribe(); err != nil {
		s.logf("resync requests not answered: %v", err)
	} else {
		defer func() { sub.Unsubscribe(); resync.stop() }()
	}
	work.Go(func() { s.evaluateLoop(runCtx) })
	work.Go(func() { s.runScrapers(runCtx) }) // reload.go
	if s.js != nil {
		work.Go(func() { s.leases.Run(runCtx) })
		work.Go(func() { s.ensureLoop(runCtx) })
	}
	if s.notifier != nil {
		work.Go(func() { s.notifier.Run(runCtx) })
	}
	httpDone := make(chan error, 1)
	go func() { httpDone <- s.web.srv.Serve(s.web.ln) }() // ends with Shutdown below

	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
	case first = <-httpDone:
		httpDone <- nil
	}
	cancel()
	work.Wait()
	return s.drain(first, errs, httpDone)
}

// begin marks Run as running (the lifecycle contract: ErrRunning while
// another Run runs, ErrClosed after Close or a finished Run) and returns
// the channel Run closes when it is done.
func (s *Server) begin() (chan struct{}, error) {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	switch {
	case s.life.closed || (s.life.ran && !s.life.running):
		return nil, ErrClosed
	case s.life.running:
		return nil, ErrRunning
	}
	s.life.ran, s.life.running = true, true
	runDone := make(chan struct{})
	s.life.runDone = runDone
	return runDone, nil
}

// drain is the end of Run once its work has stopped: the probes stopped,
// a last snapshot, the leases released (a successor takes over at once,
// not after the TTL), the HTTP server shut down; it returns the first
// error that is not the end of the run itself.
func (s *Server) drain(first error, errs chan error, httpDone chan error) error {
	s.stopDrift()
	s.finalSnapshot()
	s.leases.Release()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	s.web.srv.Shutdown(sctx)
	scancel()
	<-httpDone
	close(errs)
	for e := range errs {
		if first == nil && e != nil && !errors.Is(e, context.Canceled) {
			first = e
		}
	}
	if errors.Is(first, http.ErrServerClosed) || errors.Is(first, context.Canceled) {
		first = nil
	}
	return first
}

// Close stops a running Run (as the end of its ctx does) and waits for it,
// then releases what New acquired: the listener, the NATS connection
// (drained when connected) and the embedded server. Run releases them on
// its way out; call Close yourself when Run is never called. Every later
// Run returns ErrClosed. It is idempotent, safe concurrently with Run, and
// returns nil; do not call it from a handler Run waits for.
func (s *Server) Close() error {
	s.life.stopOnce.Do(func() { close(s.life.stop) })
	s.life.mu.Lock()
	s.life.closed = true
	done := s.life.runDone
	s.life.mu.Unlock()
	if done != nil {
		<-done
	}
	s.release()
	return nil
}

// release releases what New acquired, once.
func (s *Server) release() {
	s.life.releaseOnce.Do(func() {
		if s.web.ln != nil {
			s.web.ln.Close()
		}
		s.closeNATS()
		if s.embedded != nil {
			s.embedded.Shutdown()
		}
	})
}

// closeNATS drains the connection (what was published is delivered) and
// waits for the drain, bounded; with the server gone it closes at once.
func (s *Server) closeNATS() {
	if s.nc == nil || s.nc.IsClosed() {
		return
	}
	if !s.nc.IsConnected() {
		s.nc.Close() // nothing to drain towards a server that is gone
		return
	}
	closed := make(chan struct{})
	s.nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := s.nc.Drain(); err != nil {
		s.nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		s.nc.Close()
	}
}

// signalUrgent asks the evaluation loop to run now: an event may have
// tripped a breaker.
func (s *Server) signalUrgent() {
	s.urgency.mu.Lock()
	if s.urgency.at.IsZero() {
		s.urgency.at = time.Now()
	}
	s.urgency.mu.Unlock()
	select {
	case s.urgency.ch <- struct{}{}:
	default:
	}
}

// evaluateEvery is the evaluation loop's tick: a tenth of the load beat
// (25 ms), or of the heartbeat without load beats, at most a tenth of
// analyzer.RuleTick. Each tick evaluates the pools that are due
// (analyzer.EvaluateDue: every pool on its own phase of the beat), so the
// pools publish across the beat, not all at one instant: at 20 pools
// followed by 250 routers each, one instant's 5,000 deliveries had kept a
// load frame 80 ms (p50; 29 ms since) from evaluation to a router's apply
// (docs/DEPLOY.md "Five minutes at 1,000 routers"). An event that may open a breaker wakes
// the loop at once (urgency) and evaluates every pool, so the tick bounds
// only what time alone decides: open_until passing, a heartbeat or load
// beat, a weight's step.
func evaluateEvery(s analyzer.Settings) time.Duration {
	d := s.Heartbeat
	if lb := s.LoadBeat; lb > 0 && lb < d {
		d = lb
	}
	return min(d, analyzer.RuleTick) / 10
}

// evaluateLoop evaluates the pools due every tick (state changes go out
// promptly and each pool's beats are honoured by the analyzer) and every
// pool at once when the collector signals an urgent event. It returns when
// ctx ends.
func (s *Server) evaluateLoop(ctx context.Context) {
	tick := time.NewTicker(s.tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.urgency.ch:
		}
		s.evaluate(ctx, time.Now())
	}
}

// evaluate evaluates the pools due at now, or every pool when an urgent
// event came since the last evaluation, and publishes what it decided.
func (s *Server) evaluate(ctx context.Context, now time.Time) {
	s.urgency.mu.Lock()
	urgentAt := s.urgency.at
	s.urgency.at = time.Time{}
	s.urgency.mu.Unlock()

	s.drainLoads()
	var ev analyzer.Evaluation
	if urgentAt.IsZero() {
		ev = s.an.EvaluateDue(now)
	} else {
		ev = s.an.Evaluate(now)
	}
	s.m.evalDuration.UpdateDuration(now)
	s.publish(ctx, ev.Snapshots)
	s.publishLoads(ev.Loads)
	if !urgentAt.IsZero() && len(ev.Transitions) > 0 {
		s.m.decisionLatency.UpdateDuration(urgentAt)
	}
	for _, t := range ev.Transitions {
		s.countTransition(t)
		s.logf("%s/%s %s -> %s: %s", t.Pool, t.Backend, t.From, t.To, t.Reason)
		if s.opts.OnTransition != nil {
			s.opts.OnTransition(t)
		}
	}
	s.afterTransitions(ev.Transitions, now)
}

// publish sends snapshots on their subjects and queues them for the KV,
// and records them for the status page. The publisher puts in the KV
// asynchronously, keeping only the latest queued snapshot per pool, so a
// slow JetStream or a flood of pools never delays this loop and with it
// another pool's heartbeat. While NATS is unreachable nothing is sent; the
// heartbeat publishes the current state once the connection is back.
//
// Only the pools of the partitions this instance holds a valid lease of
// are published, each with the lease's fence; a pool of another partition
// (its lease was lost since the evaluation) is counted and forgotten.
func (s *Server) publish(ctx context.Context, snaps []fleetwatch.Snapshot) {
	now := time.Now()
	var foreign map[string]bool
	filtered := false
	kept := snaps[:0:0]
	for i := range snaps {
		fence, ok, held := s.leases.Owns(snaps[i].Pool, now)
		if !ok {
			filtered = true
			if !held { // another instance's now: forget it here
				if foreign == nil {
					foreign = map[string]bool{}
				}
				foreign[snaps[i].Pool] = true
			} // else being rebuilt, or the lease is overdue: not now
			continue
		}
		snaps[i].Fence = fence
		kept = append(kept, snaps[i])
	}
	if !filtered {
		kept = snaps
	}
	if len(foreign) > 0 {
		s.m.unowned.Add(len(foreign))
		s.an.Forget(func(pool string) bool { return foreign[pool] })
		s.pub.Forget(func(pool string) bool { return foreign[pool] })
	}
	if s.nc.IsConnected() {
		sent := make([]string, 0, len(kept))
		for i := range kept {
			if err := s.pub.Publish(ctx, &kept[i]); err != nil {
				s.logf("publish %s: %v", kept[i].Pool, err)
				continue
			}
			sent = append(sent, kept[i].Pool)
		}
		s.notePublished(sent, now)
	} else if len(kept) > 0 {
		s.m.unpublished.Add(len(kept))
	}
	s.hist.record(kept)
}

// publishLoads sends the load frames of the pools whose load beat came
// (analyzer.Evaluation.Loads) on the compact feed, for the pools of the
// partitions this instance holds; nothing while NATS is unreachable (the
// next frames say what moved since the last one sent).
func (s *Server) publishLoads(snaps []fleetwatch.Snapshot) {
	if len(snaps) == 0 || !s.nc.IsConnected() {
		return
	}
	now := time.Now()
	for i := range snaps {
		fence, ok, _ := s.leases.Owns(snaps[i].Pool, now)
		if !ok {
			continue
		}
		snaps[i].Fence = fence
		if err := s.pub.PublishLoads(&snaps[i]); err != nil {
			s.logf("publish loads of %s: %v", snaps[i].Pool, err)
		}
	}
}

// finalSnapshot publishes every pool's snapshot once more on the way out,
// so routers see the last state at once (they keep it until it is stale).
func (s *Server) finalSnapshot() {
	if !s.nc.IsConnected() {
		s.logf("NATS unreachable: no final snapshot (routers keep the last one they have)")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	final := s.an.Final(time.Now())
	s.publish(ctx, final)
	if err := s.pub.Flush(ctx); err != nil {
		s.logf("final snapshot: the KV puts did not finish: %v", err)
	}
	s.logf("published a final snapshot of %d pools", len(final))
}

// Snapshots returns the current snapshot of every pool, sorted by pool.
func (s *Server) Snapshots() []fleetwatch.Snapshot {
	return s.an.Snapshots(time.Now())
}
