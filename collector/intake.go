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
		if stream, err = c.js.Stream(ctx, name); err != nil {
			return fmt.Errorf("collector: intake stream %s: %w", name, err)
		}
		c.settings.Logf("collector: using stream %s as configured (update refused)", name)
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
		return fmt.Errorf("collector: intake stream %s: consumer %s: %w", name, fleetwatch.QueueCollectors, err)
	}
	c.intake = cons
	return nil
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
