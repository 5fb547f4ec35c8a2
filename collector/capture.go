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
// What it does not cover: events a collector accepted in its last flush
// interval (10 ms) before it died stored before that batch's time are
// neither republished nor replayed; events of a period the capture's
// bounds discarded before anyone replayed them are lost, and that period
// is counted (fleetwatch_capture_uncovered_seconds_total). A server before
// 2.10 stores them too; only the replay's start time is needed.

// ensureCapture creates or updates FW_CAPTURE, binding one whose
// configuration may not be changed.
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
			return fmt.Errorf("collector: capture stream %s: %w", name, err)
		}
		c.settings.Logf("collector: using stream %s as configured (update refused: %v)", name, err)
	}
	return nil
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
// messages it replayed.
func (c *Collector) catchUp(ctx context.Context, w *worker) (int, error) {
	outcomes, err := c.js.Stream(ctx, c.stream)
	if err != nil {
		return 0, fmt.Errorf("collector: catch-up: %s: %w", c.stream, err)
	}
	capture, err := c.js.Stream(ctx, c.subjects.StreamCapture())
	if err != nil {
		return 0, fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err)
	}
	last := outcomes.CachedInfo().State.LastTime
	cs := capture.CachedInfo().State
	if cs.Msgs == 0 || !cs.LastTime.After(last) {
		return 0, nil // nothing was published after the last accepted event
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
	if last.IsZero() {
		start = cs.FirstTime
	}
	cons, err := capture.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
	})
	if err != nil {
		return 0, fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err)
	}
	if info.NumPending == 0 {
		return 0, nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(replayPullExpiry)) // as Replay: recreated 2 s after its node dies, and waited for
	if err != nil {
		return 0, fmt.Errorf("collector: catch-up: %s: %w", c.subjects.StreamCapture(), err)
	}
	defer it.Stop()
	n := 0
	var seen uint64
	for {
		msg, waited, err := nextStored(ctx, it, capture, seen, cs.LastSeq, replayNextTimeout, func(waited time.Duration) {
			c.settings.Logf("collector: catch-up of %s: no message for %v after %d while the stream holds more; waiting again",
				c.subjects.StreamCapture(), waited, n)
		})
		if errors.Is(err, errNoneStored) {
			return n, fmt.Errorf("%w: catch-up of %s after %d messages, none within %v", ErrReplayEndedEarly, c.subjects.StreamCapture(), n, waited)
		}
		if err != nil {
			return n, fmt.Errorf("collector: catch-up: %s after %d messages: %w", c.subjects.StreamCapture(), n, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return n, fmt.Errorf("collector: catch-up: metadata: %w", err)
		}
		seen = meta.Sequence.Stream
		if meta.Sequence.Stream > cs.LastSeq {
			break // arrived live too
		}
		w.handle(msg.Subject(), msg.Data(), meta.Timestamp)
		n++
		if meta.Sequence.Stream >= cs.LastSeq || meta.NumPending == 0 {
			break
		}
	}
	w.flush(false)
	w.flush(true)
	c.m.captureReplayed.Add(n)
	return n, nil
}
