package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// Sentinel errors of the publisher.
var (
	// ErrInvalidSnapshot is returned for a snapshot that is not published
	// because every watcher would drop it: nil, or one that fails
	// fleetwatch.Snapshot.Validate (whose error it also wraps).
	ErrInvalidSnapshot = errors.New("feed: invalid snapshot")
	// ErrPublish wraps a failure to publish on the decisions subject.
	ErrPublish = errors.New("feed: publish failed")
	// ErrKVPut wraps a failure to put the snapshot in the KV bucket; the
	// snapshot was still published on its subject.
	ErrKVPut = errors.New("feed: kv put failed")
)

// defaultKVTimeout bounds a KV put when the caller's context has no deadline,
// so that a slow JetStream never holds up the heartbeat for long.
const defaultKVTimeout = 2 * time.Second

// PublisherSettings configures a Publisher. The zero value publishes under
// the default prefix with a KV bucket when JetStream is available.
type PublisherSettings struct {
	// Prefix is the subject prefix. If empty, fleetwatch.DefaultPrefix.
	Prefix string
	// NoKV publishes on subjects only, even when JetStream is available.
	NoKV bool
	// KVReplicas is the replica count of the decisions bucket when it is
	// created. If zero, 1 is used (a single server); use 3 on a cluster.
	KVReplicas int
	// Metrics receives the publisher's counters. If nil, a private set is
	// used (see Metrics).
	Metrics *metrics.Set
	// Logf receives operational messages (KV availability, put failures).
	// If nil, nothing is logged.
	Logf func(format string, args ...any)
}

// Publisher publishes decision snapshots: JSON on fw.decisions.<pool> and the
// last value per pool in the fw_decisions KV bucket (PROTOCOL.md "Decision
// snapshot"). It is safe for concurrent use.
type Publisher struct {
	nc       *nats.Conn
	subjects fleetwatch.Subjects
	kv       jetstream.KeyValue // nil: subjects only
	logf     func(format string, args ...any)
	set      *metrics.Set

	published   *metrics.Counter
	publishErrs *metrics.Counter
	kvPutErrs   *metrics.Counter
}

// NewPublisher returns a Publisher on nc. Unless s.NoKV, it detects JetStream
// and creates (or binds) the decisions bucket with history 1; without
// JetStream it logs that routers starting late will wait for the next
// heartbeat, and publishes on subjects only. An error is returned only for
// an unusable prefix or a JetStream failure other than "not enabled".
func NewPublisher(ctx context.Context, nc *nats.Conn, s PublisherSettings) (*Publisher, error) {
	if s.Prefix != "" {
		if err := fleetwatch.ValidatePrefix(s.Prefix); err != nil {
			return nil, fmt.Errorf("feed: %w", err)
		}
	}
	p := &Publisher{
		nc:       nc,
		subjects: fleetwatch.Subjects{Prefix: s.Prefix},
		logf:     s.Logf,
		set:      s.Metrics,
	}
	if p.logf == nil {
		p.logf = func(string, ...any) {}
	}
	if p.set == nil {
		p.set = metrics.NewSet()
	}
	p.published = p.set.GetOrCreateCounter("fleetwatch_decisions_published_total")
	p.publishErrs = p.set.GetOrCreateCounter("fleetwatch_decisions_publish_errors_total")
	p.kvPutErrs = p.set.GetOrCreateCounter("fleetwatch_kv_put_errors_total")
	kvGauge := p.set.GetOrCreateGauge("fleetwatch_decisions_kv", nil)

	if s.NoKV {
		p.logf("feed: decisions KV disabled; publishing on %s only", p.subjects.DecisionsWildcard())
		kvGauge.Set(0)
		return p, nil
	}
	replicas := s.KVReplicas
	if replicas <= 0 {
		replicas = 1
	}
	kv, err := openDecisionsBucket(ctx, nc, p.subjects.BucketDecisions(), replicas)
	switch {
	case errors.Is(err, errNoJetStream):
		p.logf("feed: JetStream not available; publishing on %s only (late routers wait for the next heartbeat)",
			p.subjects.DecisionsWildcard())
		kvGauge.Set(0)
		return p, nil
	case err != nil:
		return nil, err
	}
	p.kv = kv
	kvGauge.Set(1)
	return p, nil
}

// errNoJetStream reports that the server (or account) has no JetStream.
var errNoJetStream = errors.New("feed: jetstream not available")

// jetStreamAvailable asks the server for the account's JetStream info:
// without JetStream the request has no responders or answers "not enabled".
func jetStreamAvailable(ctx context.Context, js jetstream.JetStream) error {
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return errNoJetStream
		}
		return fmt.Errorf("feed: jetstream account info: %w", err)
	}
	return nil
}

// openDecisionsBucket creates the decisions bucket, or binds it when it
// exists with another configuration (replicas set by an operator, say).
func openDecisionsBucket(ctx context.Context, nc *nats.Conn, bucket string, replicas int) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("feed: jetstream: %w", err)
	}
	if err := jetStreamAvailable(ctx, js); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "fleetwatch: last decision snapshot per pool",
		History:     1,
		Replicas:    replicas,
	})
	if err == nil {
		return kv, nil
	}
	// An existing bucket whose configuration we may not change (for
	// example its replica count): use it as it is.
	if kv, bindErr := js.KeyValue(ctx, bucket); bindErr == nil {
		return kv, nil
	}
	return nil, fmt.Errorf("feed: decisions bucket %s: %w", bucket, err)
}

// KV reports whether snapshots are also put in the KV bucket.
func (p *Publisher) KV() bool { return p.kv != nil }

// Metrics returns the set holding the publisher's counters (the one given in
// PublisherSettings, or the private one).
func (p *Publisher) Metrics() *metrics.Set { return p.set }

// Publish publishes snap as JSON on its pool's decisions subject and puts it
// in the KV bucket under the pool id. The subject comes first and a KV
// failure does not undo it: a router following the subject is never held
// back by JetStream. The returned error wraps ErrInvalidSnapshot when snap
// fails fleetwatch.Snapshot.Validate (nothing was sent), else ErrPublish or
// ErrKVPut (or both). When ctx has no deadline, the KV put is bounded by 2 s.
func (p *Publisher) Publish(ctx context.Context, snap *fleetwatch.Snapshot) error {
	if snap == nil {
		return fmt.Errorf("%w: nil", ErrInvalidSnapshot)
	}
	if err := snap.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSnapshot, err)
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("%w: pool %s: encode: %w", ErrInvalidSnapshot, snap.Pool, err)
	}
	var publishErr error
	subject := p.subjects.Decisions(snap.Pool)
	if err := p.nc.Publish(subject, data); err != nil {
		p.publishErrs.Inc()
		publishErr = fmt.Errorf("%w: %s: %w", ErrPublish, subject, err)
	} else {
		p.published.Inc()
	}
	if p.kv == nil {
		return publishErr
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultKVTimeout)
		defer cancel()
	}
	if _, err := p.kv.Put(ctx, snap.Pool, data); err != nil {
		p.kvPutErrs.Inc()
		return errors.Join(publishErr, fmt.Errorf("%w: bucket %s key %s: %w", ErrKVPut, p.subjects.BucketDecisions(), snap.Pool, err))
	}
	return publishErr
}
