// Package router is `fleetwatch route` as a value: the one assembly of a
// feed/route Router over the configuration's pools and route block, its
// OutcomePublisher (one outcome event per attempt, batched onto
// <prefix>.outcomes.<source>), the feed Watcher that applies the
// decisions, one metrics set for the three, and the HTTP listener that
// serves the router's API with /metrics and /healthz.
//
// cmd's route, the demo, the peers benchmark and the end-to-end tests all
// run this assembly, so that they route as a deployed router does.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): New checks the settings and
// starts nothing. Run dials NATS, follows the decisions, listens and serves
// until its ctx ends or Close is called, then drains (the HTTP server shut
// down gracefully, the last outcome events flushed) and releases what it
// used; it runs once: a later Run returns ErrClosed, a concurrent one
// ErrRunning. Close is idempotent and waits for a running Run.
package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/runonce"
)

var (
	// ErrRunning: a Run of this Router runs now.
	ErrRunning = errors.New("router: already running")
	// ErrClosed: the Router was closed, or its Run already returned.
	ErrClosed = errors.New("router: closed")
	// ErrNoPools: the configuration has no pools to route to.
	ErrNoPools = errors.New("router: the configuration has no pools")
)

// Timeouts of Run's end.
const (
	// shutdownTimeout bounds the graceful HTTP shutdown; then the
	// connections left are closed.
	shutdownTimeout = 10 * time.Second
	// flushTimeout bounds the hand-over of the last outcome events.
	flushTimeout = 2 * time.Second
)

// Options are what the configuration file does not say: this process's
// address and identity, its NATS connection and its hooks. The zero value
// works.
type Options struct {
	// Listen is the address the router serves on. If empty, 127.0.0.1:0
	// (a free loopback port; see URL).
	Listen string
	// Source is this router's id: the source field of its events and the
	// last token of its outcome subject. If empty, route.DefaultSource.
	Source string
	// Dial connects to NATS; Run calls it once and closes the connection
	// when it returns. If nil, cfg.NATS.URL (nats.DefaultURL when empty)
	// is dialled with reconnects forever.
	Dial func() (*nats.Conn, error)
	// Metrics receives the metrics of the router, its publisher and its
	// watcher, served on /metrics. If nil, a new set is used (Metrics).
	Metrics *metrics.Set
	// Logf receives operational messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// OnListen, if not nil, is called by Run once the router follows the
	// decisions and listens, before it serves, with its base URL
	// ("http://127.0.0.1:8090").
	OnListen func(url string)
	// OnApply, if not nil, is called after every snapshot the watcher
	// handed to the router (tests record what the router applied).
	OnApply func(*fleetwatch.Snapshot)
}

// Router is one running `fleetwatch route`.
type Router struct {
	cfg    *config.Config
	opts   Options
	set    *metrics.Set
	rt     *route.Router
	events *route.OutcomePublisher
	nc     *nats.Conn // set by Run before the publisher's Run starts
	ready  chan struct{}
	life   *runonce.Once

	mu  sync.Mutex // guards url
	url string     // the base URL, once Run listens
}

// New assembles the router over cfg's pools (backend URLs, API keys read
// from the environment, pickers) and cfg's route block. It starts nothing:
// an error is the configuration's (ErrNoPools, or route's ErrConfig naming
// the pool, backend or setting).
func New(cfg *config.Config, opts Options) (*Router, error) {
	if cfg == nil || len(cfg.Pools) == 0 {
		return nil, ErrNoPools
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.Source == "" {
		opts.Source = route.DefaultSource
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	r := &Router{cfg: cfg, opts: opts, set: opts.Metrics, ready: make(chan struct{}), life: runonce.New(ErrRunning, ErrClosed)}
	if r.set == nil {
		r.set = metrics.NewSet()
	}
	subjects := fleetwatch.Subjects{Prefix: cfg.Prefix}
	events, err := route.NewOutcomePublisher(route.PublisherSettings{
		Subject: subjects.OutcomesFrom(opts.Source),
		Publish: func(subject string, data []byte) error { return r.nc.Publish(subject, data) },
		Metrics: r.set,
	})
	if err != nil {
		return nil, err
	}
	rt, err := route.New(cfg.RouteSettings(route.Settings{
		Pools:     cfg.RoutePools(os.Getenv, p2c.Settings{}),
		Source:    opts.Source,
		Publisher: events,
		Metrics:   r.set,
		Logf:      opts.Logf,
	}))
	if err != nil {
		return nil, err
	}
	r.rt, r.events = rt, events
	return r, nil
}

// Route is the feed/route Router (its ShadowStats, Pools, Apply).
func (r *Router) Route() *route.Router { return r.rt }

// Metrics is the set /metrics serves.
func (r *Router) Metrics() *metrics.Set { return r.set }

// Subject is the subject of the router's outcome events.
func (r *Router) Subject() string { return r.events.Subject() }

// Ready is closed once Run serves; URL is then set.
func (r *Router) Ready() <-chan struct{} { return r.ready }

// URL is the router's base URL ("http://127.0.0.1:8090") once it serves;
// empty before.
func (r *Router) URL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.url
}

// Handler serves the router's API, plus /metrics (Prometheus text) and
// /healthz (also /health).
func (r *Router) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case req.Method == http.MethodGet && req.URL.Path == "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			r.set.WritePrometheus(w)
		case req.Method == http.MethodGet && (req.URL.Path == "/healthz" || req.URL.Path == "/health"):
			w.WriteHeader(http.StatusOK)
		default:
			r.rt.ServeHTTP(w, req)
		}
	})
}

