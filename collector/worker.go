package collector

import (
	"bytes"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// worker serves one queue subscription. nats.go calls onMsg on one goroutine
// per subscription, so the decoder and the per-message scratch below belong
// to that goroutine; what the flush loop also touches is guarded by mu.
type worker struct {
	c   *Collector
	sub *nats.Subscription       // core mode
	cc  jetstream.ConsumeContext // durable intake

	// Owned by the subscription's callback goroutine.
	dec      fleetwatch.Decoder
	subject  string                // of the message being decoded
	arrival  time.Time             // of the message being decoded
	notices  []pendingReject       // rejects of the current message, published after unlock
	ready    []*[]fleetwatch.Event // full batches, handed over after unlock
	readyOut []streamBatch         // full stream buffers, published after unlock

	// mu guards everything below. It is held while one message is decoded
	// and while the flush loop takes the partial batch; never while the
	// sink is called or anything is published.
	mu       sync.Mutex
	batch    *[]fleetwatch.Event
	pools    map[string]*[]byte // subject -> NDJSON not yet republished
	messages uint64
	events   [fleetwatch.NumOutcomes]uint64

	// lastDropped is the subscription's drop count already added to the
	// metric, and slow receives the subscription's slow-consumer episodes
	// (nats.go reports one each time the subscription falls behind, also
	// to the connection's async error handler). Touched only by Run's
	// goroutine.
	lastDropped int
	slow        <-chan nats.SubStatus
}

// streamBatch is one subject's NDJSON on its way to fw.accepted.<pool> (or
// Settings.StreamSubject's subject).
type streamBatch struct {
	subject string
	buf     *[]byte
	events  int
}

// pendingReject is a reject of the current message, described after unlock.
type pendingReject struct {
	err    error
	reason fleetwatch.Reason
	source string
	sample string
	// event, when set, is a valid event the sink refused; its sample is
	// encoded only when a notice is published.
	event *fleetwatch.Event
}

// initialStreamBuf is the starting capacity of a pool's republish buffer.
const initialStreamBuf = 4096

// maxStreamPools bounds the pools with a republish buffer per worker: the
// buffers are flushed every StreamFlushInterval, and a burst of more
// distinct pools than this is sent at once rather than held.
const maxStreamPools = 1024

func newWorker(c *Collector) *worker {
	return &worker{c: c, pools: make(map[string]*[]byte)}
}

// onMsg is the subscription callback: decode every event of the message,
// accumulate the accepted ones, and hand over whatever filled up.
func (w *worker) onMsg(msg *nats.Msg) {
	w.handle(msg.Subject, msg.Data, w.c.settings.Now())
}

// handle decodes one message's events, received on subject at arrival
// (the collector's clock for a core message, the time the stream stored it
// for an intake message).
func (w *worker) handle(subject string, data []byte, arrival time.Time) {
	w.subject = subject
	// The protocol's precision is the millisecond: an event stamped with
	// its arrival time reads back the same from FW_OUTCOMES.
	w.arrival = arrival.UTC().Truncate(time.Millisecond)

	w.mu.Lock()
	w.messages++
	if ok, bad := w.dec.DecodeBatch(data, w.onLine); ok+bad == 0 {
		// An empty (or all blank) payload is not an event.
		w.notices = append(w.notices, pendingReject{
			err:    &fleetwatch.DecodeError{Err: fleetwatch.ErrBadJSON},
			reason: fleetwatch.ReasonBadJSON,
		})
	}
	w.mu.Unlock()

	w.handOver()
}

// onLine handles one decoded object or bad line; it runs under mu.
func (w *worker) onLine(line []byte, ev *fleetwatch.Event, err error) {
	if err != nil {
		reason := fleetwatch.ReasonOf(err)
		if reason == "" {
			reason = fleetwatch.ReasonBadJSON
		}
		var source string
		if de := (*fleetwatch.DecodeError)(nil); errors.As(err, &de) {
			source = de.Source
		}
		n := min(len(line), fleetwatch.MaxSampleLen)
		w.notices = append(w.notices, pendingReject{
			err: err, reason: reason, source: source, sample: string(line[:n]),
		})
		return
	}
	restamped := w.stamp(ev)

	batch := w.batchLocked()
	*batch = append(*batch, *ev)
	w.events[ev.Outcome]++
	if len(*batch) >= w.c.settings.BatchSize {
		w.ready = append(w.ready, batch)
		w.batch = nil
	}
	if w.c.js != nil {
		w.appendStreamLocked(ev, line, restamped)
	}
}

// stamp applies the protocol's time rules: an absent ts becomes the arrival
// time, and a ts more than MaxSkew from the collector's clock is replaced by
// it and counted. It reports whether ts was set.
func (w *worker) stamp(ev *fleetwatch.Event) (restamped bool) {
	if ev.TS.IsZero() {
		ev.TS = w.arrival
		return true
	}
	if d := ev.TS.Sub(w.arrival); d > fleetwatch.MaxSkew || d < -fleetwatch.MaxSkew {
		ev.TS = w.arrival
		w.c.m.skewed.Inc()
		return true
	}
	return false
}

func (w *worker) batchLocked() *[]fleetwatch.Event {
	if w.batch == nil {
		w.batch = w.c.batchPool.Get().(*[]fleetwatch.Event)
		*w.batch = (*w.batch)[:0]
	}
	return w.batch
}

// appendStreamLocked adds ev to its pool's NDJSON for FW_OUTCOMES with its
// final timestamp, so that a replay sees what the analyzer saw. When the
// collector kept the event's own ts, the line as the proxy sent it already
// decodes to ev and is copied verbatim (encoding costs as much as decoding);
// otherwise, or when the object spans several lines, ev is encoded afresh.
func (w *worker) appendStreamLocked(ev *fleetwatch.Event, line []byte, restamped bool) {
	subject := w.c.streamSubject(ev.Pool)
	buf := w.pools[subject]
	if buf == nil {
		if len(w.pools) >= maxStreamPools {
			for subj, b := range w.pools {
				w.readyOut = append(w.readyOut, streamBatch{subject: subj, buf: b, events: countLines(*b)})
				delete(w.pools, subj)
			}
		}
		buf = w.c.streamPool.Get().(*[]byte)
		*buf = (*buf)[:0]
		w.pools[subject] = buf
	}
	if !restamped && bytes.IndexByte(line, '\n') < 0 {
		*buf = append(*buf, line...)
	} else {
		*buf = fleetwatch.AppendEvent(*buf, ev)
	}
	*buf = append(*buf, '\n')
	if len(*buf) >= w.c.settings.StreamBatchBytes {
		w.readyOut = append(w.readyOut, streamBatch{subject: subject, buf: buf, events: countLines(*buf)})
		delete(w.pools, subject)
	}
}

func countLines(b []byte) int { return bytes.Count(b, newline) }

var newline = []byte{'\n'}

// handOver delivers what the last message completed: full batches to the
// sink, full stream buffers to NATS, reject notices to fw.rejects. It runs
// on the callback goroutine without holding mu.
func (w *worker) handOver() {
	for i, batch := range w.ready {
		w.c.observe(batch)
		w.ready[i] = nil
	}
	w.ready = w.ready[:0]
	for i, sb := range w.readyOut {
		w.c.republish(sb)
		w.readyOut[i] = streamBatch{}
	}
	w.readyOut = w.readyOut[:0]
	for i := range w.notices {
		w.c.reject(w.subject, &w.notices[i])
		w.notices[i] = pendingReject{}
	}
	w.notices = w.notices[:0]
}

// flush takes the partial batch (or, with stream, the partial NDJSON
// buffers) and the counts accumulated since the last flush, and hands them
// over. It runs on Run's goroutine.
func (w *worker) flush(stream bool) {
	var batch *[]fleetwatch.Event
	var out []streamBatch
	w.mu.Lock()
	if stream {
		for subj, buf := range w.pools {
			out = append(out, streamBatch{subject: subj, buf: buf, events: countLines(*buf)})
			delete(w.pools, subj)
		}
	} else if w.batch != nil && len(*w.batch) > 0 {
		batch = w.batch
		w.batch = nil
	}
	messages, events := w.messages, w.events
	w.messages, w.events = 0, [fleetwatch.NumOutcomes]uint64{}
	w.mu.Unlock()

	w.c.m.messages.Add(int(messages))
	for o, n := range events {
		if n > 0 && o > 0 {
			w.c.m.events[o].Add(int(n))
		}
	}
	if batch != nil {
		w.c.observe(batch)
	}
	for _, sb := range out {
		w.c.republish(sb)
	}
}

// countDropped adds the messages nats.go dropped on this subscription since
// the last call to the dropped metric, and counts slow-consumer episodes. It
// runs on Run's goroutine.
func (w *worker) countDropped() {
	if w.sub == nil {
		return // a puller: the stream keeps what it has not delivered
	}
	for episodes := true; episodes; {
		select {
		case <-w.slow:
			w.c.m.slowConsumer.Inc()
		default:
			episodes = false
		}
	}
	n, err := w.sub.Dropped()
	if err != nil || n <= w.lastDropped {
		return
	}
	w.c.m.dropped.Add(n - w.lastDropped)
	if w.lastDropped == 0 {
		w.c.settings.Logf("collector: subscription %s is a slow consumer: nats.go dropped %d messages (counted in fleetwatch_ingest_dropped_total)",
			w.sub.Subject, n)
	}
	w.lastDropped = n
}

// observe hands a batch to the sink, counts it, calls OnUrgent when the
// sink asks, and recycles the batch's memory.
func (c *Collector) observe(batch *[]fleetwatch.Event) {
	c.m.batches.Inc()
	var urgent bool
	if c.refusing != nil {
		refused := c.refusePool.Get().(*[]fleetwatch.Refusal)
		urgent, *refused = c.refusing.ObserveRefusing(*batch, (*refused)[:0])
		for _, r := range *refused {
			if r.Index >= 0 && r.Index < len(*batch) {
				c.refuse(&(*batch)[r.Index], r.Reason)
			}
		}
		*refused = (*refused)[:0]
		c.refusePool.Put(refused)
	} else {
		urgent = c.sink.Observe(*batch)
	}
	clear(*batch) // drop string references before pooling
	*batch = (*batch)[:0]
	c.batchPool.Put(batch)
	if urgent {
		c.settings.OnUrgent()
	}
}

// streamSubject is the subject pool's accepted events are republished on.
func (c *Collector) streamSubject(pool string) string {
	if c.settings.StreamSubject != nil {
		return c.settings.StreamSubject(pool)
	}
	return c.subjects.Accepted(pool)
}

// republish publishes one subject's NDJSON (fw.accepted.<pool>, or
// StreamSubject's) for the FW_OUTCOMES stream. nats.go copies the payload
// into its write buffer, so the buffer is recycled at once.
func (c *Collector) republish(sb streamBatch) {
	var err error
	if c.settings.StreamHeader != nil {
		err = c.nc.PublishMsg(&nats.Msg{Subject: sb.subject, Data: *sb.buf, Header: c.settings.StreamHeader})
	} else {
		err = c.nc.Publish(sb.subject, *sb.buf)
	}
	if err != nil {
		c.m.streamPublishErrors.Inc()
	} else {
		c.m.streamPublished.Inc()
		c.m.streamPublishedEvents.Add(sb.events)
	}
	*sb.buf = (*sb.buf)[:0]
	c.streamPool.Put(sb.buf)
}
