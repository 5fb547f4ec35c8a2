package main

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/demo"
)

func init() {
	register("demo", "serve plus a simulated fleet with scripted incidents (the newcomer's first command)", runDemo)
}

// runDemo is `fleetwatch demo`: see internal/demo.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted; the incidents take about 2 minutes)")
	script := fs.Duration("script", 2*time.Minute, "length of the incident script")
	rate := fs.Float64("rate", 40, "client requests per second through the router")
	seed := fs.Uint64("seed", 1, "seed of the traffic")
	verbose := fs.Bool("v", false, "also print fleetwatch's own log lines")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	nopts, err := f.nats.options()
	if err != nil {
		return err
	}
	s := demo.Settings{
		Out:         stdout,
		Script:      *script,
		Rate:        *rate,
		Seed:        *seed,
		HTTPListen:  f.http,
		NATSListen:  f.natsListen,
		Data:        f.data,
		NATSOptions: nopts,
	}
	if *verbose {
		s.Logf = logTo(stderr, "fleetwatch: ")
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	return demo.Run(ctx, s)
}
