package toylm

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that Null's workers are gone when it returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
