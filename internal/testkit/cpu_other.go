//go:build !unix

package testkit

import "time"

// ProcessCPU is not measured on this platform.
func ProcessCPU() time.Duration { return 0 }
