package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
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
	insecure    bool
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	f.nats.register(fs)
	fs.StringVar(&f.http, "http", "", "HTTP listen address for /metrics, /healthz, /api/decisions and the status page (default 127.0.0.1:8080)")
	fs.StringVar(&f.data, "data", "", "data directory: embedded NATS store, drift reviews (default ./data)")
	fs.StringVar(&f.natsListen, "nats-listen", "", "listen address of the embedded NATS server when --nats is empty (default 127.0.0.1:4222)")
	fs.BoolVar(&f.noJetStream, "no-jetstream", false, "run without JetStream: no replay on restart, no KV, no drift stream")
	fs.BoolVar(&f.noProbes, "no-probes", false, "do not run drift probes")
	fs.BoolVar(&f.insecure, "http-insecure", false, "allow a non-loopback --http without authentication (http.insecure)")
}

// apply sets the flags over cfg.
func (f *serveFlags) apply(cfg *config.Config) error {
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
	if f.insecure {
		cfg.HTTP.Insecure = true
	}
	return cfg.Validate()
}

// options are the serve.Options the flags give: NATS authentication and
// TLS, and log lines on stderr.
func (f *serveFlags) options(stderr io.Writer) (serve.Options, error) {
	nopts, err := f.nats.options()
	if err != nil {
		return serve.Options{}, err
	}
	return serve.Options{NATSOptions: nopts, Logf: logTo(stderr, "fleetwatch: ")}, nil
}

// logTo is a Logf that writes lines with prefix to w.
func logTo(w io.Writer, prefix string) func(string, ...any) {
	return func(format string, args ...any) { fmt.Fprintf(w, prefix+format+"\n", args...) }
}

// runServe is `fleetwatch serve`: the daemon until the first signal, which
// drains it (a last snapshot goes out); a second signal exits at once.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := f.nats.loadConfig()
	if err != nil {
		return err
	}
	if err := f.apply(cfg); err != nil {
		return err
	}
	opts, err := f.options(stderr)
	if err != nil {
		return err
	}
	if cfg.NATS.URL != "" {
		// serve's connection retries forever; a TLS or credentials
		// problem is said now instead.
		if err := f.nats.check(cfg.NATS.URL); err != nil {
			return err
		}
	}
	var srv *serve.Server
	opts.OnReady = func() {
		// After the restore and the replay: scripts and tests wait for
		// this line.
		fmt.Fprintf(stdout, "fleetwatch: HTTP on %s (status page /, /metrics, /api/decisions, /healthz)\n", srv.HTTPURL())
	}
	opts.ConfigFile, opts.AdjustConfig = f.nats.configFile, f.adjust // SIGHUP and POST /-/reload
	srv, err = serve.New(cfg, opts)
	if err != nil {
		return err
	}
	if cfg.NATS.URL == "" {
		fmt.Fprintf(stdout, "fleetwatch: embedded NATS server at %s (JetStream: %v, store %s)\n", srv.NATSURL(), srv.JetStream(), cfg.StoreDir())
	}
	stopHangup := reloadOnHangup(ctx, srv, stderr)
	defer stopHangup()
	return srv.Run(ctx)
}
