//go:build unix

package testkit

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user + system) this process has used so far:
// in a benchmark, every side it runs (a publisher, an embedded server, a
// subscriber; an HTTP client and server) together. It is a steadier
// measure than wall-clock throughput on a shared machine.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
