package main

import (
	"context"
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
)

// testServeConfig is the default config with an embedded NATS server and
// the HTTP API on random loopback ports, data in a temporary directory and
// no probes.
func testServeConfig(t *testing.T) *config.Config {
	cfg := config.Default()
	cfg.NATS.Listen = "127.0.0.1:-1"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = t.TempDir()
	cfg.Probes.Disabled = true
	return cfg
}

// runTestServe runs serve on cfg in this process until t's cleanup, which
// stops it and reports its error.
func runTestServe(t *testing.T, cfg *config.Config) *serve.Server {
	t.Helper()
	srv, err := serve.New(cfg, serve.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return srv
}
