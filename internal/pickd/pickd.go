// Package pickd is `fleetwatch epp` as a value: the one assembly of the
// pick core (a feed/route route.Pools over the configuration's pools)
// following the decisions through a feed Watcher, an OutcomePublisher (one
// outcome event per answered request, batched onto
// <prefix>.outcomes.<source>), feed/epp's endpoint picker served with
// gRPC health on one gRPC listener, and an HTTP listener that serves
// /metrics, /healthz, feed/epp's pick endpoint /v1/pick (for nginx's
// auth_request and Caddy's forward_auth; its picks are finished by the
// outcome events of the steered proxy's log adapter, Options.PickSources)
// and the routes Options.HTTP adds.
//
// Readiness (the gRPC services readiness, "" and the ext_proc service,
// and /healthz): ready while NATS is connected and the served pools have a
// decision, or once Options.ReadyTimeout passed without one (the picker
// then picks on equal weights and its own signals, failing static as the
// router does); not ready again while NATS is away and while draining.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): New checks the settings and
// starts nothing. Run dials NATS, follows the decisions, listens and serves
// until its ctx ends or Close is called, then drains (readiness off, the
// gRPC streams given DrainTimeout to finish, the last outcome events
// flushed) and releases what it used; it runs once: a later Run returns
// ErrClosed, a concurrent one ErrRunning. Close is idempotent and waits for
// a running Run.
package pickd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/epp"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/runonce"
)

var (
	// ErrRunning: a Run of this Daemon runs now.
	ErrRunning = errors.New("pickd: already running")
	// ErrClosed: the Daemon was closed, or its Run already returned.
	ErrClosed = errors.New("pickd: closed")
	// ErrNoPools: the configuration has no pools to pick from.
	ErrNoPools = errors.New("pickd: the configuration has no pools")
)

// Defaults of Options.
const (
	// DefaultReadyTimeout is how long readiness waits for the served
	// pools' first decision before the picker serves on equal weights.
	DefaultReadyTimeout = 10 * time.Second
	// DefaultDrainTimeout bounds the wait for open ext_proc streams (a
	// streamed answer can last minutes) at the end of Run; then they are
	// cut.
	DefaultDrainTimeout = 30 * time.Second
	// flushTimeout bounds the hand-over of the last outcome events.
	flushTimeout = 2 * time.Second
	// readyEvery is how often readiness is recomputed.
	readyEvery = 100 * time.Millisecond
)

// DefaultPickSources are Options.PickSources' default: the source of
// `fleetwatch ingest nginx` (config.DefaultIngestSource's nginx name), the
// proxy that asks /v1/pick.
var DefaultPickSources = []string{"fleetwatch-ingest-nginx"}

