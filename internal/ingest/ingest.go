// Package ingest feeds fleetwatch from proxies that do not publish outcome
// events on NATS themselves: it maps what they already emit into outcome
// events and publishes those on fw.outcomes.<pool>, where the collector
// takes them like any other publisher's.
//
// The adapters are:
//
//   - HTTP: POST /v1/outcomes (PROTOCOL.md events, one or NDJSON) and
//     POST /v1/ingest/litellm (LiteLLM's generic_api logging callback),
//     served by `fleetwatch serve` (http.go, litellm.go);
//   - OTLP/HTTP traces: POST /v1/traces, spans of the OpenTelemetry GenAI
//     semantic conventions (otlp.go);
//   - access logs: nginx's JSON log_format and HAProxy's httplog and JSON
//     formats, from a tailed file (tail.go) or syslog over UDP (syslog.go),
//     run by `fleetwatch ingest nginx|haproxy` (accesslog.go).
//
// Every adapter ends in an Emitter, which validates each event with the
// root package's decoder (the one the collector uses, so that an event the
// collector would reject is rejected here with the same reason and counted
// under the same metric), groups the events by pool and publishes NDJSON
// batches. The mapping from what a proxy calls an upstream (an address, an
// API base URL, a HAProxy backend/server pair) to fleetwatch's pool and
// backend ids is a Mapping.
package ingest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
)

// Publisher is where an Emitter sends its batches; *nats.Conn is one.
type Publisher interface {
	Publish(subject string, data []byte) error
}

// payloadLimiter is implemented by *nats.Conn: the largest message the
// server accepts. An Emitter splits its batches below it.
type payloadLimiter interface{ MaxPayload() int64 }

// flusher is implemented by *nats.Conn: wait until what was published has
// reached the server.
type flusher interface {
	FlushTimeout(time.Duration) error
}

// DefaultMaxMessage bounds one published NDJSON message when the publisher
// does not say what its server accepts.
const DefaultMaxMessage = 512 << 10

// ErrPublish wraps a failure to hand a batch to the publisher.
var ErrPublish = errors.New("ingest: publish")

// Adapter names, the values of the adapter label of the metrics.
const (
	AdapterOutcomes = "outcomes" // POST /v1/outcomes
	AdapterLiteLLM  = "litellm"  // POST /v1/ingest/litellm
	AdapterOTLP     = "otlp"     // POST /v1/traces
	AdapterNginx    = "nginx"    // fleetwatch ingest nginx
	AdapterHAProxy  = "haproxy"  // fleetwatch ingest haproxy
)

// Skip reasons: why an input that was read was not turned into an event.
// They label fleetwatch_ingest_adapter_skipped_total.
const (
	SkipNotLLM     = "not_llm"     // an OTLP span without gen_ai attributes
	SkipNoUpstream = "no_upstream" // no backend was tried (nginx answered itself, HAProxy <NOSRV>)
	SkipUnmapped   = "unmapped"    // the upstream is not listed and ingest.only_listed is set
	SkipNoPool     = "no_pool"     // nothing names the pool (no model, no pool field, no default)
	SkipEventType  = "event_type"  // a LiteLLM payload that is not a completed call
)

// SkipReasons lists every skip reason, for pre-registering metrics.
var SkipReasons = []string{SkipNotLLM, SkipNoUpstream, SkipUnmapped, SkipNoPool, SkipEventType}

// Metrics are an adapter's counters. Every series is registered by
// NewMetrics, so a reason that never happened reads 0.
type Metrics struct {
	adapter string
	set     *metrics.Set

	Requests    *metrics.Counter // HTTP requests, log lines or syslog datagrams received
	Events      *metrics.Counter // events accepted and published
	ParseErrors *metrics.Counter // inputs that could not be parsed at all
	TooLarge    *metrics.Counter // HTTP bodies refused with 413
	PublishErrs *metrics.Counter // batches the publisher refused
	Unpublished *metrics.Counter // accepted events of refused batches (their fate: Emit)

	rejects       map[fleetwatch.Reason]*metrics.Counter // by adapter and reason
	sharedRejects map[fleetwatch.Reason]*metrics.Counter // fleetwatch_ingest_rejects_total, shared with the collector
	skipped       map[string]*metrics.Counter
	hintMalformed map[string]*metrics.Counter // by retryhint.Sources
}

