package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
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

// runRoute is `fleetwatch route`: an OpenAI-compatible reverse proxy that
// routes POST /v1/chat/completions, /v1/completions and /v1/embeddings to a
// backend of the pool serving the request's model, chosen by the pool's p2c
// picker from fleetwatch's decisions, and publishes one outcome event per
// attempt on <prefix>.outcomes.<source>.
//
// The pool is the one whose id or `models` list names the request's model;
// with a single pool every model goes there, otherwise an unknown model is
// a 404. GET /v1/models lists the configured model ids. Until a pool's first
// decision arrives (and whenever its decision is stale) the picker routes
// on equal weights and the router's own signals; open breakers whose
// open_until is ahead stay honoured.
//
// Connect errors, 5xx and 429 are retried on another backend while the
// client has seen nothing, within the retry budget and --max-attempts;
// never once a byte has gone to the client. A backend that breaks off
// mid-answer makes the router drop the client's connection too. When every
// backend is open (all_open=shed) the answer is 503 with Retry-After.
// Responses carry X-Fleetwatch-Backend and X-Fleetwatch-Attempts. The
// router also serves /metrics (Prometheus text) and /healthz.
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
	pools, err := newRoutePools(cfg, p2c.Settings{RetryRatio: o.retryRatio})
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	subjects := fleetwatch.Subjects{Prefix: cfg.Prefix}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "route: "+format+"\n", args...) }

	nc, err := nf.connectURL("fleetwatch-route-"+o.source, cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer nc.Close()

	rt := newRouter(pools, o)
	rt.events = newOutcomePublisher(outcomePublisherSettings{
		Subject: subjects.Outcomes() + "." + subjectToken(o.source),
		Publish: nc.Publish,
		Metrics: rt.metrics.set,
	})
	pubDone := make(chan error, 1)
	go func() { pubDone <- rt.events.Run(context.WithoutCancel(ctx)) }()
	defer func() {
		rt.events.Close()
		<-pubDone
		if nc.IsConnected() { // hand the last batch over; never wait for a server that is gone
			nc.FlushTimeout(2 * time.Second)
		}
	}()

	// The feed watcher applies every newer snapshot of a configured pool to
	// its picker (live from the decisions subjects, and at start and after
	// a reconnect from the KV bucket).
	watcher, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix: cfg.Prefix,
		Pools:  slices.Sorted(maps.Keys(pools)),
		OnUpdate: func(snap *fleetwatch.Snapshot) {
			if p := pools[snap.Pool]; p != nil {
				p.apply(snap)
			}
		},
		Metrics: rt.metrics.set,
		Logf:    logf,
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
	srv := &http.Server{Handler: rt, ReadHeaderTimeout: 30 * time.Second}
	fmt.Fprintf(stdout, "route: listening on http://%s (%d pools, events on %s)\n",
		ln.Addr(), len(pools), rt.events.subject)
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

func newRouter(pools map[string]*routePool, o routeOptions) *router {
	rt := &router{
		pools:       pools,
		byModel:     map[string]*routePool{},
		source:      o.source,
		prefixFrom:  o.prefixFrom,
		maxAttempts: o.maxAttempts,
		idleGap:     o.idleGap,
		maxBody:     o.maxBody,
		metrics:     newRouteMetrics(),
		client: &http.Client{Transport: &http.Transport{
			Proxy:                 nil, // a router talks to its backends directly
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: o.headerTimeout,
		}},
	}
	if rt.maxBody <= 0 {
		rt.maxBody = 32 << 20
	}
	if rt.maxAttempts <= 0 {
		rt.maxAttempts = 1
	}
	if rt.idleGap <= 0 {
		rt.idleGap = 5 * time.Minute
	}
	seed := rand.Uint64()
	var n atomic.Uint64
	rt.rngs.New = func() any { return rand.New(rand.NewPCG(seed, n.Add(1))) }
	for _, id := range slices.Sorted(maps.Keys(pools)) {
		p := pools[id]
		for _, m := range p.models {
			if _, dup := rt.byModel[m]; !dup {
				rt.byModel[m] = p
				rt.models = append(rt.models, m)
			}
		}
	}
	if len(pools) == 1 {
		for _, p := range pools {
			rt.single = p
		}
	}
	return rt
}

// subjectToken makes s usable as one NATS subject token.
func subjectToken(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}
