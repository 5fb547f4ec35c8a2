// Package collector consumes fleetwatch outcome events from NATS, decodes and
// validates them, rejects what breaks the protocol, and hands validated events
// in batches to a Sink (the analyzer, wired by cmd).
//
// The live path is core NATS, not JetStream (DESIGN.md "Scale-out"):
// decisions must be fresh, and a JetStream consumer is several times slower
// than core delivery. Each collector holds Settings.Subscriptions queue
// subscriptions per outcome subject in the group fleetwatch.QueueCollectors;
// nats.go runs each subscription's callback on one goroutine, so more
// subscriptions spread the decoding over more cores. Every subscription has
// explicit pending limits, and every message nats.go drops because a
// subscription fell behind is counted (fleetwatch_ingest_dropped_total).
//
// For replay and audit the collector republishes what it accepted, as
// per-pool NDJSON batches, on fw.accepted.<pool>, which the JetStream stream
// FW_OUTCOMES captures. Capturing fw.outcomes.> directly would be lossy: a
// stream silently drops core publishes beyond its ingest queue (about 100,000
// messages), which one-event-per-message traffic overruns near 90k msgs/s on
// a small machine. Batches of up to 64 KiB cut the stream's message rate by
// two orders of magnitude, and what a restarted analyzer needs is the
// validated events with their final timestamps anyway: each line is the
// proxy's own when the collector kept its ts, and the event re-encoded with
// the arrival time otherwise. Replay reads them back. Without JetStream the
// collector runs without capture and replay.
package collector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// Sentinel errors of the collector.
var (
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("collector: closed")
	// ErrRunning is returned by Run while another Run runs.
	ErrRunning = errors.New("collector: already running")
	// ErrNoJetStream is returned by Replay when the collector runs without
	// JetStream.
	ErrNoJetStream = errors.New("collector: jetstream not available")
	// ErrReplayEndedEarly is returned by Replay when the stream stopped
	// delivering before its last stored batch: the replay is partial.
	// Stats.CatchUpErr matches it when the capture's catch-up ended so.
	ErrReplayEndedEarly = errors.New("collector: replay ended early")
)

// Sink receives validated events. Observe is called from several goroutines
// at once (one per subscription, and the flush loop), so it must be safe for
// concurrent use. The batch is only valid during the call: the collector
// reuses its memory afterwards, so Observe must copy whatever it keeps
// (the events' strings are immutable and may be kept). Observe returns true
// when the batch changed something that should be evaluated at once (the
// analyzer's "urgent"); the collector then calls Settings.OnUrgent.
type Sink interface {
	Observe(batch []fleetwatch.Event) (urgent bool)
}

