package feed

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
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
	// ErrKVPut names a failure to put a snapshot in the KV bucket in the
	// log; the put is asynchronous, so Publish does not return it (the
	// snapshot was still published on its subject).
	ErrKVPut = errors.New("feed: kv put failed")
)

// defaultKVTimeout bounds one KV put.
const defaultKVTimeout = 2 * time.Second

// payloadHeadroom is kept free below the server's max_payload for what a
// KV put adds to the snapshot (headers).
const payloadHeadroom = 512

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
	// Configured reports whether a backend is in the configuration: when a
	// snapshot must be truncated to fit the server's max_payload, open and
	// half_open backends are kept first, then configured ones, then the
	// busiest. If nil, no backend counts as configured.
	Configured func(pool, backend string) bool
	// KVTimeout bounds one KV put. If zero, 2s is used.
	KVTimeout time.Duration
}

// Publisher publishes decision snapshots: JSON on fw.decisions.<pool> and the
// last value per pool in the fw_decisions KV bucket (PROTOCOL.md "Decision
// snapshot"). It is safe for concurrent use.
//
// The subject publish is synchronous (nats.go buffers it); the KV put is
// not: Publish queues the snapshot and a worker goroutine, started when
// there is something to put and ending when the queue is empty, puts the
// queued snapshots one at a time. The queue keeps only the latest snapshot
// of each pool (the KV holds only the last value anyway), so it is bounded
// by the number of pools, and a slow JetStream or a flood of pools delays
// the KV, never the next Publish. Flush waits for the queue to empty.
type Publisher struct {
	nc         *nats.Conn
	subjects   fleetwatch.Subjects
	kv         jetstream.KeyValue // nil: subjects only
	replicas   int                // of the decisions bucket, when it is created
	logf       func(format string, args ...any)
	set        *metrics.Set
	configured func(pool, backend string) bool
	kvTimeout  time.Duration

	published    *metrics.Counter
	publishErrs  *metrics.Counter
	kvPutErrs    *metrics.Counter
	kvPuts       *metrics.Counter
	kvSuperseded *metrics.Counter
	kvFenced     *metrics.Counter
	truncated    *metrics.Counter

	// kvMu guards the KV queue: pending holds the latest unput snapshot
	// of each pool, order the pools in the order they were queued (each
	// once), and done is closed when the running worker exits (nil when
	// none runs).
	kvMu      sync.Mutex
	kvPending map[string]queued
	kvOrder   []string
	kvDone    chan struct{}
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
		nc:         nc,
		subjects:   fleetwatch.Subjects{Prefix: s.Prefix},
		logf:       s.Logf,
		set:        s.Metrics,
		configured: s.Configured,
		kvTimeout:  s.KVTimeout,
		kvPending:  make(map[string]queued),
	}
	if p.kvTimeout <= 0 {
		p.kvTimeout = defaultKVTimeout
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
	p.kvPuts = p.set.GetOrCreateCounter("fleetwatch_kv_puts_total")
	p.kvSuperseded = p.set.GetOrCreateCounter("fleetwatch_kv_put_superseded_total")
	p.kvFenced = p.set.GetOrCreateCounter("fleetwatch_kv_put_fenced_total")
	p.truncated = p.set.GetOrCreateCounter("fleetwatch_decisions_truncated_total")
	p.set.GetOrCreateGauge("fleetwatch_kv_put_queue", func() float64 {
		p.kvMu.Lock()
		defer p.kvMu.Unlock()
		return float64(len(p.kvPending))
	})
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
	p.replicas = replicas
	kvGauge.Set(1)
	return p, nil
}