// Options are what the configuration file does not say: this process's
// addresses and identity, its NATS connection, the picker's knobs and the
// hooks. The zero value works.
type Options struct {
	// GRPCListen is the ext_proc and health address. If empty,
	// 127.0.0.1:0 (a free loopback port; see GRPCAddr).
	GRPCListen string
	// GRPCTLS, if not nil, serves the gRPC listener over TLS (see
	// SelfSignedTLS); nil serves plaintext HTTP/2 (h2c).
	GRPCTLS *tls.Config
	// HTTPListen is the /metrics and /healthz address. If empty,
	// 127.0.0.1:0; "-" serves no HTTP listener.
	HTTPListen string
	// Source is this picker's id: the source of its events and the last
	// token of its outcome subject. If empty, epp.DefaultSource.
	Source string
	// EPP are the picker's knobs (Pool, PoolHeader, Fallbacks,
	// PrefixFrom, BodyMode, MaxBody, Visibility,
	// LeaveAfterResponseHeaders, Seed); Pools, Publisher, Source, Metrics
	// and Logf are the assembly's.
	EPP epp.Settings
	// ReadyTimeout: see DefaultReadyTimeout; negative waits for a decision
	// forever.
	ReadyTimeout time.Duration
	// DrainTimeout: see DefaultDrainTimeout.
	DrainTimeout time.Duration
	// HTTP, if not nil, returns the handler of the HTTP listener's other
	// routes (beside /metrics, /healthz and /v1/pick), which may pick
	// through d.Core() and count in d.Metrics(). Handler calls it (Run
	// once).
	HTTP func(d *Daemon) http.Handler
	// PickHold is how long an HTTP pick counts in flight when no outcome
	// event finishes it (epp.PickSettings.Hold). If zero, epp.DefaultHold.
	PickHold time.Duration
	// PickSources are the sources whose outcome events finish the HTTP
	// picks: the log adapter of the proxy that asks. If empty,
	// DefaultPickSources.
	PickSources []string
	// Dial connects to NATS; Run calls it once and closes the connection
	// when it returns. If nil, cfg.NATS.URL (nats.DefaultURL when empty)
	// is dialled with reconnects forever.
	Dial func() (*nats.Conn, error)
	// Metrics receives every series, served on /metrics. If nil, a new set.
	Metrics *metrics.Set
	// Logf receives operational messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// OnListen, if not nil, is called by Run once it listens, before it
	// serves, with the gRPC address and the HTTP base URL ("" without one).
	OnListen func(grpcAddr, httpURL string)
	// OnApply, if not nil, is called after every snapshot the watcher
	// applied.
	OnApply func(*fleetwatch.Snapshot)
}

// Daemon is one running `fleetwatch epp`.
type Daemon struct {
	cfg    *config.Config
	opts   Options
	set    *metrics.Set
	core   *route.Pools
	epp    *epp.Server
	pick   *epp.PickHandler
	events *route.OutcomePublisher
	nc     *nats.Conn // set by Run before the publisher's Run starts
	ready  chan struct{}
	life   *runonce.Once

	mu       sync.Mutex      // guards the fields below
	grpcAddr string          // once Run listens
	httpURL  string          // once Run listens ("" without an HTTP listener)
	decided  map[string]bool // the served pools that have a decision
}

// New assembles the picker over cfg's pools and opts; it starts nothing.
// An error is the configuration's (ErrNoPools, route.ErrConfig or
// epp.ErrConfig naming the pool, backend or setting).
func New(cfg *config.Config, opts Options) (*Daemon, error) {
	if cfg == nil || len(cfg.Pools) == 0 {
		return nil, ErrNoPools
	}
	if opts.GRPCListen == "" {
		opts.GRPCListen = "127.0.0.1:0"
	}
	if opts.HTTPListen == "" {
		opts.HTTPListen = "127.0.0.1:0"
	}
	if opts.Source == "" {
		opts.Source = epp.DefaultSource
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	d := &Daemon{cfg: cfg, opts: opts, set: opts.Metrics, ready: make(chan struct{}), life: runonce.New(ErrRunning, ErrClosed),
		decided: map[string]bool{}}
	if d.set == nil {
		d.set = metrics.NewSet()
	}
	var err error
	if d.core, err = route.NewPools(cfg.RoutePools(os.Getenv, p2c.Settings{}), opts.EPP.Now, opts.Logf); err != nil {
		return nil, err
	}
	d.events, err = route.NewOutcomePublisher(route.PublisherSettings{
		Subject: fleetwatch.Subjects{Prefix: cfg.Prefix}.OutcomesFrom(opts.Source),
		Publish: func(subject string, data []byte) error { return d.nc.Publish(subject, data) },
		Metrics: d.set,
	})
	if err != nil {
		return nil, err
	}
	s := opts.EPP
	s.Pools, s.Publisher, s.Source, s.Metrics, s.Logf = d.core, d.events, opts.Source, d.set, opts.Logf
	if d.epp, err = epp.New(s); err != nil {
		return nil, err
	}
	if len(d.opts.PickSources) == 0 {
		d.opts.PickSources = DefaultPickSources
	}
	why := s.Visibility == epp.VisibilityHeaders || s.Visibility == epp.VisibilityBoth
	if d.pick, err = epp.NewPickHandler(epp.PickSettings{Pools: d.core, Hold: opts.PickHold, Why: why,
		Metrics: d.set, Now: opts.EPP.Now, Seed: opts.EPP.Seed}); err != nil {
		return nil, err
	}
	return d, nil
}

// Pick is the HTTP pick endpoint served on /v1/pick.
func (d *Daemon) Pick() *epp.PickHandler { return d.pick }

// EPP is the endpoint picker.
func (d *Daemon) EPP() *epp.Server { return d.epp }

// Core is the pick core the picker and the HTTP routes share.
func (d *Daemon) Core() *route.Pools { return d.core }

// Metrics is the set /metrics serves.
func (d *Daemon) Metrics() *metrics.Set { return d.set }

// Subject is the subject of the outcome events.
func (d *Daemon) Subject() string { return d.events.Subject() }

// Ready is closed once Run serves; GRPCAddr and HTTPURL are then set.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// GRPCAddr is the ext_proc and health address once Run listens.
func (d *Daemon) GRPCAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.grpcAddr
}

