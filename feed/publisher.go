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

// defaultKVTimeout bounds one KV put, and defaultKVEvery spaces the puts of
// a pool whose decisions do not change.
const (
	defaultKVTimeout = 2 * time.Second
	defaultKVEvery   = 2 * time.Second
)

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
	// KVEvery is how often a pool's snapshot is put in the decisions
	// bucket while its decisions do not change (a change is put at once).
	// If zero, 2s; negative puts every snapshot.
	KVEvery time.Duration
	// Compact tunes the compact feed (fw.feed.<pool>, the fw_feed bucket).
	Compact CompactSettings
}

// Publisher publishes decision snapshots: JSON on fw.decisions.<pool> and the
// last value per pool in the fw_decisions KV bucket (PROTOCOL.md "Decision
// snapshot"), and the compact feed that fleetwatch's routers follow:
// frames on fw.feed.<pool> and the last key frame per pool in the fw_feed
// bucket (PROTOCOL.md "Compact feed (extension)"). It is safe for
// concurrent use.
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
	kvEvery    time.Duration
	compact    CompactSettings
	feedKV     jetstream.KeyValue // the fw_feed bucket; nil with kv

	// mu guards the per-pool state: the compact encoders, and when each
	// pool's snapshot was last queued for the KV.
	mu      sync.Mutex
	pools   map[string]*pubPool
	sweptAt time.Time

	published    *metrics.Counter
	publishErrs  *metrics.Counter
	kvPutErrs    *metrics.Counter
	kvPuts       *metrics.Counter
	kvSuperseded *metrics.Counter
	kvFenced     *metrics.Counter
	truncated    *metrics.Counter
	keyFrames    *metrics.Counter
	loadFrames   *metrics.Counter
	feedBytes    *metrics.Counter
	feedErrs     *metrics.Counter

	// kvMu guards the KV queue: pending holds the latest unput value of
	// each key, order the keys in the order they were queued (each once),
	// and done is closed when the running worker exits (nil when none
	// runs); revs the revision and fence of each key's value as this
	// publisher last put it (the worker's only).
	kvMu      sync.Mutex
	kvPending map[kvKey]queued
	kvOrder   []kvKey
	kvDone    chan struct{}
	revs      map[kvKey]stored
}

// pubPool is the publisher's state of one pool.
type pubPool struct {
	enc    *CompactEncoder
	buf    []byte    // the last frame, reused
	kvAt   time.Time // when its snapshot was last queued for the KV
	queued bool      // a snapshot was queued for the KV
	usedAt time.Time // its last Publish
}

// poolIdle is how long a pool goes without a Publish before the publisher
// forgets it (a retired pool): its next snapshot starts with a key frame.
const poolIdle = time.Minute

// kvKey names a KV value: a pool's key in the decisions bucket, or with
// feed in the fw_feed bucket.
type kvKey struct {
	pool string
	feed bool
}

// stored is a value this publisher put: its revision and fence.
type stored struct {
	rev, fence uint64
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
		kvEvery:    s.KVEvery,
		compact:    s.Compact.withDefaults(),
		pools:      map[string]*pubPool{},
		kvPending:  make(map[kvKey]queued),
		revs:       map[kvKey]stored{},
	}
	if p.kvTimeout <= 0 {
		p.kvTimeout = defaultKVTimeout
	}
	if p.kvEvery == 0 {
		p.kvEvery = defaultKVEvery
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
	p.keyFrames = p.set.GetOrCreateCounter(`fleetwatch_feed_frames_published_total{kind="key"}`)
	p.loadFrames = p.set.GetOrCreateCounter(`fleetwatch_feed_frames_published_total{kind="loads"}`)
	p.feedBytes = p.set.GetOrCreateCounter("fleetwatch_feed_frame_bytes_total")
	p.feedErrs = p.set.GetOrCreateCounter("fleetwatch_feed_frame_errors_total")
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
	kv, err := openBucket(ctx, nc, p.subjects.BucketDecisions(), "fleetwatch: last decision snapshot per pool", replicas)
	if err == nil {
		p.feedKV, err = openBucket(ctx, nc, p.subjects.BucketFeed(), "fleetwatch: last compact feed key frame per pool", replicas)
	}
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

// Ensure creates the decisions and feed buckets again if the server lost
// them (it came back with an empty store, or an operator deleted them); a
// bucket that exists is left as it is, and the handles in use stay valid
// (they name the buckets). A daemon calls it after every reconnect;
// without the KV it does nothing.
func (p *Publisher) Ensure(ctx context.Context) error {
	if p.kv == nil {
		return nil
	}
	_, err := openBucket(ctx, p.nc, p.subjects.BucketDecisions(), "fleetwatch: last decision snapshot per pool", p.replicas)
	if err == nil {
		_, err = openBucket(ctx, p.nc, p.subjects.BucketFeed(), "fleetwatch: last compact feed key frame per pool", p.replicas)
	}
	p.kvMu.Lock()
	clear(p.revs) // a new store: read back before the next fenced put
	p.kvMu.Unlock()
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

// openBucket creates a bucket of the last value per pool, or binds it when
// it exists with another configuration (replicas set by an operator, say).
func openBucket(ctx context.Context, nc *nats.Conn, bucket, description string, replicas int) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("feed: jetstream: %w", err)
	}
	if err := jetStreamAvailable(ctx, js); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: description,
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
	return nil, fmt.Errorf("feed: bucket %s: %w", bucket, err)
}