// RefusingSink is a Sink that may refuse valid events it does not count
// (the analyzer refuses pools and backends beyond its limits). When the sink
// given to New implements it, the collector calls ObserveRefusing instead
// of Observe, passing a slice to append the refusals to (reused, so the
// hot path does not allocate), and rejects each refused event with its
// reason: counted in fleetwatch_ingest_rejects_total{reason} and
// fleetwatch_ingest_rejects_by_source_total{reason,source}, and described
// on fw.rejects within the rate limit. Such an event was already counted
// in fleetwatch_ingest_events_total (it is valid) and republished for
// FW_OUTCOMES, where a replay refuses it again.
type RefusingSink interface {
	Sink
	ObserveRefusing(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (urgent bool, _ []fleetwatch.Refusal)
}

// Default settings.
const (
	DefaultSubscriptions       = 2
	DefaultPendingMsgs         = 1 << 20   // 1,048,576 messages per subscription
	DefaultPendingBytes        = 256 << 20 // 256 MiB per subscription
	DefaultBatchSize           = 256
	DefaultFlushInterval       = 5 * time.Millisecond
	DefaultStreamFlushInterval = 10 * time.Millisecond
	DefaultStreamBatchBytes    = 64 << 10
	DefaultRejectRate          = 10.0
	DefaultRejectBurst         = 10
	DefaultStreamMaxAge        = 5 * time.Minute
	DefaultStreamMaxBytes      = 1 << 30
	DefaultIntakeMaxAge        = time.Hour
	DefaultIntakeMaxBytes      = 1 << 30
	DefaultMaxRejectSources    = 100
)

// setupTimeout bounds the JetStream calls New makes.
const setupTimeout = 10 * time.Second

// Settings configures a Collector. The zero value works: default prefix, two
// subscriptions per subject, JetStream capture when the server has it.
type Settings struct {
	// Prefix is the subject prefix. If empty, fleetwatch.DefaultPrefix.
	Prefix string
	// Subscriptions is the number of queue subscriptions per outcome
	// subject (fw.outcomes and fw.outcomes.>), each decoding on its own
	// goroutine. If zero, 2 is used (one per core of a small machine).
	Subscriptions int
	// PendingMsgs and PendingBytes are each subscription's pending limits:
	// beyond them nats.go drops messages (counted). nats.go's defaults
	// (512k messages, 64 MiB) dropped 65% of an unpaced 2M-message burst
	// in DESIGN.md's measurements; if zero, 1,048,576 messages and 256 MiB
	// are used. A negative value means no limit.
	PendingMsgs  int
	PendingBytes int
	// BatchSize is how many events are handed to the sink at once. If zero,
	// 256 is used.
	BatchSize int
	// FlushInterval bounds how long an event waits in a partial batch. If
	// zero, 5 ms is used.
	FlushInterval time.Duration
	// StreamFlushInterval bounds how long an accepted event waits before it
	// is republished for FW_OUTCOMES; a pool's buffer is also sent when it
	// reaches StreamBatchBytes. If zero, 10 ms and 64 KiB are used.
	StreamFlushInterval time.Duration
	StreamBatchBytes    int
	// StreamSubject, when set, names the subject an accepted event is
	// republished on instead of fw.accepted.<pool>; events are batched per
	// subject (serve gives fw.partition.<n>, so that a partition's owner
	// receives its pools' events whichever collector took them). The
	// subject must match fw.accepted.> or fw.partition.>, which
	// FW_OUTCOMES captures. It is called once per accepted event and must
	// be fast and safe for concurrent use.
	StreamSubject func(pool string) string
	// StreamHeader, when set, is sent with every republished batch (serve
	// names its instance in it).
	StreamHeader map[string][]string
	// RejectRate is how many reject notices per second, per reason, are
	// published on fw.rejects; RejectBurst is the token bucket's size. The
	// rest are counted as suppressed and the next notice carries their
	// number. If zero, 10/s and a burst of 10 are used.
	RejectRate  float64
	RejectBurst int
	// MaxRejectSources bounds the distinct values of the source label of
	// fleetwatch_ingest_rejects_by_source_total: the first MaxRejectSources
	// sources seen get their own series, later ones count as "other", and
	// an event without a source counts as "unknown". If zero, 100 is used.
	MaxRejectSources int
	// NoJetStream disables capture and replay even when the server has
	// JetStream.
	NoJetStream bool
	// StreamMaxAge is FW_OUTCOMES' retention. It must be at least twice the
	// analyzer's window so that a restart can replay a full window. If
	// zero, 5 minutes is used.
	StreamMaxAge time.Duration
	// StreamMaxBytes bounds FW_OUTCOMES' size on disk (oldest discarded
	// first). If zero, 1 GiB is used; negative means unlimited.
	StreamMaxBytes int64
	// StreamReplicas is FW_OUTCOMES' replica count when it is created. If
	// zero, 1 is used.
	StreamReplicas int
	// Intake turns on the durable intake: the stream FW_INTAKE captures
	// fw.outcomes and fw.outcomes.> as they are published, and the
	// collector consumes it through the durable pull consumer
	// fleetwatch.QueueCollectors, shared by every collector, instead of
	// core queue subscriptions. Events published while no collector runs,
	// or while a collector reconnects, are kept (within IntakeMaxAge and
	// IntakeMaxBytes) and consumed when one runs again, at least once. It
	// needs JetStream; without it New fails. It costs ingest rate: see
	// BENCHMARKS.md. When FW_CAPTURE holds the outcome subjects, a
	// collector that starts alone takes it over (switch.go); beside
	// others New fails with an error that says what to do.
	Intake bool
	// IntakeMaxAge and IntakeMaxBytes bound what FW_INTAKE keeps while no
	// collector consumes it (oldest discarded first, counted by the
	// server). If zero, 1 hour and 1 GiB are used.
	IntakeMaxAge   time.Duration
	IntakeMaxBytes int64
	// Capture turns on the capture (capture.go): the stream FW_CAPTURE
	// stores fw.outcomes and fw.outcomes.> as published, within
	// IntakeMaxAge and IntakeMaxBytes, beside the live core path, and a
	// collector that starts while CatchUp says no other one runs replays
	// what it stored after the last accepted event. Ignored with Intake or
	// without JetStream. A capture that cannot be created (another stream
	// holds those subjects, a full disk, a permission) is tried again
	// while Run runs, and Stats says it is missing and why; a leftover
	// FW_INTAKE in its way is taken over by a collector that starts alone
	// (switch.go).
	Capture bool
	// CatchUp reports whether this collector is the only one running, so
	// that Run replays the capture (see Capture). If nil, it does.
	CatchUp func() bool
	// CountsIntakeLoss reports whether this collector is the one of a
	// deployment that counts the intake's losses (the messages the bounds
	// discarded before any collector took them: intake.go), so that
	// several collectors sharing FW_INTAKE count each loss once. If nil,
	// this one counts.
	CountsIntakeLoss func() bool
	// Now is the clock events are stamped and checked against. If nil,
	// time.Now is used.
	Now func() time.Time
	// Metrics receives the collector's metrics. If nil, a private set is
	// used (see Metrics).
	Metrics *metrics.Set
	// Logf receives operational messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// OnUrgent is called, outside any lock, after the sink reported an
	// urgent batch. If nil, nothing is called.
	OnUrgent func()
}

// withDefaults returns a copy of s with every zero field set to its default.
func (s Settings) withDefaults() Settings {
	if s.Subscriptions <= 0 {
		s.Subscriptions = DefaultSubscriptions
	}
	if s.PendingMsgs == 0 {
		s.PendingMsgs = DefaultPendingMsgs
	}
	if s.PendingBytes == 0 {
		s.PendingBytes = DefaultPendingBytes
	}
	if s.BatchSize <= 0 {
		s.BatchSize = DefaultBatchSize
	}
	if s.FlushInterval <= 0 {
		s.FlushInterval = DefaultFlushInterval
	}
	if s.StreamFlushInterval <= 0 {
		s.StreamFlushInterval = DefaultStreamFlushInterval
	}
	if s.StreamBatchBytes <= 0 {
		s.StreamBatchBytes = DefaultStreamBatchBytes
	}
	if s.RejectRate <= 0 {
		s.RejectRate = DefaultRejectRate
	}
	if s.RejectBurst <= 0 {
		s.RejectBurst = DefaultRejectBurst
	}
	if s.MaxRejectSources <= 0 {
		s.MaxRejectSources = DefaultMaxRejectSources
	}
	if s.StreamMaxAge <= 0 {
		s.StreamMaxAge = DefaultStreamMaxAge
	}
	if s.StreamMaxBytes == 0 {
		s.StreamMaxBytes = DefaultStreamMaxBytes
	}
	if s.StreamReplicas <= 0 {
		s.StreamReplicas = 1
	}
	if s.IntakeMaxAge <= 0 {
		s.IntakeMaxAge = DefaultIntakeMaxAge
	}
	if s.IntakeMaxBytes <= 0 {
		s.IntakeMaxBytes = DefaultIntakeMaxBytes
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.OnUrgent == nil {
		s.OnUrgent = func() {}
	}
	return s
}

// Collector consumes outcome events. Create it with New, run it with Run,
// stop it by cancelling Run's context or with Close.
type Collector struct {
	nc       *nats.Conn
	sink     Sink
	refusing RefusingSink // sink, when it implements RefusingSink; else nil
	settings Settings     // with defaults applied
	subjects fleetwatch.Subjects
	m        *collectorMetrics
	rejects  *rejectLimiter

	js     jetstream.JetStream // nil without JetStream
	stream string              // FW_OUTCOMES, when js != nil
	// intake is FW_INTAKE's durable consumer, with Settings.Intake; set by
	// New, or by the Run that takes FW_CAPTURE over.
	intake jetstream.Consumer
	// wantCapture: FW_CAPTURE is configured (Settings.Capture, with
	// JetStream and without the intake); set by New. Whether it is in
	// place is capture, below.
	wantCapture bool
	// takeOver is the other ingest mode's stream that New found holding
	// the outcome subjects while this collector was alone: Run takes it
	// over (switch.go) and clears it. Touched by New and Run only.
	takeOver    string
	captureKick chan struct{} // wakes captureLoop; capacity 1
	// intakeLossMark is the highest intake sequence already counted as
	// lost or seen delivered (intake.go); used by the loss loop alone.
	intakeLossMark uint64

	batchPool  sync.Pool // *[]fleetwatch.Event, BatchSize capacity
	refusePool sync.Pool // *[]fleetwatch.Refusal for ObserveRefusing
	streamPool sync.Pool // *[]byte for republished NDJSON batches

	// mu guards running, workers, the lifecycle channels and the
	// capture's state.
	mu      sync.Mutex
	running bool
	workers []*worker
	closed  chan struct{} // closed by Close
	done    chan struct{} // closed when a Run returns; nil before Run
	once    sync.Once
	// capture: FW_CAPTURE is in place; captureErr: why not, while it is
	// wanted and is not (capture.go); catchUpErr: how the last catch-up
	// failed, nil when it did not.
	capture    bool
	captureErr error
	catchUpErr error
	// ready is closed once a Run has subscribed (readyOnce).
	ready     chan struct{}
	readyOnce sync.Once
}

// Ready is closed once Run has subscribed to the outcome subjects (or bound
// the durable intake) and the server has the subscriptions: an event
// published from then on reaches a collector. It stays open when Run fails
// before that.
func (c *Collector) Ready() <-chan struct{} { return c.ready }

// New returns a Collector that reads outcome events from nc and hands them
// to sink. Unless s.NoJetStream, it detects JetStream and creates or updates
// the FW_OUTCOMES stream (binding it as it is when its configuration cannot
// be changed); without JetStream it logs that it runs without capture and
// replay and sets fleetwatch_collector_jetstream to 0.
func New(nc *nats.Conn, sink Sink, s Settings) (*Collector, error) {
	if nc == nil {
		return nil, errors.New("collector: nil connection")
	}
	if sink == nil {
		return nil, errors.New("collector: nil sink")
	}
	if s.Prefix != "" {
		if err := fleetwatch.ValidatePrefix(s.Prefix); err != nil {
			return nil, fmt.Errorf("collector: %w", err)
		}
	}
	s = s.withDefaults()
	c := &Collector{
		nc:       nc,
		sink:     sink,
		settings: s,
		subjects: fleetwatch.Subjects{Prefix: s.Prefix},
		m:        newCollectorMetrics(s.Metrics, s.MaxRejectSources),
		closed:   make(chan struct{}),
		ready:    make(chan struct{}),

		captureKick: make(chan struct{}, 1),
	}
	c.refusing, _ = sink.(RefusingSink)
	c.refusePool.New = func() any {
		b := make([]fleetwatch.Refusal, 0, 16)
		return &b
	}
	c.rejects = newRejectLimiter(s.RejectRate, float64(s.RejectBurst))
	c.batchPool.New = func() any {
		b := make([]fleetwatch.Event, 0, s.BatchSize)
		return &b
	}
	// Stream buffers start small and grow: a flood of distinct pools gets
	// one buffer each until the next flush, so a full-size buffer per pool
	// would cost 64 KiB per invented pool.
	c.streamPool.New = func() any {
		b := make([]byte, 0, min(s.StreamBatchBytes+4096, initialStreamBuf))
		return &b
	}
	if s.NoJetStream {
		if s.Intake {
			return nil, fmt.Errorf("collector: the durable intake (%s) needs JetStream", c.subjects.StreamIntake())
		}
		s.Logf("collector: JetStream disabled: running without capture (%s) and replay", c.subjects.StreamOutcomes())
		return c, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := c.setupStream(ctx); err != nil {
		if !errors.Is(err, errNotEnabled) {
			return nil, err
		}
		if s.Intake {
			return nil, fmt.Errorf("collector: the durable intake (%s) needs JetStream: %w", c.subjects.StreamIntake(), err)
		}
		s.Logf("collector: the NATS server has no JetStream: running without capture (%s) and replay", c.subjects.StreamOutcomes())
		return c, nil
	}
	c.m.jetstream.Set(1)
	if s.Intake {
		err := c.setupIntake(ctx)
		if err != nil && (overlapHolder(err) != c.subjects.StreamCapture() || !c.alone()) {
			return nil, err
		}
		if err != nil {
			c.takeOver = c.subjects.StreamCapture()
			s.Logf("collector: stream %s, the capture of ingest.durable unset, holds %s and %s; no other collector runs: taking it over",
				c.takeOver, c.subjects.Outcomes(), c.subjects.OutcomesWildcard())
		}
	} else if s.Capture {
		c.wantCapture = true
		err := c.ensureCapture(ctx, c.js)
		if overlapHolder(err) == c.subjects.StreamIntake() && c.alone() {
			c.takeOver = c.subjects.StreamIntake()
			s.Logf("collector: stream %s, the durable intake of ingest.durable: true, holds %s and %s; no other collector runs: taking it over",
				c.takeOver, c.subjects.Outcomes(), c.subjects.OutcomesWildcard())
			c.mu.Lock()
			c.captureErr = err
			c.mu.Unlock()
			c.m.captureMissing.Set(1)
		} else {
			c.setCapture(err)
		}
	} else {
		c.noteLeftovers(ctx)
	}
	return c, nil
}

// Metrics returns the set holding the collector's metrics.
func (c *Collector) Metrics() *metrics.Set { return c.m.set }

// JetStream reports whether accepted events are captured in FW_OUTCOMES.
func (c *Collector) JetStream() bool { return c.js != nil }

// Run subscribes and consumes outcome events until ctx is done or Close is
// called. It then drains its subscriptions (the messages already delivered
// to it are processed), hands the last batches to the sink, republishes the
// last accepted events, and returns nil. It returns an error when it cannot
// subscribe, ErrRunning while another Run runs, and ErrClosed after Close.
// Run may be called again after a Run returned (until Close); the lifecycle
// is the one of docs/DECISIONS.md "Lifecycles".
func (c *Collector) Run(ctx context.Context) error {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		return ErrClosed
	default:
	}
	if c.running {
		c.mu.Unlock()
		return ErrRunning
	}
	c.running = true
	done := make(chan struct{})
	c.done = done
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.workers = nil
		c.mu.Unlock()
		close(done)
	}()

	var workers []*worker
	var err error
	switch {
	case c.intake != nil:
		// Before taking anything: what the bounds discarded while no
		// collector ran is counted exactly (intake.go).
		c.countIntakeLoss(ctx)
		workers, err = c.consumeIntake()
	case c.takeOver == c.subjects.StreamCapture():
		if workers, err = c.takeOverCapture(ctx); err == nil {
			c.takeOver = "" // else the next Run tries again
		}
	default:
		workers, err = c.subscribe()
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.workers = workers
	c.mu.Unlock()
	if err := c.nc.Flush(); err != nil { // the server has the subscriptions
		c.drain(workers)
		return fmt.Errorf("collector: subscribing: %w", err)
	}
	if c.wantCapture && c.alone() {
		// Before Ready: the first decisions include what was published
		// while no collector ran.
		c.catchUpAtStart(ctx)
	}
	c.readyOnce.Do(func() { close(c.ready) })
	if c.intake != nil {
		c.settings.Logf("collector: consuming %s and %s through stream %s, durable consumer %s (%d pullers)",
			c.subjects.Outcomes(), c.subjects.OutcomesWildcard(), c.subjects.StreamIntake(), fleetwatch.QueueCollectors, c.settings.Subscriptions)
	} else {
		c.settings.Logf("collector: consuming %s and %s in queue group %s (%d subscriptions each)",
			c.subjects.Outcomes(), c.subjects.OutcomesWildcard(), fleetwatch.QueueCollectors, c.settings.Subscriptions)
	}

	if c.wantCapture {
		captureDone := make(chan struct{})
		captureCtx, stopCapture := context.WithCancel(ctx)
		go func() { defer close(captureDone); c.captureLoop(captureCtx) }()
		defer func() { stopCapture(); <-captureDone }()
	}
	if c.intake != nil {
		lossDone := make(chan struct{})
		lossCtx, stopLoss := context.WithCancel(ctx)
		go func() { defer close(lossDone); c.intakeLossLoop(lossCtx) }()
		defer func() { stopLoss(); <-lossDone }()
	}
	c.flushLoop(ctx, workers)
	c.drain(workers)
	return nil
}

// catchUpAtStart replays what was published while no collector ran: from
// the capture, or from a leftover intake that New found in the capture's
// way (taken over once, switch.go).
func (c *Collector) catchUpAtStart(ctx context.Context) {
	w := newWorker(c)
	from := c.subjects.StreamCapture()
	var n int
	var err error
	switch {
	case c.takeOver == c.subjects.StreamIntake():
		c.takeOver, from = "", c.takeOver
		n, err = c.takeOverIntake(ctx, w)
	case c.captureOn():
		n, err = c.catchUp(ctx, w)
	default:
		return // nothing to replay from: the capture loop says why
	}
	if err != nil {
		c.settings.Logf("%v (the rest of what was published while no collector ran is not decided on)", err)
	}
	if n > 0 {
		c.settings.Logf("collector: caught up on %d messages published while no collector ran (from %s)", n, from)
	}
	if d := c.m.captureDeduplicated.Get(); d > 0 {
		c.settings.Logf("collector: left out %d events of %s that a collector had decided on already (stored after its last republished batch)", d, from)
	}
}

// flushLoop hands partial batches to the sink every FlushInterval and
// republishes accepted events every StreamFlushInterval, until ctx is done
// or Close is called. It runs on Run's goroutine.
func (c *Collector) flushLoop(ctx context.Context, workers []*worker) {
	batches := time.NewTicker(c.settings.FlushInterval)
	defer batches.Stop()
	stream := time.NewTicker(c.settings.StreamFlushInterval)
	defer stream.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.closed:
			return
		case <-batches.C:
			for _, w := range workers {
				w.flush(false)
				w.countDropped()
			}
		case <-stream.C:
			for _, w := range workers {
				w.flush(true)
			}
		}
	}
}

