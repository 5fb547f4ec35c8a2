package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the commands run in process (drift, watch, route,
// sim, the serve daemon under the drift CLI test) leave no goroutine
// behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded server's goroutines end asynchronously after
		// Shutdown returns.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}