// HTTPURL is the HTTP listener's base URL once Run listens ("" without one).
func (d *Daemon) HTTPURL() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.httpURL
}

// Handler serves /metrics (Prometheus text), /healthz (also /health: 200
// when ready, 503 otherwise), /v1/pick and the routes of Options.HTTP.
func (d *Daemon) Handler() http.Handler {
	var extra http.Handler
	if d.opts.HTTP != nil {
		extra = d.opts.HTTP(d)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case req.Method == http.MethodGet && req.URL.Path == "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			d.set.WritePrometheus(w)
		case req.Method == http.MethodGet && (req.URL.Path == "/healthz" || req.URL.Path == "/health"):
			if !d.epp.Ready() {
				http.Error(w, "not ready: waiting for NATS or the pool's first decision", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		case req.URL.Path == "/v1/pick":
			d.pick.ServeHTTP(w, req)
		case extra != nil:
			extra.ServeHTTP(w, req)
		default:
			http.NotFound(w, req)
		}
	})
}

// Run dials NATS, starts the publisher and the watcher, listens and serves
// until ctx ends or Close is called; then it drains and returns nil. An
// error dialling, watching, listening ("listen: ...") or serving
// ("serve: ...") ends it early.
func (d *Daemon) Run(ctx context.Context) error {
	return d.life.Run(ctx, d.serve, nil)
}

// serve is Run past its guard: NATS, the publisher and the watcher, then
// the listeners (listen.go).
func (d *Daemon) serve(ctx context.Context) error {
	dial := d.opts.Dial
	if dial == nil {
		dial = d.dial
	}
	nc, err := dial()
	if err != nil {
		return err
	}
	defer nc.Close()
	d.nc = nc
	pubDone := make(chan error, 1)
	go func() { pubDone <- d.events.Run(context.WithoutCancel(ctx)) }() // exits on Close
	defer func() {
		d.events.Close()
		<-pubDone
		if nc.IsConnected() { // hand the last batch over; never wait for a server that is gone
			nc.FlushTimeout(flushTimeout)
		}
	}()
	watcher, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix:   d.cfg.Prefix,
		Pools:    d.core.IDs(),
		OnUpdate: d.apply,
		Compact:  d.cfg.Route.CompactFeed(),
		OnLoads:  d.core.ApplyLoads,
		Metrics:  d.set,
		Logf:     d.opts.Logf,
	})
	if err != nil {
		return err
	}
	unfollow, err := d.followPicks(ctx, nc)
	if err != nil {
		return err
	}
	defer unfollow()
	watchDone := make(chan error, 1)
	go func() { watchDone <- watcher.Run(ctx) }() // exits on ctx or Close
	defer func() {
		watcher.Close()
		<-watchDone
	}()
	return d.listen(ctx, nc)
}

