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

// Switching ingest.durable (DECISIONS.md "No silent loss"). The capture
// (FW_CAPTURE, the default) and the durable intake (FW_INTAKE) both take
// fw.outcomes and fw.outcomes.>, and NATS lets one stream take a subject:
// after a switch the other mode's stream is in the way, and the leftover
// keeps storing every event with nobody reading it. A collector that
// starts while no other runs (Settings.CatchUp) takes the leftover over:
// it decides on what the leftover holds that no collector took (stored
// after the last accepted event), deletes it and creates its own stream.
// Beside running instances (which may still consume the leftover) it
// deletes nothing: the capture keeps being retried and reported missing,
// and the intake, which has no other way in, refuses to start. Either way
// the error names the stream in the way and the command that removes it.

// ErrStreamOverlap is matched (errors.Is) by the error of a capture or
// intake that cannot be created because another stream holds the outcome
// subjects.
var ErrStreamOverlap = errors.New("collector: another stream holds the outcome subjects")

// overlapError is a capture or an intake that another stream is in the
// way of, with what to do about it.
type overlapError struct {
	holder string // the stream that holds the subjects
	msg    string
	err    error // the server's answer
}

func (e *overlapError) Error() string        { return e.msg }
func (e *overlapError) Unwrap() error        { return e.err }
func (e *overlapError) Is(target error) bool { return target == ErrStreamOverlap }

// overlapHolder returns the stream that err says holds the outcome
// subjects, or "" when err is not an overlap.
func overlapHolder(err error) string {
	var oe *overlapError
	if errors.As(err, &oe) {
		return oe.holder
	}
	return ""
}

// streamError is the error of creating the stream name (the capture or
// the intake) that the server refused with err: an *overlapError naming
// the stream in the way when there is one, else err with context.
func (c *Collector) streamError(ctx context.Context, js jetstream.JetStream, name string, err error) error {
	what, intake := "the capture", name == c.subjects.StreamIntake()
	if intake {
		what = "the durable intake"
	}
	var holder string
	var taken []string // of holder
	for _, subject := range []string{c.subjects.Outcomes(), c.subjects.OutcomesWildcard()} {
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(subject))
		for n := range names.Name() {
			if n != name && (holder == "" || n == holder) {
				holder = n
				taken = append(taken, subject)
			}
		}
	}
	if holder == "" {
		return fmt.Errorf("collector: %s stream %s: %w", what, name, err)
	}
	subjects := strings.Join(taken, " and ")
	var b strings.Builder
	fmt.Fprintf(&b, "collector: cannot create %s %s: stream %s holds %s (NATS lets one stream take a subject)", what, name, holder, subjects)
	switch {
	case !intake && holder == c.subjects.StreamIntake():
		fmt.Fprintf(&b, "; it is the durable intake of ingest.durable: true, and it stores every outcome event, which nobody consumes once no serve runs with ingest.durable: true. "+
			"Once none does, delete it (`nats stream rm %s`: what it holds is not decided on), or restart serve while no other instance runs (it decides on what %s holds and replaces it)", holder, holder)
	case intake && holder == c.subjects.StreamCapture():
		fmt.Fprintf(&b, "; it is the capture of serve instances whose ingest.durable is not true. "+
			"Stop every serve and start this one alone (it decides on what %s holds and replaces it), or delete it (`nats stream rm %s`: what it holds is not decided on)", holder, holder)
	default:
		fmt.Fprintf(&b, ": remove %s from %s's subjects or delete it (`nats stream rm %s`)", subjects, holder, holder)
	}
	if !intake {
		b.WriteString("; retried until it exists")
	}
	return &overlapError{holder: holder, msg: b.String(), err: err}
}

// alone reports whether this collector is the only one running
// (Settings.CatchUp).
func (c *Collector) alone() bool { return c.settings.CatchUp == nil || c.settings.CatchUp() }

