package collector

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCaptureRetryWaits: a missing capture is tried again after 1 s, the
// wait doubling up to 30 s; once in place it is tried again only when
// Ensure finds it missing (a kick), at once, and the waits start from 1 s
// again; the loop ends with its context.
func TestCaptureRetryWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &Collector{closed: make(chan struct{}), captureKick: make(chan struct{}, 1)}
		start := time.Now()
		var tries []time.Duration
		failures := 7
		try := func(context.Context) bool {
			tries = append(tries, time.Since(start))
			if len(tries) == failures+2 { // the try after the kick
				return false
			}
			return len(tries) == failures+1
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); c.keepCapture(ctx, try) }()

		time.Sleep(time.Hour) // in place after 7 failures: no more tries
		synctest.Wait()
		kickedAt := time.Since(start)
		c.kickCapture() // Ensure found it missing
		time.Sleep(2 * time.Second)
		cancel()
		<-done

		s := time.Second
		want := []time.Duration{1 * s, 3 * s, 7 * s, 15 * s, 31 * s, 61 * s, 91 * s, 121 * s, kickedAt, kickedAt + s}
		if diff := cmp.Diff(want, tries); diff != "" {
			t.Errorf("tries at (-want +got):\n%s", diff)
		}
	})
}