// KV reports whether snapshots are also put in the KV bucket.
func (p *Publisher) KV() bool { return p.kv != nil }

// Metrics returns the set holding the publisher's counters (the one given in
// PublisherSettings, or the private one).
func (p *Publisher) Metrics() *metrics.Set { return p.set }

// Publish publishes a decision snapshot: JSON on its pool's decisions
// subject, and its compact frame (a key frame when its decisions changed
// or the last key frame is CompactSettings.KeyEvery old, else a load
// frame) on the pool's feed subject; it queues the JSON for the KV bucket
// when its decisions changed or the pool's last put is KVEvery old, and a
// key frame for the feed bucket (see Publisher). The subjects come first,
// and a KV failure never undoes them or holds them back: failed puts are
// counted (fleetwatch_kv_put_errors_total) and logged, and a later
// snapshot of the pool is put again. When the encoded snapshot exceeds the
// server's max_payload, Publish sends it truncated (Snapshot.Truncated and
// BackendsTotal; see truncate) and counts it
// (fleetwatch_decisions_truncated_total); the compact frame is not
// truncated. The returned error wraps ErrInvalidSnapshot (nothing was
// sent) or ErrPublish. ctx is not used by the asynchronous put; it is kept
// for callers that pass one.
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

	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.sweep(now)
	pp := p.pool(snap.Pool)
	pp.usedAt = now
	var kind byte
	var changed bool
	pp.buf, kind, changed = pp.enc.Frame(pp.buf[:0], snap, now)
	if err := p.publishFrame(snap.Pool, pp.buf, kind); err != nil && publishErr == nil {
		publishErr = err
	}
	if p.kv == nil {
		return publishErr
	}
	if kind == FrameKey {
		p.queuePut(kvKey{pool: snap.Pool, feed: true}, queued{data: slices.Clone(pp.buf), fence: snap.Fence})
	}
	if changed || !pp.queued || p.kvEvery < 0 || now.Sub(pp.kvAt) >= p.kvEvery {
		pp.kvAt, pp.queued = now, true
		p.queuePut(kvKey{pool: snap.Pool}, queued{data: data, fence: snap.Fence})
	}
	return publishErr
}

// PublishLoads publishes the load frame of a load beat's snapshot (one
// that repeats the seq of the pool's last Publish, with its loads now) on
// the pool's feed subject: only the loads and EWMAs that moved. It sends
// nothing when the pool has no key frame to base it on (nothing was
// published for it yet, or its decisions changed since: their Publish
// comes first). The error wraps ErrPublish.
func (p *Publisher) PublishLoads(snap *fleetwatch.Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pools[snap.Pool]
	if pp == nil {
		return nil
	}
	var ok bool
	if pp.buf, ok = pp.enc.Loads(pp.buf[:0], snap); !ok {
		return nil
	}
	return p.publishFrame(snap.Pool, pp.buf, FrameLoads)
}

// WantKey makes pool's next Publish send a key frame (routers that missed
// frames asked for one: fw.resync.<pool>); it reports whether the
// publisher publishes the pool.
func (p *Publisher) WantKey(pool string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pools[pool]
	if pp == nil {
		return false
	}
	pp.enc.WantKey()
	return true
}

// pool returns the publisher's state of a pool, made on first use. mu is
// held.
func (p *Publisher) pool(id string) *pubPool {
	pp := p.pools[id]
	if pp == nil {
		pp = &pubPool{enc: NewCompactEncoder(p.compact)}
		p.pools[id] = pp
	}
	return pp
}

// sweep forgets the pools not published for poolIdle, once per poolIdle.
// mu is held.
func (p *Publisher) sweep(now time.Time) {
	if now.Sub(p.sweptAt) < poolIdle {
		return
	}
	p.sweptAt = now
	for id, pp := range p.pools {
		if now.Sub(pp.usedAt) >= poolIdle {
			delete(p.pools, id)
		}
	}
}

