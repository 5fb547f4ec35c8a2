package collector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// errNotEnabled reports that the server (or the account) has no JetStream.
var errNotEnabled = errors.New("collector: jetstream not enabled")

// setupStream detects JetStream and creates or updates FW_OUTCOMES, which
// captures fw.accepted.> and fw.partition.> in file storage, discarding the oldest events past
// StreamMaxAge or StreamMaxBytes.
func (c *Collector) setupStream(ctx context.Context) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return fmt.Errorf("collector: jetstream: %w", err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return errNotEnabled
		}
		return fmt.Errorf("collector: jetstream account info: %w", err)
	}
	if err := c.ensureOutcomes(ctx, js); err != nil {
		return err
	}
	c.js = js
	c.stream = c.subjects.StreamOutcomes()
	return nil
}

// ensureOutcomes creates or updates FW_OUTCOMES, binding one whose
// configuration may not be changed.
func (c *Collector) ensureOutcomes(ctx context.Context, js jetstream.JetStream) error {
	name := c.subjects.StreamOutcomes()
	cfg := jetstream.StreamConfig{
		Name:        name,
		Description: "fleetwatch: accepted outcome events (per-pool NDJSON batches) for replay and audit",
		Subjects:    []string{c.subjects.AcceptedWildcard(), c.subjects.PartitionWildcard()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.settings.StreamMaxAge,
		MaxBytes:    c.settings.StreamMaxBytes,
		Replicas:    c.settings.StreamReplicas,
	}
	if cfg.MaxBytes < 0 {
		cfg.MaxBytes = -1
	}
	if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
		// A stream whose configuration cannot be changed (storage type,
		// replicas set by an operator): use it as it is.
		if _, bindErr := js.Stream(ctx, name); bindErr != nil {
			return fmt.Errorf("collector: stream %s: %w", name, err)
		}
		c.settings.Logf("collector: using stream %s as configured (update refused: %v)", name, err)
	}
	return nil
}

// Ensure creates the streams and the intake consumer again if the server
// lost them (it came back with an empty store, or an operator deleted
// them); what exists is left as it is. serve calls it after every
// reconnect. Without JetStream it does nothing. A capture it cannot
// create is not its error: Stats reports it missing, and Run keeps trying
// (captureLoop).
func (c *Collector) Ensure(ctx context.Context) error {
	if c.js == nil {
		return nil
	}
	if err := c.ensureOutcomes(ctx, c.js); err != nil {
		return err
	}
	if c.wantCapture {
		c.setCapture(c.ensureCapture(ctx, c.js))
		return nil
	}
	if !c.settings.Intake {
		return nil
	}
	_, err := c.ensureIntake(ctx)
	return err
}

// replayFetch is how many stream messages Replay keeps in flight; each is a
// batch of up to StreamBatchBytes of events.
const replayFetch = 64

// replayStallWaits is how many replayNextTimeout waits in a row Replay
// spends without a batch while the stream still holds what is left.
const replayStallWaits = 4

// replayPullExpiry is how long each of Replay's pull requests lives; the
// server's idle heartbeats come every half of it. When they stop (the node
// that hosts the replay's consumer died, or the connection moved to
// another node) the ordered consumer is created again from the next
// stream sequence after two missed heartbeats: 2 s, against 10 s with the
// client's default (30 s pulls, 5 s heartbeats), which Replay's wait for
// the next batch (replayNextTimeout) did not outlast.
const replayPullExpiry = 2 * time.Second

// replayInfoTimeout bounds Replay's first request, the stream's info.
const replayInfoTimeout = 2 * time.Second

// replayNextTimeout bounds the wait for the next stored batch during Replay.
const replayNextTimeout = 10 * time.Second

