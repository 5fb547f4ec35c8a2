package collector

import (
	"fmt"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// collectorMetrics holds the collector's series. Every label value is
// registered at start, so a reason or outcome that never happened reads 0
// rather than being absent.
type collectorMetrics struct {
	set *metrics.Set

	messages     *metrics.Counter
	events       [fleetwatch.NumOutcomes]*metrics.Counter // indexed by Outcome; [0] unused
	rejects      map[fleetwatch.Reason]*metrics.Counter
	skewed       *metrics.Counter
	dropped      *metrics.Counter
	slowConsumer *metrics.Counter
	batches      *metrics.Counter

	streamPublished       *metrics.Counter
	streamPublishedEvents *metrics.Counter
	streamPublishErrors   *metrics.Counter
	rejectsPublished      *metrics.Counter
	rejectsSuppressed     *metrics.Counter
	replayedEvents        *metrics.Counter
	intakeAckErrors       *metrics.Counter
	intakeLost            *metrics.Counter
	captureReplayed       *metrics.Counter
	captureUncovered      *metrics.FloatCounter
	captureUnreplayed     *metrics.Counter
	captureDeduplicated   *metrics.Counter
	captureMissing        *metrics.Gauge
	jetstream             *metrics.Gauge

	// bySourceMu guards bySource and sources: the rejects by reason and
	// source, created on first use, with at most maxSources distinct
	// sources (later ones count as "other").
	bySourceMu sync.Mutex
	bySource   map[sourceKey]*metrics.Counter
	sources    map[string]struct{}
	maxSources int
}

// sourceKey names one series of fleetwatch_ingest_rejects_by_source_total.
type sourceKey struct {
	reason fleetwatch.Reason
	source string
}

// Source labels that are not a publisher's own.
const (
	sourceOther   = "other"   // beyond MaxRejectSources
	sourceUnknown = "unknown" // the event had no source, or it could not be read
)

func newCollectorMetrics(set *metrics.Set, maxSources int) *collectorMetrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &collectorMetrics{
		set:                   set,
		messages:              set.GetOrCreateCounter("fleetwatch_ingest_messages_total"),
		rejects:               make(map[fleetwatch.Reason]*metrics.Counter, len(fleetwatch.Reasons)),
		skewed:                set.GetOrCreateCounter("fleetwatch_ingest_skewed_total"),
		dropped:               set.GetOrCreateCounter("fleetwatch_ingest_dropped_total"),
		slowConsumer:          set.GetOrCreateCounter("fleetwatch_ingest_slow_consumer_total"),
		batches:               set.GetOrCreateCounter("fleetwatch_ingest_batches_total"),
		streamPublished:       set.GetOrCreateCounter("fleetwatch_stream_published_total"),
		streamPublishedEvents: set.GetOrCreateCounter("fleetwatch_stream_published_events_total"),
		streamPublishErrors:   set.GetOrCreateCounter("fleetwatch_stream_publish_errors_total"),
		rejectsPublished:      set.GetOrCreateCounter("fleetwatch_rejects_published_total"),
		rejectsSuppressed:     set.GetOrCreateCounter("fleetwatch_rejects_suppressed_total"),
		replayedEvents:        set.GetOrCreateCounter("fleetwatch_replay_events_total"),
		intakeAckErrors:       set.GetOrCreateCounter("fleetwatch_intake_ack_errors_total"),
		intakeLost:            set.GetOrCreateCounter("fleetwatch_intake_lost_messages_total"),
		captureReplayed:       set.GetOrCreateCounter("fleetwatch_capture_replayed_messages_total"),
		captureUncovered:      set.GetOrCreateFloatCounter("fleetwatch_capture_uncovered_seconds_total"),
		captureUnreplayed:     set.GetOrCreateCounter("fleetwatch_capture_unreplayed_messages_total"),
		captureDeduplicated:   set.GetOrCreateCounter("fleetwatch_capture_deduplicated_events_total"),
		captureMissing:        set.GetOrCreateGauge("fleetwatch_capture_missing", nil),
		jetstream:             set.GetOrCreateGauge("fleetwatch_collector_jetstream", nil),
		bySource:              make(map[sourceKey]*metrics.Counter),
		sources:               make(map[string]struct{}),
		maxSources:            max(maxSources, 1),
	}
	for o := fleetwatch.OutcomeOK; int(o) < fleetwatch.NumOutcomes; o++ {
		m.events[o] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_events_total{outcome=%q}`, o.String()))
	}
	for _, r := range fleetwatch.Reasons {
		m.rejects[r] = set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_rejects_total{reason=%q}`, string(r)))
	}
	m.jetstream.Set(0)
	m.captureMissing.Set(0)
	return m
}

// reject returns the counter of reason r, falling back to bad_json for a
// reason this build does not know (it cannot happen with the root package's
// decoder, but a new reason must not panic the hot path).
func (m *collectorMetrics) reject(r fleetwatch.Reason) *metrics.Counter {
	if c, ok := m.rejects[r]; ok {
		return c
	}
	return m.rejects[fleetwatch.ReasonBadJSON]
}

