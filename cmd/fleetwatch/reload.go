package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
)

// adjust applies the command line's overrides to a configuration read
// from the file: at start (loadConfig, apply) and at every reload, so
// that a flag keeps winning over the file.
func (f *serveFlags) adjust(cfg *config.Config) error {
	if f.nats.prefix != "" {
		cfg.Prefix = f.nats.prefix
	}
	if f.nats.url != "" {
		cfg.NATS.URL = f.nats.url
	}
	return f.apply(cfg)
}

// reloadOnHangup reloads srv's configuration file at every SIGHUP until
// the returned stop is called (serve logs the outcome on stderr, and
// counts it in /metrics). It is registered before serve runs, so that a
// SIGHUP never takes the default action (exit) once serve is up.
func reloadOnHangup(ctx context.Context, srv *serve.Server, stderr io.Writer) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				logTo(stderr, "fleetwatch: ")("SIGHUP: reloading the configuration")
				srv.Reload() // logs its result or its error
			}
		}
	})
	return func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}
}