// NewMetrics registers adapter's series in set (a new set if nil). The
// rejects are also counted in fleetwatch_ingest_rejects_total{reason}, the
// collector's series: in serve both live in one set, so an event rejected
// at the HTTP door counts where one rejected from NATS does.
func NewMetrics(set *metrics.Set, adapter string) *Metrics {
	if set == nil {
		set = metrics.NewSet()
	}
	label := fmt.Sprintf("adapter=%q", adapter)
	m := &Metrics{
		adapter:       adapter,
		set:           set,
		Requests:      set.GetOrCreateCounter("fleetwatch_ingest_adapter_requests_total{" + label + "}"),
		Events:        set.GetOrCreateCounter("fleetwatch_ingest_adapter_events_total{" + label + "}"),
		ParseErrors:   set.GetOrCreateCounter("fleetwatch_ingest_adapter_parse_errors_total{" + label + "}"),
		TooLarge:      set.GetOrCreateCounter("fleetwatch_ingest_adapter_too_large_total{" + label + "}"),
		PublishErrs:   set.GetOrCreateCounter("fleetwatch_ingest_adapter_publish_errors_total{" + label + "}"),
		Unpublished:   set.GetOrCreateCounter("fleetwatch_ingest_adapter_unpublished_events_total{" + label + "}"),
		rejects:       map[fleetwatch.Reason]*metrics.Counter{},
		sharedRejects: map[fleetwatch.Reason]*metrics.Counter{},
		skipped:       map[string]*metrics.Counter{},
		hintMalformed: map[string]*metrics.Counter{},
	}
	for _, r := range fleetwatch.Reasons {
		m.rejects[r] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_adapter_rejects_total{%s,reason=%q}`, label, string(r)))
		m.sharedRejects[r] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_rejects_total{reason=%q}`, string(r)))
	}
	for _, s := range SkipReasons {
		m.skipped[s] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_adapter_skipped_total{%s,reason=%q}`, label, s))
	}
	for _, s := range retryhint.Sources {
		m.hintMalformed[s] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_adapter_retry_hint_malformed_total{%s,source=%q}`, label, s))
	}
	return m
}

// RetryHintMalformed counts retry hints that did not parse, by source (see
// retryhint.Parse).
func (m *Metrics) RetryHintMalformed(sources []string) {
	for _, s := range sources {
		if c, ok := m.hintMalformed[s]; ok {
			c.Inc()
		}
	}
}

// RetryHintsMalformed returns the malformed retry hints of source counted
// so far.
func (m *Metrics) RetryHintsMalformed(source string) uint64 {
	if c, ok := m.hintMalformed[source]; ok {
		return c.Get()
	}
	return 0
}

// Reject counts one rejected event.
func (m *Metrics) Reject(r fleetwatch.Reason) {
	c, ok := m.rejects[r]
	if !ok {
		r = fleetwatch.ReasonBadJSON
		c = m.rejects[r]
	}
	c.Inc()
	m.sharedRejects[r].Inc()
}

// Skip counts one input skipped for reason (one of SkipReasons).
func (m *Metrics) Skip(reason string) {
	if c, ok := m.skipped[reason]; ok {
		c.Inc()
	}
}

// Rejected returns the rejects of reason r counted so far.
func (m *Metrics) Rejected(r fleetwatch.Reason) uint64 { return m.rejects[r].Get() }

// Skipped returns the inputs skipped for reason so far.
func (m *Metrics) Skipped(reason string) uint64 {
	if c, ok := m.skipped[reason]; ok {
		return c.Get()
	}
	return 0
}

// Rejected is one event an Emitter did not publish.
type Rejected struct {
	Index  int               `json:"index"`          // the event's index in what was emitted
	Line   int               `json:"line,omitempty"` // the input's line (1-based), when known
	Reason fleetwatch.Reason `json:"reason"`         // bounded code, e.g. "out_of_range"
	Error  string            `json:"error"`          // e.g. "ttft_ms out of range"
}

// Emitter validates events and publishes them on fw.outcomes.<pool>, as
// NDJSON batches, one per pool and call (split below the server's largest
// message). It is safe for concurrent use.
type Emitter struct {
	pub     Publisher
	subj    fleetwatch.Subjects
	source  string
	maxMsg  int
	decoder sync.Pool // of *fleetwatch.Decoder: a decoder is not safe for concurrent use
}

// EmitterSettings configure an Emitter. The zero value works (with the
// default prefix).
type EmitterSettings struct {
	// Prefix is the subjects' prefix. If empty, "fw".
	Prefix string
	// Source is written as the events' source when they carry none. If
	// empty, the events keep theirs.
	Source string
	// MaxMessage bounds one published message. If zero, the publisher's
	// MaxPayload when it has one, else DefaultMaxMessage.
	MaxMessage int
}

// NewEmitter returns an Emitter publishing through pub.
func NewEmitter(pub Publisher, s EmitterSettings) *Emitter {
	e := &Emitter{pub: pub, subj: fleetwatch.Subjects{Prefix: s.Prefix}, source: s.Source, maxMsg: s.MaxMessage}
	if e.maxMsg <= 0 {
		e.maxMsg = DefaultMaxMessage
		if pl, ok := pub.(payloadLimiter); ok && pl.MaxPayload() > 0 {
			e.maxMsg = int(min(pl.MaxPayload(), 8<<20))
		}
	}
	e.decoder.New = func() any { return new(fleetwatch.Decoder) }
	return e
}

