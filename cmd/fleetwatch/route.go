package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

func init() {
	register("route", "a thin OpenAI-compatible router that follows the decisions", runRoute)
}

// routeOptions are route's flags beyond the NATS ones.
type routeOptions struct {
	listen      string
	source      string
	prefixFrom  string
	maxAttempts int
	idleGap     time.Duration
	retryRatio  float64
	maxBody     int64
	// headerTimeout bounds the wait for a backend's response headers; 0:
	// none (a hanging backend holds the request until the client gives up).
	headerTimeout time.Duration
}

// runRoute is `fleetwatch route`: the feed/route router (see its package
// documentation for the routing, retries and shedding) over the pools of
// --config, following the decisions through a feed watcher and publishing
// one outcome event per attempt on <prefix>.outcomes.<source>. It also
// serves /metrics (Prometheus text) and /healthz.
//
// Outcome events are queued and published in NDJSON batches (every 10ms or
// 64 KiB) by one goroutine: a slow or absent NATS never delays a request;
// a full queue drops events and counts them.
func runRoute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("route", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var o routeOptions
	host, _ := os.Hostname()
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8090", "address the proxy listens on")
	fs.StringVar(&o.source, "source", host, "this proxy's id: the source field of its events and the last token of its outcome subject")
	fs.StringVar(&o.prefixFrom, "prefix-from", "system", "what the affinity prefix hash is computed from: system (the first system message) or none")
	fs.IntVar(&o.maxAttempts, "max-attempts", 3, "attempts per request, first included (retries also need the retry budget)")
	fs.DurationVar(&o.idleGap, "idle-gap", 5*time.Minute, "silence after which this router marks its next request to a backend cold")
	fs.Float64Var(&o.retryRatio, "retry-ratio", p2c.DefaultRetryRatio, "retries allowed per first attempt (the retry budget)")
	fs.Int64Var(&o.maxBody, "max-body", 32<<20, "largest request body accepted, in bytes")
	fs.DurationVar(&o.headerTimeout, "header-timeout", 0, "give up on a backend that sends no response headers within this time (a timeout outcome, retried); 0: wait as long as the client does")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if o.prefixFrom != "system" && o.prefixFrom != "none" {
		fmt.Fprintf(stderr, "--prefix-from = %q: want system or none\n", o.prefixFrom)
		return errUsage
	}
	if o.maxAttempts < 1 {
		fmt.Fprintf(stderr, "--max-attempts = %d: must be >= 1\n", o.maxAttempts)
		return errUsage
	}
	if o.source == "" {
		o.source = "route"
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	if len(cfg.Pools) == 0 {
		return errors.New("the configuration has no pools: route needs --config with pools and backend urls")
	}
	pools := cfg.RoutePools(os.Getenv, p2c.Settings{RetryRatio: o.retryRatio})
	subjects := fleetwatch.Subjects{Prefix: cfg.Prefix}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "route: "+format+"\n", args...) }

	// One metrics set for the router, its publisher and its watcher, served
	// on /metrics. The router is built before NATS is dialled, so that a
	// configuration error is reported as such; the publisher's Run, the one
	// caller of Publish, starts once nc is set.
	set := metrics.NewSet()
	var nc *nats.Conn
	events, err := route.NewOutcomePublisher(route.PublisherSettings{
		Subject: subjects.Outcomes() + "." + route.SubjectToken(o.source),
		Publish: func(subject string, data []byte) error { return nc.Publish(subject, data) },
		Metrics: set,
	})
	if err != nil {
		return err
	}
	rt, err := route.New(cfg.RouteSettings(route.Settings{
		Pools:         pools,
		HeaderTimeout: o.headerTimeout,
		MaxAttempts:   o.maxAttempts,
		Source:        o.source,
		PrefixFrom:    o.prefixFrom,
		IdleGap:       o.idleGap,
		MaxBody:       o.maxBody,
		Publisher:     events,
		Metrics:       set,
		Logf:          logf,
	}))
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer rt.Close()

	nc, err = nf.connectURL("fleetwatch-route-"+o.source, cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer nc.Close()
	pubDone := make(chan error, 1)
	go func() { pubDone <- events.Run(context.WithoutCancel(ctx)) }() // exits on Close
	defer func() {
		events.Close()
		<-pubDone
		if nc.IsConnected() { // hand the last batch over; never wait for a server that is gone
			nc.FlushTimeout(2 * time.Second)
		}
	}()

	// The feed watcher applies every newer snapshot of a configured pool to
	// its picker (live from the decisions subjects, and at start and after
	// a reconnect from the KV bucket).
	watcher, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix:   cfg.Prefix,
		Pools:    rt.Pools(),
		OnUpdate: rt.Apply,
		Metrics:  set,
		Logf:     logf,
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

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: routeHandler(rt, set), ReadHeaderTimeout: 30 * time.Second}
	fmt.Fprintf(stdout, "route: listening on http://%s (%d pools, events on %s)\n",
		ln.Addr(), len(pools), events.Subject())
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }() // exits when srv shuts down
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	<-serveErr
	return nil
}

// routeHandler serves the router's API, plus /metrics (Prometheus text) and
// /healthz.
func routeHandler(rt *route.Router, set *metrics.Set) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			set.WritePrometheus(w)
		case r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/health"):
			w.WriteHeader(http.StatusOK)
		default:
			rt.ServeHTTP(w, r)
		}
	})
}
