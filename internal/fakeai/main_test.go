package fakeai

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every server goroutine (listeners, handlers of
// hanging requests) is gone once the tests have closed their servers.
// Closing a server also closes the test clients' keep-alive connections to
// it, so their read and write loops end too: nothing needs ignoring.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