// takeOverIntake replaces a leftover FW_INTAKE with FW_CAPTURE. Run calls
// it while this collector runs alone, its core subscriptions in place: it
// replays through w what FW_INTAKE stored after FW_OUTCOMES' last batch,
// up to its last message now (published while no collector ran:
// everything before it a collector took, from the intake or live), then
// deletes FW_INTAKE, whatever the replay's outcome (what it did not
// replay is counted: a later start would skip it as older than the events
// accepted meanwhile), and creates the capture. It returns how many
// messages it replayed.
func (c *Collector) takeOverIntake(ctx context.Context, w *worker) (int, error) {
	name := c.subjects.StreamIntake()
	defer c.tryCapture(ctx)
	defer func() { w.flush(false); w.flush(true) }()
	outcomes, err := c.js.Stream(ctx, c.stream)
	if err != nil {
		return 0, fmt.Errorf("collector: taking %s over: %s: %w", name, c.stream, err)
	}
	intake, err := c.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil // gone meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("collector: taking %s over: %w", name, err)
	}
	n, replayErr := c.replayIntake(ctx, w, intake, outcomes)
	if err := c.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return n, errors.Join(replayErr, fmt.Errorf("collector: taking %s over: delete: %w", name, err))
	}
	c.settings.Logf("collector: took over stream %s, left by ingest.durable: true: replayed %d messages published while no collector ran, deleted it; creating %s in its place",
		name, n, c.subjects.StreamCapture())
	return n, replayErr
}

// replayIntake hands w the messages intake (a work queue) stored after
// the time of the last batch of outcomes, up to its last one now, less the
// copies of events decided on already (tail.go). A work queue takes one
// unfiltered consumer, delivering from its first message, so the
// collectors' durable consumer (no collector runs it: this one is alone)
// is deleted and what was stored up to last is purged first (up to the
// tail's start, with a tail).
func (c *Collector) replayIntake(ctx context.Context, w *worker, intake, outcomes jetstream.Stream) (int, error) {
	name := intake.CachedInfo().Config.Name
	st := intake.CachedInfo().State
	last := outcomes.CachedInfo().State.LastTime
	if st.Msgs == 0 || !st.LastTime.After(last) {
		return 0, nil
	}
	start, ok, err := firstStoredAfter(ctx, intake, last, st.FirstSeq, st.LastSeq)
	if err != nil || !ok {
		if err != nil {
			err = fmt.Errorf("collector: taking %s over: %w", name, err)
		}
		return 0, c.noteCatchUp(err)
	}
	from := start
	var tail *republished
	if !last.IsZero() {
		// Acknowledged messages are deleted, and a deleted copy cannot be
		// taken off: unless the intake still holds every message from the
		// tail's start, only events sent with a ts match (here the head;
		// the replay checks for holes).
		if tail = c.readTail(ctx, outcomes, last); tail != nil {
			seq, ok, err := firstStoredAfter(ctx, intake, tail.since, st.FirstSeq, start)
			if err == nil && ok {
				from, tail.from = seq, seq
				tail.tsOnly = seq == st.FirstSeq && st.FirstSeq > 1
			} else {
				tail = nil
			}
		}
	}
	if err := intake.DeleteConsumer(ctx, fleetwatch.QueueCollectors); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, c.failedCatchUp(fmt.Errorf("collector: taking %s over: delete consumer %s: %w", name, fleetwatch.QueueCollectors, err), st.LastSeq, start-1)
	}
	if from > st.FirstSeq {
		if err := intake.Purge(ctx, jetstream.WithPurgeSequence(from)); err != nil {
			return 0, c.failedCatchUp(fmt.Errorf("collector: taking %s over: purge before %d: %w", name, from, err), st.LastSeq, start-1)
		}
	}
	cons, err := intake.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "fleetwatch: taking the intake over",
		AckPolicy:         jetstream.AckExplicitPolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return 0, c.failedCatchUp(fmt.Errorf("collector: taking %s over: consumer: %w", name, err), st.LastSeq, start-1)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(replayPullExpiry))
	if err != nil {
		return 0, c.failedCatchUp(fmt.Errorf("collector: taking %s over: %w", name, err), st.LastSeq, start-1)
	}
	defer it.Stop()
	n, seen, err := c.replayStored(ctx, w, it, intake, st.LastSeq, true, tail)
	if err != nil {
		return n, c.failedCatchUp(err, st.LastSeq, max(seen, start-1))
	}
	return n, c.noteCatchUp(nil)
}

