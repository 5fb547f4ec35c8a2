package route

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
)

// OutcomePublisher sends a proxy's outcome events to NATS asynchronously, in
// NDJSON batches (PROTOCOL.md), so that a slow or absent NATS never delays
// or fails a request: Publish never blocks; when the bounded queue is full
// the event is dropped and counted. One goroutine, Run, does the batching
// and publishing; it is owned by the caller of Run and exits when its
// context is done or Close is called, after a last flush.
//
// It counts, in PublisherSettings.Metrics:
//
//	fleetwatch_route_events_published_total  outcome events handed to NATS
//	fleetwatch_route_events_dropped_total    outcome events lost (queue full, publish failed, closed)
//	fleetwatch_route_event_batches_total     batches handed to NATS
type OutcomePublisher struct {
	subject  string
	publish  func(subject string, data []byte) error
	interval time.Duration
	maxBatch int

	queue chan fleetwatch.Event

	published *metrics.Counter // events handed to NATS
	dropped   *metrics.Counter // events lost: queue full or publish failed
	batches   *metrics.Counter

	closeOnce sync.Once
	closed    chan struct{} // closed by Close

	mu      sync.Mutex    // guards running and done
	running bool          // a Run runs
	done    chan struct{} // closed when the current (or last) Run returns; nil before Run
}

// PublisherSettings configure an OutcomePublisher.
type PublisherSettings struct {
	// Subject is where batches go: fleetwatch.Subjects.OutcomesFrom(source)
	// ("fw.outcomes.<source>" as one token). Required.
	Subject string
	// Publish sends one batch; nats.Conn.Publish fits (it buffers while
	// reconnecting and fails when its buffer is full, never blocking).
	// Required.
	Publish func(subject string, data []byte) error
	// Interval is the longest an event waits for its batch. If zero, 10ms.
	Interval time.Duration
	// MaxBatch is the batch size, in bytes, that is flushed at once.
	// If zero, 64 KiB.
	MaxBatch int
	// Queue is the number of events buffered before dropping. If zero, 16384.
	Queue int
	// Metrics receives the counters. If nil, a private set is used.
	Metrics *metrics.Set
}

// ErrPublisherSettings: NewOutcomePublisher was given no Subject or no
// Publish.
var ErrPublisherSettings = errors.New("route: the outcome publisher needs a subject and a publish function")

// NewOutcomePublisher returns a publisher; it starts nothing (call Run).
func NewOutcomePublisher(s PublisherSettings) (*OutcomePublisher, error) {
	if s.Subject == "" || s.Publish == nil {
		return nil, ErrPublisherSettings
	}
	p := &OutcomePublisher{
		subject:  s.Subject,
		publish:  s.Publish,
		interval: s.Interval,
		maxBatch: s.MaxBatch,
		closed:   make(chan struct{}),
	}
	if p.interval <= 0 {
		p.interval = 10 * time.Millisecond
	}
	if p.maxBatch <= 0 {
		p.maxBatch = 64 << 10
	}
	q := s.Queue
	if q <= 0 {
		q = 16384
	}
	p.queue = make(chan fleetwatch.Event, q)
	set := s.Metrics
	if set == nil {
		set = metrics.NewSet()
	}
	p.published = set.GetOrCreateCounter(`fleetwatch_route_events_published_total`)
	p.dropped = set.GetOrCreateCounter(`fleetwatch_route_events_dropped_total`)
	p.batches = set.GetOrCreateCounter(`fleetwatch_route_event_batches_total`)
	return p, nil
}

// Subject returns the subject batches are published on.
func (p *OutcomePublisher) Subject() string { return p.subject }

// Publish queues ev for publishing, or drops it when the queue is full or
// the publisher is closed. It never blocks, and it is safe for concurrent
// use. It implements Publisher.
func (p *OutcomePublisher) Publish(ev fleetwatch.Event) {
	select {
	case <-p.closed:
		p.dropped.Inc()
		return
	default:
	}
	select {
	case p.queue <- ev:
	default:
		p.dropped.Inc()
	}
}

// Run batches and publishes queued events until ctx is done or Close is
// called, then publishes what is still queued and returns nil. It returns
// ErrRunning while another Run runs, and ErrClosed after Close, once it has
// published what was queued before Close; after a Run returned it may be
// called again (until Close). The lifecycle is the one
// of docs/DECISIONS.md "Lifecycles".
func (p *OutcomePublisher) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return ErrRunning
	}
	closed := false
	select {
	case <-p.closed:
		closed = true
	default:
	}
	p.running = true
	done := make(chan struct{})
	p.done = done
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
		close(done)
	}()
	ticker := time.NewTicker(p.interval)
	defer ticker.Stop()
	var buf []byte
	var n int // events in buf
	flush := func() {
		if n == 0 {
			return
		}
		if err := p.publish(p.subject, buf); err != nil {
			p.dropped.Add(n)
		} else {
			p.published.Add(n)
			p.batches.Inc()
		}
		buf, n = buf[:0], 0
	}
	add := func(ev *fleetwatch.Event) {
		buf = fleetwatch.AppendEvent(buf, ev)
		buf = append(buf, '\n')
		n++
		if len(buf) >= p.maxBatch {
			flush()
		}
	}
	if closed {
		// Closed before this Run: what was queued before Close is still
		// published (a Close that raced the start of Run loses nothing),
		// and nothing else runs.
		p.drain(add)
		flush()
		return ErrClosed
	}
	for {
		select {
		case ev := <-p.queue:
			add(&ev)
		case <-ticker.C:
			flush()
		case <-ctx.Done():
			p.drain(add)
			flush()
			return nil
		case <-p.closed:
			p.drain(add)
			flush()
			return nil
		}
	}
}

// drain moves what is queued now into the batch.
func (p *OutcomePublisher) drain(add func(*fleetwatch.Event)) {
	for {
		select {
		case ev := <-p.queue:
			add(&ev)
		default:
			return
		}
	}
}

// Close makes Run flush what is queued and return, and drops every event
// published afterwards; every later Run returns ErrClosed. Unlike the
// other Close methods it does not wait for Run (Wait does): a router's
// shutdown closes it before the NATS flush that hands the last batch over.
// It is idempotent, safe concurrently with Run, and returns nil.
func (p *OutcomePublisher) Close() error {
	p.closeOnce.Do(func() { close(p.closed) })
	return nil
}

// Wait waits for the current (or last) Run to return; it returns at once
// when Run was never called.
func (p *OutcomePublisher) Wait() {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}
