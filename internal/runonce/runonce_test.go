package runonce

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

var (
	errRunning = errors.New("running")
	errClosed  = errors.New("closed")
)

// TestRunOnce: a second Run while one runs is refused, Close cancels the
// running one's context and waits for it and its after step, and every
// Run after that is refused as closed; Close is idempotent.
func TestRunOnce(t *testing.T) {
	o := New(errRunning, errClosed)
	started := make(chan struct{})
	var afterRan atomic.Bool
	runErr := make(chan error, 1)
	go func() {
		runErr <- o.Run(t.Context(), func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // a drain Close must wait for
			return nil
		}, func() { afterRan.Store(true) })
	}()
	<-started
	if err := o.Run(t.Context(), func(context.Context) error { return nil }, nil); err != errRunning {
		t.Errorf("a second Run while one runs: %v, want %v", err, errRunning)
	}
	o.Close()
	if !afterRan.Load() {
		t.Error("Close returned before the running Run's after step")
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run ended by Close: %v, want nil", err)
	}
	if err := o.Run(t.Context(), func(context.Context) error { return nil }, nil); err != errClosed {
		t.Errorf("Run after Close: %v, want %v", err, errClosed)
	}
	o.Close()
}

// TestRunOnceEndsWithItsContext: a Run that returned (its context ended)
// cannot run again, and Close after it returns at once.
func TestRunOnceEndsWithItsContext(t *testing.T) {
	o := New(errRunning, errClosed)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := o.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil }, nil); err != nil {
		t.Fatal(err)
	}
	if err := o.Run(t.Context(), func(context.Context) error { return nil }, nil); err != errClosed {
		t.Errorf("Run after a Run returned: %v, want %v", err, errClosed)
	}
	o.Close()
}

// TestCloseBeforeRun: Close before any Run makes Run refuse without
// calling serve.
func TestCloseBeforeRun(t *testing.T) {
	o := New(errRunning, errClosed)
	o.Close()
	called := false
	if err := o.Run(t.Context(), func(context.Context) error { called = true; return nil }, nil); err != errClosed || called {
		t.Errorf("Run after Close: %v (serve called %v), want %v without serving", err, called, errClosed)
	}
}

// TestStart: Start returns nil once ready is closed, and an error of the
// run that comes later goes to logf; a run that ends before it is ready
// makes Start return its error, or errClosed when it ended cleanly.
func TestStart(t *testing.T) {
	o := New(errRunning, errClosed)
	ready := make(chan struct{})
	logged := make(chan string, 1)
	failLater := errors.New("failed after ready")
	err := o.Start(t.Context(), func(ctx context.Context) error {
		return o.Run(ctx, func(ctx context.Context) error {
			close(ready)
			<-ctx.Done()
			return failLater
		}, nil)
	}, ready, func(format string, args ...any) { logged <- errors.Join(args[0].(error)).Error() })
	if err != nil {
		t.Fatalf("Start: %v, want nil once ready", err)
	}
	o.Close()
	select {
	case msg := <-logged:
		if msg != failLater.Error() {
			t.Errorf("logged %q, want %q", msg, failLater)
		}
	case <-time.After(10 * time.Second):
		t.Error("the run's error after Start returned was not logged")
	}

	boom := errors.New("dial failed")
	if err := New(errRunning, errClosed).Start(t.Context(), func(context.Context) error { return boom }, make(chan struct{}), t.Logf); err != boom {
		t.Errorf("Start of a run that failed before ready: %v, want %v", err, boom)
	}
	if err := New(errRunning, errClosed).Start(t.Context(), func(context.Context) error { return nil }, make(chan struct{}), t.Logf); err != errClosed {
		t.Errorf("Start of a run that ended cleanly before ready: %v, want %v", err, errClosed)
	}
}
