package collector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The capture (Settings.Capture): the stream FW_CAPTURE stores fw.outcomes
// and fw.outcomes.> as they are published, whoever listens, within
// IntakeMaxAge and IntakeMaxBytes (oldest discarded first), while the
// collectors go on taking the live events from their core queue
// subscriptions, the fast path. Nothing consumes it live. When a collector
// starts and no other one runs (Settings.CatchUp), it replays what the
// stream stored after the last batch FW_OUTCOMES holds (the last event any
// collector accepted and republished) up to the moment its own
// subscriptions were in place: the events published while no collector ran.
//
// Events a collector decided on that the capture stored only after its
// last republished batch are left out of the replay (tail.go).
//
// What it does not cover: events a collector accepted in its last flush
// interval (10 ms) before it died stored before that batch's time are
// neither republished nor replayed; events of a period the capture's
// bounds discarded before anyone replayed them are lost, and that period
// is counted (fleetwatch_capture_uncovered_seconds_total); what a
// catch-up that ended early did not replay is lost and counted
// (fleetwatch_capture_unreplayed_messages_total). A server before 2.10
// stores them too; only the replay's start time is needed. While the
// capture cannot be created, events published while no collector runs
// are lost, uncounted: captureLoop tries again, and Stats (serve's
// /healthz, fleetwatch_capture_missing) says so meanwhile.

// ensureCapture creates or updates FW_CAPTURE, binding one whose
// configuration may not be changed. When another stream holds the
// outcome subjects, the error is an overlap (ErrStreamOverlap) that names
// it and what to do.
func (c *Collector) ensureCapture(ctx context.Context, js jetstream.JetStream) error {
	name := c.subjects.StreamCapture()
	cfg := jetstream.StreamConfig{
		Name:        name,
		Description: "fleetwatch: outcome events as published, replayed by a collector that starts alone (what arrived while none ran)",
		Subjects:    []string{c.subjects.Outcomes(), c.subjects.OutcomesWildcard()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.settings.IntakeMaxAge,
		MaxBytes:    c.settings.IntakeMaxBytes,
		Replicas:    c.settings.StreamReplicas,
	}
	cfg.PersistMode = persistMode(ctx, js, name, cfg.Replicas)
	if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
		if _, bindErr := js.Stream(ctx, name); bindErr != nil {
			return c.streamError(ctx, js, name, err)
		}
		c.settings.Logf("collector: using stream %s as configured (update refused: %v)", name, err)
	}
	return nil
}

// The capture's retries. A capture that cannot be created (another stream
// holds its subjects, the server's disk is full, a permission is missing)
// is tried again after captureRetryMin, the wait doubling up to
// captureRetryMax, for as long as Run runs; meanwhile Stats (and serve's
// /healthz) say it is missing and why, and fleetwatch_capture_missing is 1.
const (
	captureRetryMin = time.Second
	captureRetryMax = 30 * time.Second
)

// nextCaptureRetry is the wait after a failed attempt that followed a wait
// of wait.
func nextCaptureRetry(wait time.Duration) time.Duration {
	return min(2*wait, captureRetryMax)
}

// captureLoop keeps FW_CAPTURE in place until ctx ends or Close is
// called (keepCapture with tryCapture).
func (c *Collector) captureLoop(ctx context.Context) { c.keepCapture(ctx, c.tryCapture) }

// keepCapture calls try, which reports whether the capture is in place:
// while it is missing after nextCaptureRetry's waits, and while it is in
// place when Ensure found it missing (kickCapture), until ctx ends or
// Close is called.
func (c *Collector) keepCapture(ctx context.Context, try func(context.Context) bool) {
	on, wait := c.captureOn(), captureRetryMin
	for {
		goOn, timedOut := c.captureWait(ctx, on, wait)
		if !goOn {
			return
		}
		if timedOut {
			wait = nextCaptureRetry(wait)
		}
		if on = try(ctx); on {
			wait = captureRetryMin
		}
	}
}

// captureWait waits for a kick, and while the capture is not on at most
// wait; it reports whether to go on (not once ctx ended or Close was
// called) and whether the wait ran out.
func (c *Collector) captureWait(ctx context.Context, on bool, wait time.Duration) (goOn, timedOut bool) {
	var retry <-chan time.Time // nil, never ready, while the capture is on
	if !on {
		t := time.NewTimer(wait)
		defer t.Stop()
		retry = t.C
	}
	select {
	case <-ctx.Done():
		return false, false
	case <-c.closed:
		return false, false
	case <-retry:
		return true, true
	case <-c.captureKick:
		return true, false
	}
}

