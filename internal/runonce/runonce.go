// Package runonce is the lifecycle fleetwatch's daemons share (the router,
// the pick service): Run once, until its context ends or Close is called;
// Start until the daemon is ready; Close before, during or after Run,
// idempotent, waiting for a running Run to return. It imports the
// standard library only (a leaf helper, docs/DECISIONS.md "Leaf helpers
// and the root").
package runonce

import (
	"context"
	"sync"
)

// Once runs a daemon once. The zero value is not usable: use New.
type Once struct {
	errRunning, errClosed error

	stopOnce sync.Once
	stop     chan struct{} // closed by Close

	mu      sync.Mutex    // guards the fields below
	ran     bool          // Run was called (and passed its guard)
	running bool          // a Run runs now
	closed  bool          // Close was called
	runDone chan struct{} // closed when the running Run returns
}

// New is a Once whose Run returns errRunning while another Run runs, and
// errClosed after Close or once a Run has returned.
func New(errRunning, errClosed error) *Once {
	return &Once{errRunning: errRunning, errClosed: errClosed, stop: make(chan struct{})}
}

// Run calls serve with a context that ends with ctx or at Close, and
// returns its error; then, before a Close waiting for it returns, after
// (when not nil). A second Run returns errRunning while this one runs and
// errClosed after.
func (o *Once) Run(ctx context.Context, serve func(context.Context) error, after func()) error {
	o.mu.Lock()
	switch {
	case o.running:
		o.mu.Unlock()
		return o.errRunning
	case o.closed || o.ran:
		o.mu.Unlock()
		return o.errClosed
	}
	o.ran, o.running = true, true
	runDone := make(chan struct{})
	o.runDone = runDone
	o.mu.Unlock()
	defer func() { // registered first: runs last, after serve's own
		if after != nil {
			after()
		}
		o.mu.Lock()
		o.running = false
		o.mu.Unlock()
		close(runDone)
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // also ends the goroutine below
	go func() {    // Close ends Run as ctx does
		select {
		case <-o.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return serve(ctx)
}

// Start calls run (the daemon's Run) in a goroutine and returns once
// ready is closed, or run's error if it ended first (errClosed if it ended
// without one: ctx or Close before it was ready). An error of run after
// Start returned goes to logf.
func (o *Once) Start(ctx context.Context, run func(context.Context) error, ready <-chan struct{}, logf func(string, ...any)) error {
	done := make(chan error, 1)
	go func() { // exits with run: at ctx's end or Close
		err := run(ctx)
		select {
		case <-ready:
			if err != nil { // Start has returned: nobody else sees it
				logf("%v", err)
			}
		default:
		}
		done <- err
	}()
	select {
	case <-ready:
		return nil
	case err := <-done:
		if err == nil {
			err = o.errClosed
		}
		return err
	}
}

// Close stops a running Run and waits for it to return, or, before Run,
// makes a later Run return errClosed. It is idempotent.
func (o *Once) Close() {
	o.stopOnce.Do(func() { close(o.stop) })
	o.mu.Lock()
	o.closed = true
	done := o.runDone
	o.mu.Unlock()
	if done != nil {
		<-done
	}
}
