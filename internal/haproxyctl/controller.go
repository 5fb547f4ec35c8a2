package haproxyctl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
)

// ControllerSettings configure a Controller. Runtime is required.
type ControllerSettings struct {
	Runtime *Runtime
	Mapping Settings
	// Prefix is the subjects' prefix. If empty, "fw".
	Prefix string
	// Pools lists the pools to follow; empty: every pool.
	Pools []string
	// Interval is how often a full reconcile runs besides the one each new
	// snapshot triggers. If zero, 5s.
	Interval time.Duration
	// Metrics receives the controller's series. If nil, a private set.
	Metrics *metrics.Set
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
}

// Lifecycle errors of the Controller (docs/DECISIONS.md "Lifecycles").
var (
	// ErrRunning is returned by Run while another Run runs.
	ErrRunning = errors.New("haproxyctl: already running")
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("haproxyctl: closed")
)

// Controller follows the decision snapshots and reconciles HAProxy with
// them: at start, on every new snapshot, and every Interval (which also
// repairs what a HAProxy restart or reload undid). A stale snapshot is
// not applied: HAProxy keeps the last state it was given (fail static).
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): a Run while another runs
// returns ErrRunning; a Run after Close returns ErrClosed; Close is
// idempotent, safe concurrently with Run, and waits for it. Run may be
// called again after a Run returned.
type Controller struct {
	s       ControllerSettings
	watcher *feed.Watcher
	wake    chan struct{}

	// life guards running and done.
	life      sync.Mutex
	running   bool
	done      chan struct{} // closed when the current (or last) Run returns; nil before Run
	closed    chan struct{} // closed by Close
	closeOnce sync.Once

	passes    *metrics.Counter
	commands  *metrics.Counter
	errors    *metrics.Counter
	missing   *metrics.Counter
	reachable *metrics.Gauge

	mu      sync.Mutex // guards lastErr
	lastErr error
}

// NewController builds a Controller reading snapshots through nc.
func NewController(nc *nats.Conn, s ControllerSettings) (*Controller, error) {
	if s.Interval <= 0 {
		s.Interval = 5 * time.Second
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	c := &Controller{s: s, wake: make(chan struct{}, 1), closed: make(chan struct{})}
	var err error
	c.watcher, err = feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix: s.Prefix, Pools: s.Pools, Metrics: s.Metrics, Logf: s.Logf,
		OnUpdate: func(*fleetwatch.Snapshot) {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		return nil, err
	}
	c.passes = s.Metrics.GetOrCreateCounter("fleetwatch_haproxy_reconciles_total")
	c.commands = s.Metrics.GetOrCreateCounter("fleetwatch_haproxy_commands_total")
	c.errors = s.Metrics.GetOrCreateCounter("fleetwatch_haproxy_errors_total")
	c.missing = s.Metrics.GetOrCreateCounter("fleetwatch_haproxy_missing_servers_total")
	c.reachable = s.Metrics.GetOrCreateGauge("fleetwatch_haproxy_reachable", nil)
	return c, nil
}

// Run follows the decisions and reconciles until ctx ends or Close is
// called; it returns nil then, or the watcher's error. It returns
// ErrRunning while another Run runs and ErrClosed after Close.
func (c *Controller) Run(ctx context.Context) error {
	c.life.Lock()
	select {
	case <-c.closed:
		c.life.Unlock()
		return ErrClosed
	default:
	}
	if c.running {
		c.life.Unlock()
		return ErrRunning
	}
	c.running = true
	done := make(chan struct{})
	c.done = done
	c.life.Unlock()
	defer func() {
		c.life.Lock()
		c.running = false
		c.life.Unlock()
		close(done)
	}()

	ctx, cancel := context.WithCancel(ctx)
	// The deferred cancel also ends the goroutine below.
	defer cancel()
	// Close ends Run as ctx does.
	go func() {
		select {
		case <-c.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	werr := make(chan error, 1)
	go func() { werr <- c.watcher.Run(ctx) }()
	select {
	case <-c.watcher.Synced():
	case <-ctx.Done():
	}
	tick := time.NewTicker(c.s.Interval)
	defer tick.Stop()
	for {
		c.Reconcile(ctx)
		select {
		case <-ctx.Done():
			return <-werr
		case err := <-werr:
			return err
		case <-tick.C:
		case <-c.wake:
		}
	}
}

// Close stops a running Run and waits for it to return; every later Run
// returns ErrClosed. It is idempotent, safe concurrently with Run, and
// returns nil.
func (c *Controller) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	c.life.Lock()
	done := c.done
	c.life.Unlock()
	if done != nil {
		<-done
	}
	return nil
}

// Reconcile runs one pass over every pool with a fresh snapshot and
// returns the commands it sent.
func (c *Controller) Reconcile(ctx context.Context) []string {
	c.passes.Inc()
	byBackend := map[string][]Target{}
	for _, pool := range c.watcher.Pools() {
		v, ok := c.watcher.View(pool)
		if !ok || v.Stale {
			continue
		}
		for _, t := range Targets(v.Snapshot, c.s.Mapping) {
			byBackend[t.Backend] = append(byBackend[t.Backend], t)
		}
	}
	var sent []string
	reachable := true
	for be, targets := range byBackend {
		answer, err := c.s.Runtime.Command(ctx, "show servers state "+be)
		if err != nil {
			c.fail(err)
			reachable = false
			continue
		}
		current, err := ParseServersState(answer)
		if err != nil {
			c.fail(err)
			continue
		}
		cmds, missing := Plan(targets, current)
		if len(missing) > 0 {
			c.missing.Add(len(missing))
		}
		for _, cmd := range cmds {
			if _, err := c.s.Runtime.Command(ctx, cmd); err != nil {
				c.fail(err)
				continue
			}
			c.commands.Inc()
			sent = append(sent, cmd)
			c.s.Logf("%s", cmd)
		}
	}
	if reachable {
		c.reachable.Set(1)
	} else {
		c.reachable.Set(0)
	}
	return sent
}

// fail counts err and logs it when it differs from the last one, so that
// an unreachable HAProxy does not log every pass.
func (c *Controller) fail(err error) {
	c.errors.Inc()
	c.mu.Lock()
	same := c.lastErr != nil && c.lastErr.Error() == err.Error()
	c.lastErr = err
	c.mu.Unlock()
	if !same {
		c.s.Logf("%v", err)
	}
}

// String describes the controller for logs.
func (c *Controller) String() string {
	return fmt.Sprintf("haproxy %s:%s", c.s.Runtime.Network, c.s.Runtime.Addr)
}
