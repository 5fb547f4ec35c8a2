package testkit

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Lifecycle is one fresh value under CheckLifecycle: its Run and Close
// (wrap a Close without a result as func() error { x.Close(); return nil }),
// and optionally Ready, closed once Run runs (nil: CheckLifecycle polls a
// second Run until it answers errRunning).
type Lifecycle struct {
	Run   func(ctx context.Context) error
	Close func() error
	Ready <-chan struct{}
	// Once says that Run may be called only once: a Run after the first
	// returned answers errClosed. Otherwise it runs again.
	Once bool
}

// lifecycleWait bounds each wait of CheckLifecycle.
const lifecycleWait = 20 * time.Second

// CheckLifecycle checks the lifecycle contract of docs/DECISIONS.md
// ("Lifecycles") on values newLC makes:
//
//   - a second Run while one runs returns errors.Is(err, errRunning) at
//     once, and the first keeps running;
//   - Close stops the running Run, which returns nil; Close is idempotent
//     (a second and a concurrent third call return nil, nothing panics);
//   - a Run after Close returns errors.Is(err, errClosed), even on a value
//     whose Run never started;
//   - after a Run returned because its ctx ended, a new Run runs again,
//     or, with Once, returns errClosed.
func CheckLifecycle(t *testing.T, newLC func(t *testing.T) Lifecycle, errRunning, errClosed error) {
	t.Helper()
	t.Run("second Run while running", func(t *testing.T) {
		lc := newLC(t)
		done := startRun(t, lc, t.Context())
		if err := lc.Run(t.Context()); !errors.Is(err, errRunning) {
			t.Errorf("second Run while one runs: %v, want %v", err, errRunning)
		}
		select {
		case err := <-done:
			t.Fatalf("the first Run returned %v after a second Run was refused", err)
		default:
		}
		closeTwice(t, lc, done)
		if err := lc.Run(t.Context()); !errors.Is(err, errClosed) {
			t.Errorf("Run after Close: %v, want %v", err, errClosed)
		}
		if err := lc.Close(); err != nil {
			t.Errorf("Close after Close: %v", err)
		}
	})
	t.Run("Close before Run", func(t *testing.T) {
		lc := newLC(t)
		if err := lc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := lc.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if err := runBounded(t, lc); !errors.Is(err, errClosed) {
			t.Errorf("Run after Close: %v, want %v", err, errClosed)
		}
	})
	t.Run("Run after Run returned", func(t *testing.T) {
		lc := newLC(t)
		ctx, cancel := context.WithCancel(t.Context())
		done := startRun(t, lc, ctx)
		cancel()
		waitRun(t, done, "Run after its ctx ended")
		if lc.Once {
			if err := runBounded(t, lc); !errors.Is(err, errClosed) {
				t.Errorf("Run after a Run returned (Run once): %v, want %v", err, errClosed)
			}
		} else {
			lc.Ready = nil // closed by the first Run
			done = startRun(t, lc, t.Context())
			closeTwice(t, lc, done)
		}
		if err := lc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// startRun starts lc.Run(ctx) and returns once it runs: Ready is closed,
// or a second Run answers anything but nil (which the caller checks).
func startRun(t *testing.T, lc Lifecycle, ctx context.Context) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- lc.Run(ctx) }()
	deadline := time.After(lifecycleWait)
	if lc.Ready != nil {
		select {
		case <-lc.Ready:
			return done
		case err := <-done:
			t.Fatalf("Run returned %v before it was ready", err)
		case <-deadline:
			t.Fatalf("Run not ready after %v", lifecycleWait)
		}
	}
	// Without Ready: a Run takes its guard before anything else, so after
	// a moment a second Run (with a ctx already done, so that it stops at
	// once should it run after all) answers errRunning.
	for {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before it ran", err)
		case <-deadline:
			t.Fatalf("Run not running after %v", lifecycleWait)
		case <-time.After(10 * time.Millisecond):
		}
		probe, cancel := context.WithCancel(ctx)
		cancel()
		if err := lc.Run(probe); err != nil {
			return done
		}
	}
}

// closeTwice calls Close twice, the second concurrently with a third, and
// checks that the Run done reports returns nil.
func closeTwice(t *testing.T, lc Lifecycle, done <-chan error) {
	t.Helper()
	third := make(chan error, 1)
	go func() { third <- lc.Close() }()
	if err := lc.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := lc.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	waitRun(t, done, "Run after Close")
	if err := <-third; err != nil {
		t.Errorf("concurrent Close: %v", err)
	}
}

// waitRun waits for a Run to return nil.
func waitRun(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s: %v, want nil", what, err)
		}
	case <-time.After(lifecycleWait):
		t.Fatalf("%s: still running after %v", what, lifecycleWait)
	}
}

// runBounded calls Run, which should return at once with an error; it
// fails t when Run runs instead.
func runBounded(t *testing.T, lc Lifecycle) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), lifecycleWait)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- lc.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(lifecycleWait / 2):
		cancel()
		<-done
		t.Fatal("Run ran where it should have returned an error at once")
		return nil
	}
}