// Forget drops the publisher's state of pools no longer published here
// (retired, or owned by another instance now): their next snapshot starts
// with a key frame.
func (p *Publisher) Forget(drop func(pool string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.pools {
		if drop(id) {
			delete(p.pools, id)
		}
	}
}

// publishFrame sends a compact frame on pool's feed subject.
func (p *Publisher) publishFrame(pool string, frame []byte, kind byte) error {
	subject := p.subjects.Feed(pool)
	if limit := p.nc.MaxPayload(); limit > 0 && int64(len(frame)) > limit {
		p.feedErrs.Inc()
		return fmt.Errorf("%w: %s: a %d-byte frame is over the server's max_payload %d", ErrPublish, subject, len(frame), limit)
	}
	if err := p.nc.Publish(subject, frame); err != nil {
		p.feedErrs.Inc()
		return fmt.Errorf("%w: %s: %w", ErrPublish, subject, err)
	}
	if kind == FrameKey {
		p.keyFrames.Inc()
	} else {
		p.loadFrames.Inc()
	}
	p.feedBytes.Add(len(frame))
	return nil
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

// queued is a value waiting for its KV put: its encoding and its fence.
type queued struct {
	data  []byte
	fence uint64
}

// bucket returns the bucket handle and name of a key.
func (p *Publisher) bucket(k kvKey) (jetstream.KeyValue, string) {
	if k.feed {
		return p.feedKV, p.subjects.BucketFeed()
	}
	return p.kv, p.subjects.BucketDecisions()
}

// queuePut queues q as the key's latest value, replacing a queued one,
// and starts the worker when none runs.
func (p *Publisher) queuePut(k kvKey, q queued) {
	p.kvMu.Lock()
	defer p.kvMu.Unlock()
	if _, queued := p.kvPending[k]; queued {
		p.kvSuperseded.Inc()
	} else {
		p.kvOrder = append(p.kvOrder, k)
	}
	p.kvPending[k] = q
	if p.kvDone == nil {
		p.kvDone = make(chan struct{})
		go p.putLoop(p.kvDone)
	}
}

// putLoop puts the queued values, oldest queued key first, until the
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
		k := p.kvOrder[0]
		p.kvOrder = p.kvOrder[1:]
		q := p.kvPending[k]
		delete(p.kvPending, k)
		p.kvMu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), p.kvTimeout)
		err := p.put(ctx, k, q)
		cancel()
		_, bucket := p.bucket(k)
		switch {
		case errors.Is(err, errFenced):
			p.kvFenced.Inc()
			p.logf("feed: bucket %s key %s: not put: %v", bucket, k.pool, err)
		case err != nil:
			p.kvPutErrs.Inc()
			if !failing {
				p.logf("feed: %v: bucket %s key %s: %v (counted in fleetwatch_kv_put_errors_total; logged once until a put succeeds)",
					ErrKVPut, bucket, k.pool, err)
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

// put writes q under k. An unfenced value is put as it is. A fenced one is
// written only over a value whose fence is not higher, by a
// compare-and-set on the key's revision (KV Update, or Create when there is
// no value), so that an instance that lost the pool's partition cannot
// overwrite its new owner's value, even in a race. The revision this
// publisher last wrote is kept, so that a steady owner's put is one
// request; a value written by another since makes the update fail, and the
// put reads the stored value back to check its fence.
func (p *Publisher) put(ctx context.Context, k kvKey, q queued) error {
	kv, _ := p.bucket(k)
	if q.fence == 0 {
		_, err := kv.Put(ctx, k.pool, q.data)
		return err
	}
	p.kvMu.Lock()
	last, ok := p.revs[k]
	delete(p.revs, k)
	p.kvMu.Unlock()
	var rev uint64
	var err error
	if ok && last.fence <= q.fence {
		if rev, err = kv.Update(ctx, k.pool, q.data, last.rev); err == nil {
			p.remember(k, rev, q.fence)
			return nil
		}
	}
	e, err := kv.Get(ctx, k.pool)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err = kv.Create(ctx, k.pool, q.data)
	case err != nil:
		return err
	default:
		if fence, ok := fenceOf(e.Value(), k.feed); ok && fence > q.fence {
			return fmt.Errorf("%w: fence %d stored, %d here", errFenced, fence, q.fence)
		}
		rev, err = kv.Update(ctx, k.pool, q.data, e.Revision())
	}
	if err == nil {
		p.remember(k, rev, q.fence)
	}
	return err
}

func (p *Publisher) remember(k kvKey, rev, fence uint64) {
	p.kvMu.Lock()
	p.revs[k] = stored{rev: rev, fence: fence}
	p.kvMu.Unlock()
}

// fenceOf reads the fence of a stored value: a JSON snapshot's, or with
// key a key frame's.
func fenceOf(data []byte, key bool) (uint64, bool) {
	if key {
		snap, _, err := DecodeKey(data, "p")
		if err != nil {
			return 0, false
		}
		return snap.Fence, true
	}
	var stored struct {
		Fence uint64 `json:"fence"`
	}
	if json.Unmarshal(data, &stored) != nil {
		return 0, false
	}
	return stored.Fence, true
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
