package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/bench"
	"github.com/fleetwatch/fleetwatch/internal/config"
)

// runBenchPeers is `fleetwatch bench peers`: fleetwatch's router, HAProxy,
// nginx and nginx steered by fleetwatch's pick endpoint side by side in
// front of the same fake backends, on the same traffic, through one
// incident script (internal/bench, RunPeers). It
// prints a Markdown table (docs/EVALUATION.md "Real peers").
func runBenchPeers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench peers", flag.ContinueOnError)
	var s bench.PeersSettings
	fs.StringVar(&s.HAProxy, "haproxy", "/usr/sbin/haproxy", "the HAProxy binary")
	fs.StringVar(&s.Nginx, "nginx", "/usr/sbin/nginx", "the nginx binary")
	fs.DurationVar(&s.Phase, "phase", 30*time.Second, "length of each of the four phases (healthy, 500s, 429s, stall)")
	fs.Float64Var(&s.Rate, "rate", 20, "requests per second sent to each balancer")
	fs.DurationVar(&s.FirstByte, "first-byte", 10*time.Second, "every balancer's budget for a backend's first byte (route's stall_floor, HAProxy's timeout server, nginx's proxy_read_timeout)")
	fs.DurationVar(&s.ClientTimeout, "client-timeout", 30*time.Second, "the load generator's timeout per request")
	fs.IntVar(&s.Routers, "routers", 1, "instances of each balancer (N nginx, N HAProxy of each kind, N fleetwatch routers sharing one serve, N nginx steered by one pick service of that serve); the requests are spread over them in turn")
	fs.StringVar(&s.Portkey, "portkey", "", "also run Portkey's open-source gateway: its start script, or a directory where @portkey-ai/gateway is npm-installed (bound to 127.0.0.1 by a preloaded module)")
	fs.StringVar(&s.Node, "node", "node", "the node binary that runs --portkey")
	balancers := fs.String("balancers", "", "comma-separated balancers to run (default all): "+strings.Join(bench.PeerNames(), ", "))
	fs.BoolVar(&s.SteeredAnalyzerDefaults, "steered-analyzer-defaults", false, "keep the analyzer's 429 defaults in the steered nginx's pool (default: throttled_run_counts and throttle_rate_counts all, as docs/INTEGRATIONS.md advises behind an access-log adapter)")
	fs.Uint64Var(&s.Seed, "seed", 1, "seed of the steered nginx's pick service")
	configFile := fs.String("config", "", "YAML configuration fleetwatch's serve and routers start from (analyzer and route blocks; NATS, HTTP, data, probes and pools are the benchmark's)")
	out := fs.String("out", "", "also write the table to this file")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fleetwatch bench peers: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	for _, b := range strings.Split(*balancers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			s.Balancers = append(s.Balancers, b)
		}
	}
	if s.Routers < 1 || s.Routers > 64 {
		return fmt.Errorf("bench peers: --routers %d: must be 1 to 64", s.Routers)
	}
	if *configFile != "" {
		cfg, err := config.Load(*configFile)
		if err != nil {
			return err
		}
		s.Config = cfg
	}
	if *verbose {
		s.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	}
	r, err := bench.RunPeers(ctx, s)
	if err != nil {
		return err
	}
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := r.WriteMarkdown(f); err != nil {
			return err
		}
	}
	return r.WriteMarkdown(stdout)
}