// Replay reads the accepted events FW_OUTCOMES stored from since up to its
// last message at the time of the call, and calls fn with the events of each
// stored batch, in stream order. The batch is only valid during the call. An
// event without ts gets the time the stream stored it. Lines that do not
// decode (something else published on fw.accepted.> or fw.partition.>) are
// skipped and logged. It returns the number of events passed to fn,
// ErrNoJetStream when the collector runs without JetStream, and
// ErrReplayEndedEarly when the stream stopped delivering before its last
// stored batch (the events passed to fn are then only a part).
//
// The caller replays the analyzer's last window before it publishes, so a
// restart neither forgets an open breaker nor opens one on partial data.
func (c *Collector) Replay(ctx context.Context, since time.Time, fn func(batch []fleetwatch.Event)) (events int, err error) {
	return c.ReplaySubjects(ctx, since, []string{c.subjects.AcceptedWildcard(), c.subjects.PartitionWildcard()}, fn)
}

// ReplaySubjects is Replay restricted to the stored batches whose subject
// matches one of subjects (which must not overlap), for example the
// fw.partition.<n> of the partitions an instance takes over.
func (c *Collector) ReplaySubjects(ctx context.Context, since time.Time, subjects []string, fn func(batch []fleetwatch.Event)) (events int, err error) {
	if c.js == nil {
		return 0, ErrNoJetStream
	}
	// Bounded: right after a cluster restart the stream may have no
	// leader for seconds, and the caller tries again sooner than the
	// client's default 5 s.
	ictx, cancel := context.WithTimeout(ctx, replayInfoTimeout)
	stream, err := c.js.Stream(ictx, c.stream)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("collector: replay %s: stream info: %w", c.stream, err)
	}
	return replayStream(ctx, stream, since, subjects, c.settings.Logf, fn, c.m.replayedEvents.Add)
}

// ReadOutcomes reads the accepted events the stream FW_OUTCOMES of subj
// stored from since up to its last batch at the call, as Replay does, from
// a stream that exists (it creates nothing): for tools that export what a
// deployment decided on. An event without a ts has the time its batch was
// stored.
func ReadOutcomes(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects, since time.Time, fn func(batch []fleetwatch.Event)) (events int, err error) {
	stream, err := js.Stream(ctx, subj.StreamOutcomes())
	if err != nil {
		return 0, fmt.Errorf("collector: %s: %w", subj.StreamOutcomes(), err)
	}
	return replayStream(ctx, stream, since, []string{subj.AcceptedWildcard(), subj.PartitionWildcard()}, func(string, ...any) {}, fn, nil)
}