// rejectBySource returns the counter of reason r and source: the source's
// own series while fewer than maxSources sources have one, else "other".
// Looking up an existing series does not allocate.
func (m *collectorMetrics) rejectBySource(r fleetwatch.Reason, source string) *metrics.Counter {
	m.bySourceMu.Lock()
	defer m.bySourceMu.Unlock()
	if source == "" {
		source = sourceUnknown
	} else if _, known := m.sources[source]; !known {
		if len(m.sources) >= m.maxSources {
			source = sourceOther
		} else {
			m.sources[source] = struct{}{}
		}
	}
	k := sourceKey{r, source}
	c := m.bySource[k]
	if c == nil {
		c = m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_rejects_by_source_total{reason=%q,source=%s}`,
			string(r), promlabel.Quote(source)))
		m.bySource[k] = c
	}
	return c
}

// Stats is a point-in-time copy of the collector's counters. Accepted
// events are counted when their batch is handed to the sink, so a Stats
// taken while Run is active lags by up to Settings.FlushInterval.
type Stats struct {
	Messages     uint64                         // messages received
	Accepted     [fleetwatch.NumOutcomes]uint64 // accepted events by Outcome ([0] unused)
	Rejected     map[fleetwatch.Reason]uint64   // rejected events by reason, every reason present
	Skewed       uint64                         // events whose ts was replaced by the arrival time
	Dropped      uint64                         // messages nats.go dropped (slow consumer); an NDJSON message holds several events
	SlowConsumer uint64                         // slow-consumer episodes nats.go reported
	Batches      uint64                         // batches handed to the sink

	StreamPublished       uint64 // NDJSON batches republished for FW_OUTCOMES
	StreamPublishedEvents uint64 // events in them
	StreamPublishErrors   uint64 // republish failures
	RejectsPublished      uint64 // notices published on fw.rejects
	RejectsSuppressed     uint64 // rejects not described because of the rate limit

	JetStream  bool   // capture and replay are on
	Intake     bool   // the durable intake is on
	IntakeLost uint64 // intake messages discarded undelivered (counted by this collector)
	// CaptureWanted: the capture is configured (Settings.Capture, with
	// JetStream, without the intake). Capture: FW_CAPTURE is in place
	// beside the core path. While it is wanted and not in place,
	// CaptureErr says why (errors.Is ErrStreamOverlap when another stream
	// holds the outcome subjects) and Run keeps trying to create it.
	CaptureWanted bool
	Capture       bool
	CaptureErr    error
	// CaptureReplayed are the captured messages replayed at start;
	// CaptureUncoveredSeconds the seconds between the last accepted event
	// and the oldest captured one that nobody replayed (lost);
	// CaptureUnreplayed the messages a catch-up that ended early did not
	// replay (lost), CaptureDeduplicated the events a catch-up left out
	// because their collector had decided on them already (tail.go), and
	// CatchUpErr how the last catch-up failed.
	CaptureReplayed         uint64
	CaptureUncoveredSeconds float64
	CaptureUnreplayed       uint64
	CaptureDeduplicated     uint64
	CatchUpErr              error
}

// AcceptedTotal is the number of accepted events of every outcome.
func (s Stats) AcceptedTotal() uint64 {
	var n uint64
	for _, v := range s.Accepted {
		n += v
	}
	return n
}

// RejectedTotal is the number of rejected events of every reason.
func (s Stats) RejectedTotal() uint64 {
	var n uint64
	for _, v := range s.Rejected {
		n += v
	}
	return n
}

// Stats returns the collector's counters.
func (c *Collector) Stats() Stats {
	m := c.m
	c.mu.Lock()
	capture, captureErr, catchUpErr := c.capture, c.captureErr, c.catchUpErr
	c.mu.Unlock()
	s := Stats{
		Messages:                m.messages.Get(),
		Rejected:                make(map[fleetwatch.Reason]uint64, len(m.rejects)),
		Skewed:                  m.skewed.Get(),
		Dropped:                 m.dropped.Get(),
		SlowConsumer:            m.slowConsumer.Get(),
		Batches:                 m.batches.Get(),
		StreamPublished:         m.streamPublished.Get(),
		StreamPublishedEvents:   m.streamPublishedEvents.Get(),
		StreamPublishErrors:     m.streamPublishErrors.Get(),
		RejectsPublished:        m.rejectsPublished.Get(),
		RejectsSuppressed:       m.rejectsSuppressed.Get(),
		JetStream:               c.js != nil,
		Intake:                  c.js != nil && c.settings.Intake,
		IntakeLost:              m.intakeLost.Get(),
		CaptureWanted:           c.wantCapture,
		Capture:                 capture,
		CaptureErr:              captureErr,
		CaptureReplayed:         m.captureReplayed.Get(),
		CaptureUncoveredSeconds: m.captureUncovered.Get(),
		CaptureUnreplayed:       m.captureUnreplayed.Get(),
		CaptureDeduplicated:     m.captureDeduplicated.Get(),
		CatchUpErr:              catchUpErr,
	}
	for o := fleetwatch.OutcomeOK; int(o) < fleetwatch.NumOutcomes; o++ {
		s.Accepted[o] = m.events[o].Get()
	}
	for r, ctr := range m.rejects {
		s.Rejected[r] = ctr.Get()
	}
	return s
}
