package fakeai

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every server goroutine (listeners, handlers of
// hanging requests) is gone once the tests have closed their servers. The
// HTTP client's idle keep-alive connections are the client's, not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}