// replayStream reads the batches stream stored from since on the subjects
// up to its last one at the call, handing each batch's valid events to fn;
// counted, when not nil, is told how many each batch had.
func replayStream(ctx context.Context, stream jetstream.Stream, since time.Time, subjects []string, logf func(string, ...any),
	fn func(batch []fleetwatch.Event), counted func(int)) (events int, err error) {
	name := stream.CachedInfo().Config.Name
	last := stream.CachedInfo().State.LastSeq
	if stream.CachedInfo().State.Msgs == 0 {
		return 0, nil
	}
	cons, match, err := replayConsumer(ctx, stream, since, subjects)
	if err != nil {
		return 0, fmt.Errorf("collector: replay %s: create consumer: %w", name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(replayFetch), jetstream.PullExpiry(replayPullExpiry))
	if err != nil {
		return 0, fmt.Errorf("collector: replay %s: fetch: %w", name, err)
	}
	defer it.Stop()
	// The consumer exists now; its pending count says whether anything was
	// stored at or after since (Next would otherwise wait for new events).
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("collector: replay %s: consumer info: %w", name, err)
	}
	if info.NumPending == 0 {
		return 0, nil
	}

	var dec fleetwatch.Decoder
	var batch []fleetwatch.Event
	var skipped int
	var stored time.Time
	onLine := func(_ []byte, ev *fleetwatch.Event, err error) {
		if err != nil {
			skipped++
			return
		}
		if ev.TS.IsZero() {
			ev.TS = stored
		}
		batch = append(batch, *ev)
	}
	var seen uint64 // the stream sequence of the last batch read
	for {
		msg, waited, err := nextStored(ctx, it, stream, seen, last, replayNextTimeout, func(waited time.Duration) {
			logf("collector: replay of %s: no stored batch for %v after %d events while the stream holds more; waiting again",
				name, waited, events)
		})
		if errors.Is(err, errNoneStored) {
			logf("collector: replay of %s ended early after %d events: no stored batch within %v", name, events, waited)
			return events, fmt.Errorf("%w: after %d events, no stored batch within %v", ErrReplayEndedEarly, events, waited)
		}
		if err != nil {
			return events, fmt.Errorf("collector: replay %s: next batch after %d events: %w", name, events, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return events, fmt.Errorf("collector: replay %s: metadata of %s: %w", name, msg.Subject(), err)
		}
		stored = meta.Timestamp
		seen = meta.Sequence.Stream
		batch = batch[:0]
		if match == nil || match(msg.Subject()) {
			dec.DecodeBatch(msg.Data(), onLine)
		}
		if len(batch) > 0 {
			fn(batch)
			events += len(batch)
			if counted != nil {
				counted(len(batch))
			}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			break
		}
	}
	if skipped > 0 {
		logf("collector: replay skipped %d lines of %s that are not valid outcome events", skipped, name)
	}
	return events, nil
}

// errNoneStored is nextStored's answer when no message came within its
// waits.
var errNoneStored = errors.New("no stored message within the wait")

// nextStored returns the next message of it, an ordered consumer's
// iterator over stream read up to sequence seen of last. Each wait is
// bounded by wait (replayNextTimeout), because messages counted as pending may
// age out of the stream meanwhile; a wait that ends while the stream
// still holds what is left (or cannot say: no leader) is a consumer being
// created again after a node loss, which can take longer on a loaded
// cluster, and is waited out again (again is told how long so far), up
// to replayStallWaits waits in a row. Past them: errNoneStored, with the
// time waited.
func nextStored(ctx context.Context, it jetstream.MessagesContext, stream jetstream.Stream, seen, last uint64,
	wait time.Duration, again func(waited time.Duration)) (jetstream.Msg, time.Duration, error) {
	for waits := 1; ; waits++ {
		next, cancel := context.WithTimeout(ctx, wait)
		msg, err := it.Next(jetstream.NextContext(next))
		cancel()
		waited := wait * time.Duration(waits)
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return msg, waited, err
		}
		if waits >= replayStallWaits || !stillStored(ctx, stream, seen, last) {
			return nil, waited, errNoneStored
		}
		again(waited)
	}
}

// stillStored reports whether stream may still hold a message after seen
// and up to last: true when its first sequence is not past last, or when
// it cannot be asked (no leader while a node is lost).
func stillStored(ctx context.Context, stream jetstream.Stream, seen, last uint64) bool {
	ictx, cancel := context.WithTimeout(ctx, replayInfoTimeout)
	defer cancel()
	info, err := stream.Info(ictx)
	if err != nil {
		return true
	}
	return info.State.FirstSeq <= last && info.State.LastSeq > seen
}

// replayConsumer is an ordered consumer of stream from since, filtered on
// subjects. A server before 2.10 takes one filter subject: the whole stream
// is read then, and match (nil otherwise) matches the subjects here.
func replayConsumer(ctx context.Context, stream jetstream.Stream, since time.Time, subjects []string) (jetstream.Consumer, func(subject string) bool, error) {
	start := since
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
	})
	if !errors.Is(err, jetstream.ErrConsumerMultipleFilterSubjectsNotSupported) {
		return cons, nil, err
	}
	match := func(subject string) bool {
		for _, s := range subjects {
			if subjectMatches(s, subject) {
				return true
			}
		}
		return false
	}
	cons, err = stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
	})
	return cons, match, err
}

// subjectMatches reports whether subject matches the NATS subject pattern
// (tokens separated by dots, * one token, > the rest).
func subjectMatches(pattern, subject string) bool {
	for {
		p, prest, pmore := strings.Cut(pattern, ".")
		if p == ">" {
			return subject != ""
		}
		s, srest, smore := strings.Cut(subject, ".")
		if p != "*" && p != s {
			return false
		}
		if !pmore || !smore {
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}
