//go:build unix

package collector

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) this process has used so far:
// publisher, embedded server and subscriber together in a benchmark. It is
// a steadier measure than wall-clock throughput on a shared machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