// Batch gathers the events of one input (an HTTP body, a log line) by
// pool; Emit publishes them. A Batch is used by one goroutine.
type Batch struct {
	e     *Emitter
	m     *Metrics
	dec   *fleetwatch.Decoder
	check fleetwatch.Event
	pools map[string][]byte
	order []string
	n     int // events added, accepted or not

	Accepted int        // events that passed validation
	Rejects  []Rejected // events that did not
}

// NewBatch starts a batch whose events count in m.
func (e *Emitter) NewBatch(m *Metrics) *Batch {
	return &Batch{e: e, m: m, dec: e.decoder.Get().(*fleetwatch.Decoder), pools: map[string][]byte{}}
}

// Add validates ev as the collector would (it is encoded and decoded
// again) and keeps it for Emit; an invalid event is counted as rejected
// and listed in b.Rejects with line (0 when unknown).
func (b *Batch) Add(ev *fleetwatch.Event, line int) {
	idx := b.n
	b.n++
	if ev.Source == "" {
		ev.Source = b.e.source
	}
	buf := b.pools[ev.Pool]
	start := len(buf)
	buf = fleetwatch.AppendEvent(buf, ev)
	if err := b.dec.Decode(buf[start:], &b.check); err != nil {
		if start == 0 {
			delete(b.pools, ev.Pool) // not seen: a later valid event of the pool starts it
		} else {
			b.pools[ev.Pool] = buf[:start]
		}
		b.reject(idx, line, err)
		return
	}
	buf = append(buf, '\n')
	if _, seen := b.pools[ev.Pool]; !seen {
		b.order = append(b.order, ev.Pool)
	}
	b.pools[ev.Pool] = buf
	b.Accepted++
}

// AddRaw decodes data (one event or NDJSON, as the collector reads a
// message) and adds every event; firstLine is the line number of data's
// first byte.
func (b *Batch) AddRaw(data []byte, firstLine int) {
	counted, line := 0, firstLine
	b.dec.DecodeBatch(data, func(l []byte, ev *fleetwatch.Event, err error) {
		// l is a subslice of data: its offset tells its line.
		off := cap(data) - cap(l)
		for _, c := range data[counted:off] {
			if c == '\n' {
				line++
			}
		}
		counted = off
		if err != nil {
			idx := b.n
			b.n++
			b.reject(idx, line, err)
			return
		}
		ev2 := *ev
		b.Add(&ev2, line)
	})
}

func (b *Batch) reject(idx, line int, err error) {
	r := fleetwatch.ReasonOf(err)
	if r == "" {
		r = fleetwatch.ReasonBadJSON
	}
	b.m.Reject(r)
	b.Rejects = append(b.Rejects, Rejected{Index: idx, Line: line, Reason: r, Error: err.Error()})
}

// Emit publishes the accepted events, one message per pool (more when a
// pool's events exceed the largest message), and releases the batch. It
// returns the number of events published; an error wraps ErrPublish, and
// the accepted events not published are counted in Unpublished. What
// becomes of them is the caller's: the file tailer reads them again, an
// HTTP sender gets 503 and retries, a syslog datagram's are lost. With a
// *nats.Conn the publisher refuses only once its reconnect buffer
// (nats.ReconnectBufSize, 8 MiB by default) is full or it is closed.
func (b *Batch) Emit() (int, error) {
	defer func() {
		b.e.decoder.Put(b.dec)
		b.dec = nil
	}()
	published := 0
	for _, pool := range b.order {
		buf := b.pools[pool]
		subject := b.e.subj.Outcomes() + "." + pool
		for len(buf) > 0 {
			chunk := cutLines(buf, b.e.maxMsg)
			if err := b.e.pub.Publish(subject, chunk); err != nil {
				b.m.PublishErrs.Inc()
				b.m.Unpublished.Add(b.Accepted - published)
				return published, fmt.Errorf("%w: %s: %w", ErrPublish, subject, err)
			}
			n := countLines(chunk)
			published += n
			b.m.Events.Add(n)
			buf = buf[len(chunk):]
		}
	}
	return published, nil
}

// Flush waits, up to timeout, until what was published reached the
// server, when the publisher can tell (a *nats.Conn can).
func (e *Emitter) Flush(timeout time.Duration) error {
	if f, ok := e.pub.(flusher); ok {
		if err := f.FlushTimeout(timeout); err != nil {
			return fmt.Errorf("%w: flush: %w", ErrPublish, err)
		}
	}
	return nil
}

// cutLines returns the longest prefix of buf made of whole lines that fits
// in max bytes, or the first line when it alone is larger.
func cutLines(buf []byte, max int) []byte {
	if len(buf) <= max {
		return buf
	}
	end := 0
	for i, c := range buf {
		if c != '\n' {
			continue
		}
		if i+1 > max && end > 0 {
			break
		}
		end = i + 1
		if end >= max {
			break
		}
	}
	if end == 0 {
		return buf
	}
	return buf[:end]
}

func countLines(b []byte) int {
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}
