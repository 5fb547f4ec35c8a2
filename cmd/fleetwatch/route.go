package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/router"
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
	feed          string // route.feed: compact or json
}

// runRoute is `fleetwatch route`: internal/router (the feed/route router,
// see its package documentation for the routing, retries and shedding)
// over the pools and the route block of --config, following the decisions
// through a feed watcher and publishing one outcome event per attempt on
// <prefix>.outcomes.<source>. It also serves /metrics (Prometheus text)
// and /healthz. The router's knobs are keys of the route block; a flag
// given on the command line overrides its key.
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
	fs.StringVar(&o.prefixFrom, "prefix-from", route.PrefixSystem, "what the affinity prefix hash is computed from: system (the first system message) or none (overrides route.prefix_from)")
	fs.IntVar(&o.maxAttempts, "max-attempts", route.DefaultMaxAttempts, "attempts per request, first included (retries also need the retry budget; overrides route.max_attempts)")
	fs.DurationVar(&o.idleGap, "idle-gap", route.DefaultIdleGap, "silence after which this router marks its next request to a backend cold (overrides route.idle_gap)")
	fs.Float64Var(&o.retryRatio, "retry-ratio", p2c.DefaultRetryRatio, "retries allowed per first attempt (the retry budget; overrides route.retry_ratio)")
	fs.Int64Var(&o.maxBody, "max-body", route.DefaultMaxBody, "largest request body accepted, in bytes (overrides route.max_body_bytes)")
	fs.DurationVar(&o.headerTimeout, "header-timeout", 0, "give up on a backend that sends no response headers within this time (a timeout outcome, retried); 0: wait as long as the client does (overrides route.header_timeout)")
	fs.StringVar(&o.feed, "feed", config.FeedCompact, "the feed followed: compact (the JSON snapshots when the server has no fw_feed bucket) or json (overrides route.feed)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if o.feed != config.FeedCompact && o.feed != config.FeedJSON {
		fmt.Fprintf(stderr, "--feed = %q: want compact or json\n", o.feed)
		return errUsage
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
		o.source = route.DefaultSource
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	if len(cfg.Pools) == 0 {
		return errors.New("the configuration has no pools: route needs --config with pools and backend urls")
	}
	o.override(fs, &cfg.Route)
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "route: "+format+"\n", args...) }

	// The router is built before NATS is dialled, so that a configuration
	// error is reported as such; its Run dials.
	var rt *router.Router
	rt, err = router.New(cfg, router.Options{
		Listen: o.listen,
		Source: o.source,
		Dial: func() (*nats.Conn, error) {
			return nf.connectURL("fleetwatch-route-"+o.source, cfg.NATS.URL, logf)
		},
		Logf: logf,
		OnListen: func(url string) {
			fmt.Fprintf(stdout, "route: listening on %s (%d pools, events on %s)\n", url, len(cfg.Pools), rt.Subject())
		},
	})
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer rt.Close()
	return rt.Run(ctx)
}

// override sets the keys of the route block whose flags were given on the
// command line: a flag wins over the file, a flag left out leaves the
// file's value (or route's default).
func (o *routeOptions) override(fs *flag.FlagSet, rc *config.RouteConfig) {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "prefix-from":
			rc.PrefixFrom = o.prefixFrom
		case "feed":
			rc.Feed = o.feed
		case "max-attempts":
			rc.MaxAttempts = &o.maxAttempts
		case "idle-gap":
			rc.IdleGap = &config.Duration{Duration: o.idleGap}
		case "retry-ratio":
			rc.RetryRatio = &o.retryRatio
		case "max-body":
			rc.MaxBodyBytes = &o.maxBody
		case "header-timeout":
			rc.HeaderTimeout = &config.Duration{Duration: o.headerTimeout}
		}
	})
}