// Ensure creates the decisions bucket again if the server lost it (it came
// back with an empty store, or an operator deleted it); a bucket that
// exists is left as it is, and the handle in use stays valid (it names the
// bucket). A daemon calls it after every reconnect; without the KV it does
// nothing.
func (p *Publisher) Ensure(ctx context.Context) error {
	if p.kv == nil {
		return nil
	}
	_, err := openDecisionsBucket(ctx, p.nc, p.subjects.BucketDecisions(), p.replicas)
	return err
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

// Publish publishes snap as JSON on its pool's decisions subject and queues
// it for the KV bucket under the pool id (see Publisher). The subject comes
// first, and a KV failure never undoes it or holds it back: failed puts are
// counted (fleetwatch_kv_put_errors_total) and logged, and the next
// snapshot of the pool is put again. When the encoded snapshot exceeds the
// server's max_payload, Publish sends it truncated (Snapshot.Truncated and
// BackendsTotal; see truncate) and counts it
// (fleetwatch_decisions_truncated_total). The returned error wraps
// ErrInvalidSnapshot (nothing was sent) or ErrPublish. ctx is not used by
// the asynchronous put; it is kept for callers that pass one.
func (p *Publisher) Publish(ctx context.Context, snap *fleetwatch.Snapshot) error {
	_ = ctx
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
	if limit := p.nc.MaxPayload() - payloadHeadroom; p.nc.MaxPayload() > 0 && int64(len(data)) > limit {
		full := len(data)
		if data, err = p.truncate(snap, int(limit)); err != nil {
			p.publishErrs.Inc()
			return fmt.Errorf("%w: pool %s: %w", ErrPublish, snap.Pool, err)
		}
		p.truncated.Inc()
		p.logf("feed: snapshot of pool %s is %d bytes, over the server's max_payload %d: published truncated to %d bytes",
			snap.Pool, full, p.nc.MaxPayload(), len(data))
	}
	var publishErr error
	subject := p.subjects.Decisions(snap.Pool)
	if err := p.nc.Publish(subject, data); err != nil {
		p.publishErrs.Inc()
		publishErr = fmt.Errorf("%w: %s: %w", ErrPublish, subject, err)
	} else {
		p.published.Inc()
	}
	if p.kv != nil {
		p.queuePut(snap.Pool, queued{data: data, fence: snap.Fence})
	}
	return publishErr
}

// errTooSmall reports a max_payload too small for a snapshot without
// backends.
var errTooSmall = errors.New("max_payload too small for an empty snapshot")

// truncate encodes snap with as many backends as fit in limit bytes,
// keeping those that matter most: open and half_open first (a router must
// not send to them), then configured ones, then by requests in the window
// (then by id, for a stable choice). The kept backends stay sorted by id,
// and the snapshot says it is truncated and how many backends the pool has.
func (p *Publisher) truncate(snap *fleetwatch.Snapshot, limit int) ([]byte, error) {
	n := len(snap.Backends)
	rank := make([]int, n) // indices of snap.Backends, most important first
	for i := range rank {
		rank[i] = i
	}
	configured := func(b *fleetwatch.Backend) bool {
		return p.configured != nil && p.configured(snap.Pool, b.Backend)
	}
	slices.SortFunc(rank, func(x, y int) int {
		bx, by := &snap.Backends[x], &snap.Backends[y]
		if c := cmp.Compare(tripped(bx), tripped(by)); c != 0 {
			return -c
		}
		if c := cmp.Compare(b2i(configured(bx)), b2i(configured(by))); c != 0 {
			return -c
		}
		if c := cmp.Compare(bx.Requests, by.Requests); c != 0 {
			return -c
		}
		return cmp.Compare(bx.Backend, by.Backend)
	})
	out := *snap
	out.Truncated, out.BackendsTotal = true, n
	encode := func(k int) ([]byte, error) {
		keep := slices.Clone(rank[:k])
		slices.Sort(keep) // snap.Backends is sorted by id
		out.Backends = make([]fleetwatch.Backend, k)
		for i, idx := range keep {
			out.Backends[i] = snap.Backends[idx]
		}
		return json.Marshal(&out)
	}
	// The largest k whose encoding fits, by bisection: lo fits, hi does not.
	best, err := encode(0)
	if err != nil {
		return nil, err
	}
	if len(best) > limit {
		return nil, fmt.Errorf("%w (%d bytes)", errTooSmall, limit+payloadHeadroom)
	}
	lo, hi := 0, n
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		data, err := encode(mid)
		if err != nil {
			return nil, err
		}
		if len(data) <= limit {
			lo, best = mid, data
		} else {
			hi = mid
		}
	}
	return best, nil
}