// kickCapture wakes captureLoop.
func (c *Collector) kickCapture() {
	select {
	case c.captureKick <- struct{}{}:
	default:
	}
}

// tryCapture creates or binds FW_CAPTURE and records the outcome; it
// reports whether the capture is in place.
func (c *Collector) tryCapture(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	err := c.ensureCapture(cctx, c.js)
	c.setCapture(err)
	return err == nil
}

// captureOn reports whether FW_CAPTURE is in place.
func (c *Collector) captureOn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capture
}

// setCapture records whether FW_CAPTURE is in place (err is nil) or why
// not, and logs each change.
func (c *Collector) setCapture(err error) {
	c.mu.Lock()
	was, wasErr := c.capture, c.captureErr
	c.capture, c.captureErr = err == nil, err
	c.mu.Unlock()
	if err == nil {
		c.m.captureMissing.Set(0)
		if !was && wasErr != nil {
			c.settings.Logf("collector: capture stream %s in place: events published while no serve runs are kept again", c.subjects.StreamCapture())
		}
		return
	}
	c.m.captureMissing.Set(1)
	if was || wasErr == nil || wasErr.Error() != err.Error() {
		c.settings.Logf("%v: running without it meanwhile (events published while no serve runs would be lost, uncounted)", err)
	}
	if was {
		c.kickCapture() // lost while in place: captureLoop waits for this
	}
}

// persistMode is the persist mode for the stream name: the one it has
// when it exists (the server refuses to change it), otherwise async for a
// single replica. Async persistence writes the stream's file from a flush
// loop (every 16 KiB or 8 ms) instead of once per message: the pwrite per
// message is what the server's stream loop spent most of its time on in
// `fleetwatch bench` (BENCHMARKS.md "Ingest with the capture"). What it
// gives up is at most those 8 ms of writes when the nats-server process is
// killed (a clean stop flushes them); the file is not synced in either
// mode (nats-server's sync_interval, 2 minutes by default), so a machine
// crash loses the same. Replicated streams flush asynchronously anyway,
// backed by their raft log, and refuse the setting; servers before 2.12
// ignore it.
func persistMode(ctx context.Context, js jetstream.JetStream, name string, replicas int) jetstream.PersistModeType {
	if s, err := js.Stream(ctx, name); err == nil {
		return s.CachedInfo().Config.PersistMode
	}
	if replicas > 1 {
		return jetstream.DefaultPersistMode
	}
	return jetstream.AsyncPersistMode
}

// catchUp replays, through w, the messages FW_CAPTURE stored after
// FW_OUTCOMES' last batch and up to its last message now (the caller's
// subscriptions are in place: later ones come live). It returns how many
// messages it replayed. When it ends early, the messages after the last
// one it replayed up to that last message are counted
// (fleetwatch_capture_unreplayed_messages_total): nobody will decide on
// them, since a later catch-up starts after the events accepted
// meanwhile. Its error, or nil, is kept for Stats.
func (c *Collector) catchUp(ctx context.Context, w *worker) (int, error) {
	defer func() { w.flush(false); w.flush(true) }()
	outcomes, err := c.js.Stream(ctx, c.stream)
	if err != nil {
		return 0, c.noteCatchUp(fmt.Errorf("collector: catch-up: %s: %w", c.stream, err))
	}
	capture, err := c.js.Stream(ctx, c.subjects.StreamCapture())
	if err != nil {
		return 0, c.noteCatchUp(fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err))
	}
	last := outcomes.CachedInfo().State.LastTime
	cs := capture.CachedInfo().State
	if cs.Msgs == 0 || !cs.LastTime.After(last) {
		return 0, c.noteCatchUp(nil) // nothing was published after the last accepted event
	}
	if !last.IsZero() && cs.FirstTime.After(last) && capture.CachedInfo().Created.Before(last) {
		// The capture ran through the gap, but its bounds discarded the
		// start of it before anyone replayed it.
		gap := cs.FirstTime.Sub(last)
		c.m.captureUncovered.Add(gap.Seconds())
		c.settings.Logf("collector: catch-up: %s no longer holds what was published in the %v after the last accepted event (its max_age or max_bytes discarded it); counted in fleetwatch_capture_uncovered_seconds_total",
			c.subjects.StreamCapture(), gap.Round(time.Second))
	}
	start := last.Add(time.Nanosecond)
	var tail *republished
	if last.IsZero() {
		start = cs.FirstTime
	} else if tail = c.readTail(ctx, outcomes, last); tail != nil {
		// Its bounds may have discarded copies to take off: then only
		// events sent with a ts match.
		tail.tsOnly = cs.FirstSeq > 1 && cs.FirstTime.After(tail.since)
		start = tail.since // the copies before last are taken off first
	}
	cons, err := capture.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
	})
	if err != nil {
		return 0, c.noteCatchUp(fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err))
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, c.noteCatchUp(fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err))
	}
	if info.NumPending == 0 {
		return 0, c.noteCatchUp(nil)
	}
	before := info.Delivered.Stream // the sequence before the first to replay
	if tail != nil {
		tail.from = before + 1
	}
	// As Replay: recreated 2 s after its node dies, and waited for.
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(replayPullExpiry))
	if err != nil {
		return 0, c.failedCatchUp(fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err), cs.LastSeq, before)
	}
	defer it.Stop()
	n, seen, err := c.replayStored(ctx, w, it, capture, cs.LastSeq, false, tail)
	if err != nil {
		return n, c.failedCatchUp(err, cs.LastSeq, max(seen, before))
	}
	return n, c.noteCatchUp(nil)
}

