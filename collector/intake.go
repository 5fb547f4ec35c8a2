package collector

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// The durable intake (Settings.Intake). Core NATS drops a message that no
// subscriber takes: with the default live path, events published while no
// collector runs (a restart, a deploy, a crash) or while the collectors
// reconnect are lost. With the intake, the server stores every outcome
// message in FW_INTAKE as it is published, whoever listens, and the
// collectors take them from there through one durable pull consumer (the
// stream's queue group: each message goes to one collector). A message is
// acknowledged once decoded, so it is removed from the work queue; one that
// a collector took but did not acknowledge (it died) is delivered again
// after intakeAckWait. What is kept while nobody consumes is bounded by
// IntakeMaxAge and IntakeMaxBytes.

const (
	// intakeAckWait is how long a delivered message may stay unacknowledged
	// before the server delivers it again (to any collector).
	intakeAckWait = 30 * time.Second
	// intakeMaxAckPending bounds the messages delivered and not yet
	// acknowledged, over all collectors.
	intakeMaxAckPending = 100_000
	// intakePull is how many messages each puller asks for at once.
	intakePull = 512
)

// setupIntake creates or updates FW_INTAKE and its durable consumer.
func (c *Collector) setupIntake(ctx context.Context) error {
	cons, err := c.ensureIntake(ctx)
	if err != nil {
		return err
	}
	c.intake = cons
	return nil
}

// ensureIntake creates or updates FW_INTAKE and its durable consumer,
// binding a stream whose configuration may not be changed. When another
// stream holds the outcome subjects, the error is an overlap
// (ErrStreamOverlap) that names it and what to do.
func (c *Collector) ensureIntake(ctx context.Context) (jetstream.Consumer, error) {
	name := c.subjects.StreamIntake()
	cfg := jetstream.StreamConfig{
		Name:        name,
		Description: "fleetwatch: outcome events as published, until a collector takes them (durable intake)",
		Subjects:    []string{c.subjects.Outcomes(), c.subjects.OutcomesWildcard()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.settings.IntakeMaxAge,
		MaxBytes:    c.settings.IntakeMaxBytes,
		Replicas:    c.settings.StreamReplicas,
	}
	stream, err := c.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		var bindErr error
		if stream, bindErr = c.js.Stream(ctx, name); bindErr != nil {
			// The server's answer to the creation, not "not found".
			return nil, c.streamError(ctx, c.js, name, err)
		}
		c.settings.Logf("collector: using stream %s as configured (update refused: %v)", name, err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       fleetwatch.QueueCollectors,
		Description:   "fleetwatch collectors",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       intakeAckWait,
		MaxAckPending: intakeMaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("collector: intake stream %s: consumer %s: %w", name, fleetwatch.QueueCollectors, err)
	}
	return cons, nil
}

// consumeIntake starts Subscriptions pullers on the intake consumer, each
// decoding on its own goroutine with its worker.
func (c *Collector) consumeIntake() ([]*worker, error) {
	var workers []*worker
	for i := 0; i < c.settings.Subscriptions; i++ {
		w := newWorker(c)
		cc, err := c.intake.Consume(w.onIntakeMsg, jetstream.PullMaxMessages(intakePull))
		if err != nil {
			for _, w := range workers {
				w.cc.Stop()
			}
			return nil, fmt.Errorf("collector: consume %s: %w", c.subjects.StreamIntake(), err)
		}
		w.cc = cc
		workers = append(workers, w)
	}
	return workers, nil
}

// onIntakeMsg decodes one stored message, stamped with the time the stream
// stored it (the protocol's arrival time for a replayed event), and
// acknowledges it: it leaves the work queue.
func (w *worker) onIntakeMsg(msg jetstream.Msg) {
	arrival := w.c.settings.Now()
	if meta, err := msg.Metadata(); err == nil {
		arrival = meta.Timestamp
	}
	w.handle(msg.Subject(), msg.Data(), arrival)
	if err := msg.Ack(); err != nil {
		w.c.m.intakeAckErrors.Inc()
	}
}

// intakeLossEvery is how often the intake's losses are counted.
const intakeLossEvery = 5 * time.Second

// intakeLossLoop counts, every intakeLossEvery until ctx ends, the intake
// messages that left the stream without ever being delivered (see
// countIntakeLoss); Run counts once more before it consumes.
func (c *Collector) intakeLossLoop(ctx context.Context) {
	t := time.NewTicker(intakeLossEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.closed:
			return
		case <-t.C:
		}
		c.countIntakeLoss(ctx)
	}
}

// countIntakeLoss counts the messages FW_INTAKE discarded before any
// collector took them. The consumer delivers in stream order and skips
// only messages that are gone, so every sequence up to its last delivered
// one was delivered; a sequence above it and below the stream's first one
// left the stream undelivered: discarded by IntakeMaxAge or IntakeMaxBytes
// (or removed by an operator). The stream is read before the consumer (an
// acknowledged message leaves a work queue too, so the other order would
// count deliveries as losses): a delivery in between can only make the
// count smaller, never count a delivered message. Run counts before it
// consumes, which is exact for what was discarded while no collector ran;
// the periodic count while collectors run may miss a loss that the
// consumer overtook between the two reads. Every collector follows the
// high-water mark; only the one CountsIntakeLoss names adds to the
// counter.
func (c *Collector) countIntakeLoss(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := c.js.Stream(rctx, c.subjects.StreamIntake())
	if err != nil {
		return
	}
	first := stream.CachedInfo().State.FirstSeq
	ci, err := c.intake.Info(rctx)
	if err != nil {
		return
	}
	gone := uint64(0)
	if first > 0 {
		gone = first - 1 // the highest sequence no longer in the stream
	}
	from := max(ci.Delivered.Stream, c.intakeLossMark)
	if gone <= from {
		return
	}
	c.intakeLossMark = gone
	if c.settings.CountsIntakeLoss == nil || c.settings.CountsIntakeLoss() {
		c.m.intakeLost.Add(int(gone - from))
		c.settings.Logf("collector: %d outcome messages left %s undelivered (its max_age or max_bytes discarded them while no collector took them); counted in fleetwatch_intake_lost_messages_total",
			gone-from, c.subjects.StreamIntake())
	}
}