// tripped ranks a backend's state for truncation: open and half_open first.
func tripped(b *fleetwatch.Backend) int {
	if b.State == fleetwatch.StateOpen || b.State == fleetwatch.StateHalfOpen {
		return 1
	}
	return 0
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// queued is a snapshot waiting for its KV put: its encoding and its fence.
type queued struct {
	data  []byte
	fence uint64
}

// queuePut queues q as pool's latest KV value, replacing a queued one,
// and starts the worker when none runs.
func (p *Publisher) queuePut(pool string, data queued) {
	p.kvMu.Lock()
	defer p.kvMu.Unlock()
	if _, queued := p.kvPending[pool]; queued {
		p.kvSuperseded.Inc()
	} else {
		p.kvOrder = append(p.kvOrder, pool)
	}
	p.kvPending[pool] = data
	if p.kvDone == nil {
		p.kvDone = make(chan struct{})
		go p.putLoop(p.kvDone)
	}
}

// putLoop puts the queued snapshots, oldest queued pool first, until the
// queue is empty; then it closes done and returns.
func (p *Publisher) putLoop(done chan struct{}) {
	defer close(done)
	failing := false
	for {
		p.kvMu.Lock()
		if len(p.kvOrder) == 0 {
			p.kvOrder = nil // let a grown array go
			p.kvDone = nil
			p.kvMu.Unlock()
			return
		}
		pool := p.kvOrder[0]
		p.kvOrder = p.kvOrder[1:]
		q := p.kvPending[pool]
		delete(p.kvPending, pool)
		p.kvMu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), p.kvTimeout)
		err := p.put(ctx, pool, q)
		cancel()
		switch {
		case errors.Is(err, errFenced):
			p.kvFenced.Inc()
			p.logf("feed: bucket %s key %s: not put: %v", p.subjects.BucketDecisions(), pool, err)
		case err != nil:
			p.kvPutErrs.Inc()
			if !failing {
				p.logf("feed: %v: bucket %s key %s: %v (counted in fleetwatch_kv_put_errors_total; logged once until a put succeeds)",
					ErrKVPut, p.subjects.BucketDecisions(), pool, err)
			}
			failing = true
		default:
			p.kvPuts.Inc()
			failing = false
		}
	}
}

// errFenced reports a KV put refused because the stored snapshot has a
// higher fence: a newer owner of the pool's partition wrote it.
var errFenced = errors.New("a newer owner's snapshot is stored (higher fence)")

// put writes q under pool. An unfenced snapshot is put as it is. A fenced
// one is written only over a value whose fence is not higher, by a
// compare-and-set on the key's revision (KV Update, or Create when there is
// no value), so that an instance that lost the pool's partition cannot
// overwrite its new owner's snapshot, even in a race.
func (p *Publisher) put(ctx context.Context, pool string, q queued) error {
	if q.fence == 0 {
		_, err := p.kv.Put(ctx, pool, q.data)
		return err
	}
	e, err := p.kv.Get(ctx, pool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_, err = p.kv.Create(ctx, pool, q.data)
		return err
	}
	if err != nil {
		return err
	}
	var stored struct {
		Fence uint64 `json:"fence"`
	}
	if json.Unmarshal(e.Value(), &stored) == nil && stored.Fence > q.fence {
		return fmt.Errorf("%w: fence %d stored, %d here", errFenced, stored.Fence, q.fence)
	}
	_, err = p.kv.Update(ctx, pool, q.data, e.Revision())
	return err
}

// Flush waits until the KV queue is empty (every queued snapshot put or
// failed), or until ctx ends, and then returns ctx's error. A
// process calls it after its last Publish, before it closes the
// connection.
func (p *Publisher) Flush(ctx context.Context) error {
	for {
		p.kvMu.Lock()
		done := p.kvDone
		p.kvMu.Unlock()
		if done == nil {
			return nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