// replayStored hands w the messages of it, a consumer of stream, up to
// sequence last (acknowledging each when ack), less the events tail
// matches (nil: none; counted in
// fleetwatch_capture_deduplicated_events_total), and counts them in
// fleetwatch_capture_replayed_messages_total. It returns how many it
// handed and the sequence of the last one it read.
func (c *Collector) replayStored(ctx context.Context, w *worker, it jetstream.MessagesContext, stream jetstream.Stream, last uint64, ack bool, tail *republished) (n int, seen uint64, err error) {
	name := stream.CachedInfo().Config.Name
	defer func() { c.m.captureReplayed.Add(n) }()
	for {
		msg, waited, err := nextStored(ctx, it, stream, seen, last, replayNextTimeout, func(waited time.Duration) {
			c.settings.Logf("collector: catch-up of %s: no message for %v after %d while the stream holds more; waiting again",
				name, waited, n)
		})
		if errors.Is(err, errNoneStored) {
			return n, seen, fmt.Errorf("%w: catch-up of %s after %d messages, none within %v", ErrReplayEndedEarly, name, n, waited)
		}
		if err != nil {
			return n, seen, fmt.Errorf("collector: catch-up: %s after %d messages: %w", name, n, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return n, seen, fmt.Errorf("collector: catch-up: metadata: %w", err)
		}
		if meta.Sequence.Stream > last {
			return n, seen, nil // arrived live too
		}
		seen = meta.Sequence.Stream
		switch data, matched := tail.filter(msg.Data(), meta.Timestamp, meta.Sequence.Stream); {
		case matched < 0: // stored before the last batch: decided on
		case matched > 0 && len(data) == 0:
			c.m.captureDeduplicated.Add(matched)
		default:
			c.m.captureDeduplicated.Add(matched)
			w.handle(msg.Subject(), data, meta.Timestamp)
			n++
		}
		if ack {
			_ = msg.Ack() // the stream is deleted next: a lost ack costs nothing
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			return n, seen, nil
		}
	}
}

// failedCatchUp counts, after a catch-up that replayed up to sequence
// done of the messages up to last and then failed with err, the messages
// it did not replay, logs them, and keeps err for Stats.
func (c *Collector) failedCatchUp(err error, last, done uint64) error {
	if last > done {
		c.m.captureUnreplayed.Add(int(last - done))
		c.settings.Logf("%v: %d messages published while no collector ran are not decided on; counted in fleetwatch_capture_unreplayed_messages_total",
			err, last-done)
	}
	return c.noteCatchUp(err)
}

// noteCatchUp keeps the outcome of the last catch-up for Stats and returns
// err.
func (c *Collector) noteCatchUp(err error) error {
	c.mu.Lock()
	c.catchUpErr = err
	c.mu.Unlock()
	return err
}
