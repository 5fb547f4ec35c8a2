package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestMain checks that the commands run in process (drift, watch, route,
// sim, the serve daemon under the drift CLI test) leave no goroutine
// behind. The package's end-to-end tests run their own NATS servers,
// serve and route processes and wait for them (leases, reconnects, the
// demo's minute): up to 8 run at once unless -parallel says otherwise.
func TestMain(m *testing.M) {
	testkit.RaiseParallel(8)
	goleak.VerifyTestMain(m,
		// The embedded server's goroutines end asynchronously after
		// Shutdown returns.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}