// firstStoredAfter returns the first sequence in [first, last] of stream
// stored after t, by bisection (the stored times grow with the
// sequence); ok is false when there is none.
func firstStoredAfter(ctx context.Context, stream jetstream.Stream, t time.Time, first, last uint64) (seq uint64, ok bool, err error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// The first message at or after mid (a work queue has holes).
		msg, err := stream.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(">"))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && msg.Sequence > last):
			hi = mid
		case err != nil:
			return 0, false, fmt.Errorf("message at %d: %w", mid, err)
		case msg.Time.After(t):
			seq, ok, hi = msg.Sequence, true, mid
		default:
			lo = msg.Sequence + 1
		}
	}
	return seq, ok, nil
}

// takeOverCapture replaces FW_CAPTURE with the durable intake (Settings.
// Intake). Run calls it, instead of consuming the intake, while this
// collector runs alone: core subscriptions take the live events
// meanwhile; it replays what FW_CAPTURE stored after the last accepted
// event (catchUp), deletes FW_CAPTURE, creates FW_INTAKE and its consumer
// and hands over from the core subscriptions to the intake, which it
// returns the pullers of. What FW_INTAKE stored up to its last sequence
// read while the core subscriptions still ran is purged (they took it):
// an event published between that read and their unsubscription is taken
// by both, counted twice; none is lost.
func (c *Collector) takeOverCapture(ctx context.Context) ([]*worker, error) {
	name := c.subjects.StreamCapture()
	core, err := c.subscribe()
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]*worker, error) {
		c.drain(core)
		return nil, err
	}
	if err := c.nc.Flush(); err != nil {
		return fail(fmt.Errorf("collector: subscribing: %w", err))
	}
	n, err := c.catchUp(ctx, newWorker(c))
	if err != nil {
		c.settings.Logf("%v (the rest of what was published while no collector ran is not decided on)", err)
	}
	if err := c.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fail(fmt.Errorf("collector: taking %s over: delete: %w", name, err))
	}
	c.settings.Logf("collector: took over stream %s, the capture of ingest.durable unset: replayed %d messages published while no collector ran, deleted it; creating %s in its place",
		name, n, c.subjects.StreamIntake())
	cons, err := c.ensureIntake(ctx)
	if err != nil {
		return fail(err)
	}
	intake, err := c.js.Stream(ctx, c.subjects.StreamIntake())
	if err != nil {
		return fail(fmt.Errorf("collector: intake stream %s: %w", c.subjects.StreamIntake(), err))
	}
	taken := intake.CachedInfo().State.LastSeq
	c.drain(core)
	if taken > 0 {
		if err := intake.Purge(ctx, jetstream.WithPurgeSequence(taken+1)); err != nil {
			return nil, fmt.Errorf("collector: intake stream %s: purging what the core subscriptions took: %w", c.subjects.StreamIntake(), err)
		}
		c.intakeLossMark = taken // purged, not lost
	}
	c.intake = cons
	return c.consumeIntake()
}

// noteLeftovers logs the capture or intake that a collector with neither
// (ingest.durable: false) finds: left by another setting, it stores every
// outcome event up to its bounds, and nothing here reads it.
func (c *Collector) noteLeftovers(ctx context.Context) {
	for _, name := range []string{c.subjects.StreamCapture(), c.subjects.StreamIntake()} {
		if _, err := c.js.Stream(ctx, name); err == nil {
			c.settings.Logf("collector: stream %s is left over from another ingest.durable setting: it stores every outcome event up to its bounds, and this collector does not read it; delete it (`nats stream rm %s`) unless another serve uses it",
				name, name)
		}
	}
}