// subscribe creates the queue subscriptions, each with its worker.
func (c *Collector) subscribe() ([]*worker, error) {
	var workers []*worker
	for i := 0; i < c.settings.Subscriptions; i++ {
		for _, subject := range []string{c.subjects.Outcomes(), c.subjects.OutcomesWildcard()} {
			w := newWorker(c)
			sub, err := c.nc.QueueSubscribe(subject, fleetwatch.QueueCollectors, w.onMsg)
			if err == nil {
				err = sub.SetPendingLimits(c.settings.PendingMsgs, c.settings.PendingBytes)
			}
			if err != nil {
				for _, w := range workers {
					_ = w.sub.Unsubscribe()
				}
				if sub != nil {
					_ = sub.Unsubscribe()
				}
				return nil, fmt.Errorf("collector: subscribe %s: %w", subject, err)
			}
			w.sub = sub
			w.slow = sub.StatusChanged(nats.SubscriptionSlowConsumer)
			workers = append(workers, w)
		}
	}
	// A flush interrupted by a disconnect is not fatal: nats.go keeps the
	// subscriptions and sends them again when it reconnects. Only a closed
	// connection (it will never reconnect) is.
	if err := c.nc.Flush(); err != nil && c.nc.IsClosed() {
		for _, w := range workers {
			_ = w.sub.Unsubscribe()
		}
		return nil, fmt.Errorf("collector: subscribe %s and %s: flush: %w", c.subjects.Outcomes(), c.subjects.OutcomesWildcard(), err)
	}
	return workers, nil
}