// followPicks subscribes to the outcome events of the pick sources, each
// of which finishes the oldest HTTP pick outstanding on its backend, and
// sweeps the picks whose hold passed; the returned func stops both. A
// publisher of its own publishes on <prefix>.outcomes.<source>, every
// event of which is taken; the log adapters (`fleetwatch ingest nginx`)
// publish on <prefix>.outcomes.<pool>, where only the events whose source
// is a pick source are taken.
func (d *Daemon) followPicks(ctx context.Context, nc *nats.Conn) (func(), error) {
	subj := fleetwatch.Subjects{Prefix: d.cfg.Prefix}
	sources := map[string]bool{}
	subjects := map[string]bool{} // subject -> every event taken
	for _, src := range d.opts.PickSources {
		sources[src] = true
		subjects[subj.OutcomesFrom(src)] = true
	}
	for _, pool := range d.core.IDs() {
		if s := subj.Outcomes() + "." + pool; !subjects[s] {
			subjects[s] = false
		}
	}
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for subject, all := range subjects {
		var dec fleetwatch.Decoder // the callback of one subscription runs on one goroutine
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			dec.DecodeBatch(m.Data, func(_ []byte, ev *fleetwatch.Event, err error) {
				if err == nil && (all || sources[ev.Source]) {
					d.pick.Outcome(ev)
				}
			})
		})
		if err != nil {
			stop()
			return nil, fmt.Errorf("pickd: subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	// The server has the subscriptions before the daemon says it is
	// ready: an outcome published after that finishes its pick. (A server
	// that does not answer is not waited for: nats.go sends the
	// subscriptions again when it reconnects.)
	_ = nc.FlushTimeout(flushTimeout)
	hold := d.opts.PickHold
	if hold <= 0 {
		hold = epp.DefaultHold
	}
	every := max(hold/8, 100*time.Millisecond)
	sweepCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // exits when cancel is called or ctx ends
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case now := <-t.C:
				d.pick.Sweep(now)
			}
		}
	}()
	return func() { stop(); cancel(); <-done }, nil
}

// apply hands a snapshot to the pick core and notes the served pools'
// first decisions.
func (d *Daemon) apply(snap *fleetwatch.Snapshot) {
	d.core.Apply(snap)
	d.mu.Lock()
	d.decided[snap.Pool] = true
	d.mu.Unlock()
	if hook := d.opts.OnApply; hook != nil {
		hook(snap)
	}
}

// isReady is the readiness rule at now, for a Run that started at start.
func (d *Daemon) isReady(nc *nats.Conn, start, now time.Time) bool {
	if !nc.IsConnected() {
		return false
	}
	d.mu.Lock()
	decided := true
	for _, id := range d.epp.Pools() {
		decided = decided && d.decided[id]
	}
	d.mu.Unlock()
	return decided || (d.opts.ReadyTimeout > 0 && now.Sub(start) >= d.opts.ReadyTimeout)
}

// dial is Options.Dial's default.
func (d *Daemon) dial() (*nats.Conn, error) {
	url := d.cfg.NATS.URL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, nats.Name("fleetwatch-epp-"+d.opts.Source), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("pickd: nats: %w", err)
	}
	return nc, nil
}

// Start runs Run in a goroutine and returns once the daemon serves, or
// Run's error if it ended first. Close stops it; an error of Run after
// Start returned is logged.
func (d *Daemon) Start(ctx context.Context) error {
	return d.life.Start(ctx, d.Run, d.ready, func(format string, args ...any) { d.opts.Logf("pickd: "+format, args...) })
}

// Close stops a running Run and waits for it to drain and return, or,
// before Run, releases the daemon (a later Run returns ErrClosed). It is
// idempotent and returns nil.
func (d *Daemon) Close() error {
	d.life.Close()
	return nil
}