// Run dials NATS, starts the publisher and the watcher, listens and serves
// until ctx ends or Close is called; then it shuts the HTTP server down
// gracefully (bounded), stops the watcher, flushes the last outcome events
// and closes the connection, and returns nil. An error dialling, watching,
// listening ("listen: ...") or serving ("serve: ...") ends it early.
func (r *Router) Run(ctx context.Context) error {
	return r.life.Run(ctx, r.serve, func() { r.rt.Close() }) // the router's last step, after the drain
}

// serve is Run past its guard.
func (r *Router) serve(ctx context.Context) error {
	dial := r.opts.Dial
	if dial == nil {
		dial = r.dial
	}
	nc, err := dial()
	if err != nil {
		return err
	}
	defer nc.Close()
	r.nc = nc
	pubDone := make(chan error, 1)
	go func() { pubDone <- r.events.Run(context.WithoutCancel(ctx)) }() // exits on Close
	defer func() {
		r.events.Close()
		<-pubDone
		if nc.IsConnected() { // hand the last batch over; never wait for a server that is gone
			nc.FlushTimeout(flushTimeout)
		}
	}()

	// The watcher applies every newer snapshot of a configured pool to its
	// picker (live from the decisions subjects, and at start and after a
	// reconnect from the KV bucket).
	onUpdate := r.rt.Apply
	if hook := r.opts.OnApply; hook != nil {
		onUpdate = func(s *fleetwatch.Snapshot) { r.rt.Apply(s); hook(s) }
	}
	watcher, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix:   r.cfg.Prefix,
		Pools:    r.rt.Pools(),
		OnUpdate: onUpdate,
		Compact:  r.cfg.Route.CompactFeed(),
		OnLoads:  r.rt.ApplyLoads,
		Metrics:  r.set,
		Logf:     r.opts.Logf,
	})
	if err != nil {
		return err
	}
	watchDone := make(chan error, 1)
	go func() { watchDone <- watcher.Run(ctx) }() // exits on ctx or Close
	defer func() {
		watcher.Close()
		<-watchDone
	}()

	ln, err := net.Listen("tcp", r.opts.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 30 * time.Second}
	url := "http://" + ln.Addr().String()
	r.mu.Lock()
	r.url = url
	r.mu.Unlock()
	if r.opts.OnListen != nil {
		r.opts.OnListen(url)
	}
	close(r.ready)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }() // exits when srv shuts down
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	<-serveErr
	return nil
}

// dial is Options.Dial's default.
func (r *Router) dial() (*nats.Conn, error) {
	url := r.cfg.NATS.URL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, nats.Name("fleetwatch-route-"+r.opts.Source), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("router: nats: %w", err)
	}
	return nc, nil
}

// Start runs Run in a goroutine and returns once the router serves, or
// Run's error if it ended first. Close stops it; an error of Run after
// Start returned is logged.
func (r *Router) Start(ctx context.Context) error {
	return r.life.Start(ctx, r.Run, r.ready, func(format string, args ...any) { r.opts.Logf("router: "+format, args...) })
}

// Close stops a running Run and waits for it to drain and return, or,
// before Run, releases the router (a later Run returns ErrClosed). It is
// idempotent and returns nil.
func (r *Router) Close() error {
	r.life.Close()
	r.rt.Close()
	return nil
}