// drainTimeout bounds how long Run waits for its subscriptions to drain.
const drainTimeout = 10 * time.Second

// drain drains every subscription, waits until their callbacks have
// finished, and flushes what they left.
func (c *Collector) drain(workers []*worker) {
	var closed []<-chan nats.SubStatus
	var pullers []<-chan struct{}
	// Draining needs the server to acknowledge; with the connection down
	// nothing more can arrive, so unsubscribe at once instead of waiting.
	connected := c.nc.IsConnected()
	for _, w := range workers {
		if w.cc != nil {
			// A puller: stop pulling, finish what was delivered (acked
			// as decoded), and wait for its callback to return.
			w.cc.Drain()
			pullers = append(pullers, w.cc.Closed())
			continue
		}
		w.countDropped()
		ch := w.sub.StatusChanged(nats.SubscriptionClosed)
		if !connected {
			_ = w.sub.Unsubscribe()
			continue
		}
		if err := w.sub.Drain(); err != nil {
			// The connection is closed or the subscription already gone:
			// nothing more will be delivered.
			_ = w.sub.Unsubscribe()
			continue
		}
		closed = append(closed, ch)
	}
	deadline := time.NewTimer(drainTimeout)
	defer deadline.Stop()
wait:
	for _, ch := range closed {
		select {
		case <-ch:
		case <-deadline.C:
			c.settings.Logf("collector: subscriptions did not drain within %v", drainTimeout)
			break wait
		}
	}
waitPullers:
	for _, ch := range pullers {
		select {
		case <-ch:
		case <-deadline.C:
			c.settings.Logf("collector: intake pullers did not drain within %v", drainTimeout)
			break waitPullers
		}
	}
	for _, w := range workers {
		w.flush(false)
		w.flush(true)
	}
}

// Close stops a running Run and waits for it to return; every later Run
// returns ErrClosed. It is idempotent and safe concurrently with Run, from
// any goroutine except the sink's Observe and OnUrgent (Run waits for those
// to return).
func (c *Collector) Close() {
	c.once.Do(func() { close(c.closed) })
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}
