package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Sentinel errors of the watcher.
var (
	// ErrMalformed is wrapped by the error describing a snapshot the
	// watcher ignored.
	ErrMalformed = errors.New("feed: malformed snapshot")
	// ErrRunning is returned by Watcher.Run while another Run runs.
	ErrRunning = errors.New("feed: watcher already running")
	// ErrClosed is returned by Watcher.Run after Close.
	ErrClosed = errors.New("feed: watcher closed")
	// ErrWatcherRunning is ErrRunning.
	//
	// Deprecated: use ErrRunning.
	ErrWatcherRunning = ErrRunning
	// ErrWatcherClosed is ErrClosed.
	//
	// Deprecated: use ErrClosed.
	ErrWatcherClosed = ErrClosed
)

// WatcherSettings configures a Watcher. The zero value follows every pool
// under the default prefix and reads the KV bucket when JetStream is there.
type WatcherSettings struct {
	// Prefix is the subject prefix. If empty, fleetwatch.DefaultPrefix.
	Prefix string
	// Pools lists the pools to follow. If empty, every pool is followed
	// (fw.decisions.> and every key of the bucket).
	Pools []string
	// NoKV follows the subjects only: no KV read at start or on reconnect.
	NoKV bool
	// Now is the clock used for Received and staleness. If nil, time.Now.
	Now func() time.Time
	// OnUpdate is called with every snapshot the watcher applies, after
	// View already returns it, on Run's goroutine, in order, outside any
	// lock. The snapshot is shared: do not modify it. If nil, nothing is
	// called.
	OnUpdate func(*fleetwatch.Snapshot)
	// Buffer is how many snapshot messages may wait for Run's goroutine
	// before nats.go drops them (counted). If zero, 4096 is used.
	Buffer int
	// Metrics receives the watcher's counters. If nil, a private set.
	Metrics *metrics.Set
	// Logf receives operational messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Compact follows the compact feed (fw.feed.<pool>, docs/PROTOCOL.md
	// "Compact feed (extension)") instead of the JSON snapshots when the
	// server has its bucket (fw_feed): key frames are applied as snapshots
	// (OnUpdate; they carry what a router reads, not the reasons or the
	// counts), load frames through OnLoads. Without the bucket (a serve
	// that does not publish it, or no JetStream) the watcher follows the
	// JSON snapshots (see watchcompact.go).
	Compact bool
	// OnLoads is called with every load frame the watcher applies in
	// compact mode, on Run's goroutine, in order: the loads and EWMAs that
	// moved since the key frame applied (fit for p2c.Picker.UpdateLoads).
	// u is reused once OnLoads returns. If nil, nothing is called.
	OnLoads func(pool string, u *p2c.LoadUpdate)
}

// View is what a router knows about one pool.
type View struct {
	// Snapshot is the newest snapshot applied; shared and immutable. In
	// compact mode, the key frames that repeat its decisions after it
	// are not applied as snapshots but renew it (Stale) and move the
	// loads (WatcherSettings.OnLoads).
	Snapshot *fleetwatch.Snapshot
	// Received is when the watcher applied it (WatcherSettings.Now).
	Received time.Time
	// Stale reports whether the snapshot is older than at + ttl_ms now
	// (in compact mode, with at the last load frame's based on it); apply
	// Effective(Snapshot, now) rather than Snapshot then.
	Stale bool
}

// watched is the immutable record of one pool's newest snapshot.
type watched struct {
	snap     *fleetwatch.Snapshot
	received time.Time
	// fence is the highest Snapshot.Fence seen for the pool: a snapshot
	// with a lower non-zero fence comes from an instance that lost the
	// pool's partition and is dropped.
	fence uint64
	// heard is the at (unix ns) of the newest load frame based on snap
	// (compact mode), which keeps it fresh.
	heard atomic.Int64
}

// poolSlots maps a pool id to its slot. The map is copied when a pool
// appears (rare) and never modified after it is published; each slot is
// swapped atomically when its pool's snapshot changes (often).
type poolSlots map[string]*atomic.Pointer[watched]

// Watcher follows decision snapshots for a router (the feed client).
//
// Run subscribes to the decision subjects, reads the KV bucket for the
// current state (so a router that starts late, or was disconnected, has it
// at once), and applies each valid snapshot (fleetwatch.Snapshot.Validate)
// that is newer than the one it has (fleetwatch.Snapshot.NewerThan: a
// higher seq within an epoch, a not earlier at across epochs); it counts
// and drops malformed and older ones. After a reconnect nats.go
// re-establishes the subscription and the watcher reads the KV again,
// retrying with backoff while the read fails. Every update happens on
// Run's goroutine; View reads are lock-free.
type Watcher struct {
	nc       *nats.Conn
	settings WatcherSettings // with defaults applied
	subjects fleetwatch.Subjects
	follow   map[string]bool // the pools followed; nil: all

	pools  atomic.Pointer[poolSlots]
	synced chan struct{} // closed after the first KV read (or when there is no KV)

	applied   *metrics.Counter
	older     *metrics.Counter
	fenced    *metrics.Counter
	malformed *metrics.Counter
	dropped   *metrics.Counter
	kvReads   *metrics.Counter
	kvErrors  *metrics.Counter

	loadsApplied *metrics.Counter
	refreshed    *metrics.Counter
	gaps         *metrics.Counter
	keyFetches   *metrics.Counter
	resyncs      *metrics.Counter

	// Run's goroutine only: the mode (also read by Mode), the subscriptions
	// of each feed, the compact feed's state and its key frame fetches.
	mode     atomic.Int32
	jsonSubs []*nats.Subscription
	feedSubs []*nats.Subscription
	feedKV   jetstream.KeyValue
	compact  map[string]*compactPool
	scratch  keyScratch // decodes the key frames refresh may apply
	fetching map[string]bool
	fetched  chan keyResult
	runCtx   context.Context // Run's: the fetches end with it

	// mu guards running and done.
	mu      sync.Mutex
	running bool
	done    chan struct{}
	closed  chan struct{}
	once    sync.Once
}

// NewWatcher returns a Watcher on nc. It does no I/O; Run does.
func NewWatcher(nc *nats.Conn, s WatcherSettings) (*Watcher, error) {
	if nc == nil {
		return nil, errors.New("feed: nil connection")
	}
	if s.Prefix != "" {
		if err := fleetwatch.ValidatePrefix(s.Prefix); err != nil {
			return nil, fmt.Errorf("feed: %w", err)
		}
	}
	w := &Watcher{
		nc:       nc,
		subjects: fleetwatch.Subjects{Prefix: s.Prefix},
		synced:   make(chan struct{}),
		closed:   make(chan struct{}),
	}
	if len(s.Pools) > 0 {
		w.follow = make(map[string]bool, len(s.Pools))
		for _, p := range s.Pools {
			if err := fleetwatch.ValidatePoolID(p); err != nil {
				return nil, fmt.Errorf("feed: %w", err)
			}
			w.follow[p] = true
		}
		s.Pools = append([]string(nil), s.Pools...)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.OnUpdate == nil {
		s.OnUpdate = func(*fleetwatch.Snapshot) {}
	}
	if s.OnLoads == nil {
		s.OnLoads = func(string, *p2c.LoadUpdate) {}
	}
	if s.Buffer <= 0 {
		s.Buffer = 4096
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	w.settings = s
	set := s.Metrics
	w.applied = set.GetOrCreateCounter("fleetwatch_feed_snapshots_applied_total")
	w.older = set.GetOrCreateCounter("fleetwatch_feed_snapshots_older_total")
	w.fenced = set.GetOrCreateCounter("fleetwatch_feed_snapshots_fenced_total")
	w.malformed = set.GetOrCreateCounter("fleetwatch_feed_snapshots_malformed_total")
	w.dropped = set.GetOrCreateCounter("fleetwatch_feed_snapshots_dropped_total")
	w.kvReads = set.GetOrCreateCounter("fleetwatch_feed_kv_reads_total")
	w.kvErrors = set.GetOrCreateCounter("fleetwatch_feed_kv_read_errors_total")
	w.loadsApplied = set.GetOrCreateCounter("fleetwatch_feed_load_frames_applied_total")
	w.refreshed = set.GetOrCreateCounter("fleetwatch_feed_key_frames_refreshed_total")
	w.gaps = set.GetOrCreateCounter("fleetwatch_feed_frame_gaps_total")
	w.keyFetches = set.GetOrCreateCounter("fleetwatch_feed_key_fetches_total")
	w.resyncs = set.GetOrCreateCounter("fleetwatch_feed_resyncs_requested_total")
	set.GetOrCreateGauge("fleetwatch_feed_compact", func() float64 {
		if w.mode.Load() == modeCompact {
			return 1
		}
		return 0
	})
	w.compact = map[string]*compactPool{}
	w.fetching = map[string]bool{}
	w.fetched = make(chan keyResult, maxFetches)
	empty := poolSlots{}
	w.pools.Store(&empty)
	return w, nil
}

// View returns the newest snapshot of pool and whether there is one. It is
// lock-free and allocation-free, for the request path.
func (w *Watcher) View(pool string) (View, bool) {
	slot := (*w.pools.Load())[pool]
	if slot == nil {
		return View{}, false
	}
	e := slot.Load()
	return View{Snapshot: e.snap, Received: e.received, Stale: w.settings.Now().After(staleAt(e.snap, e.heard.Load()))}, true
}

// Compact reports whether the watcher follows the compact feed now
// (WatcherSettings.Compact, and the server has its bucket).
func (w *Watcher) Compact() bool { return w.mode.Load() == modeCompact }

// Pools returns the sorted ids of the pools the watcher has a snapshot of.
func (w *Watcher) Pools() []string {
	m := *w.pools.Load()
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Synced is closed once Run has made its first attempt to read the KV
// bucket: after the read, after finding that there is no bucket or no
// JetStream (or NoKV), or after a failed read, which Run keeps retrying in
// the background. A caller can wait on it for the current state before it
// serves requests without waiting forever on a broken JetStream.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run follows the snapshots until ctx is done or Close is called, and then
// unsubscribes and returns nil. It returns an error when it cannot
// subscribe, ErrRunning while another Run runs, and ErrClosed after Close.
// Run may be called again after a Run returned (until Close); the lifecycle
// is the one of docs/DECISIONS.md "Lifecycles".
func (w *Watcher) Run(ctx context.Context) error {
	w.mu.Lock()
	select {
	case <-w.closed:
		w.mu.Unlock()
		return ErrClosed
	default:
	}
	if w.running {
		w.mu.Unlock()
		return ErrRunning
	}
	w.running = true
	done := make(chan struct{})
	w.done = done
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
		close(done)
	}()

	// Status events first, so that a reconnect during start-up is seen.
	status := w.nc.StatusChanged(nats.CONNECTED)
	defer w.nc.RemoveStatusListener(status)

	msgs := make(chan *nats.Msg, w.settings.Buffer)
	w.runCtx = ctx
	if err := w.subscribeFeeds(ctx, msgs); err != nil {
		return err
	}
	lastDropped := map[*nats.Subscription]int{}
	defer func() {
		w.countDropped(lastDropped)
		unsubscribe(w.jsonSubs)
		unsubscribe(w.feedSubs)
		w.jsonSubs, w.feedSubs, w.feedKV = nil, nil, nil
	}()

	kv := newKVReader(w)
	retry := time.NewTimer(0)
	if !retry.Stop() {
		<-retry.C
	}
	defer retry.Stop()
	readKV := func() {
		if wait, ok := kv.read(ctx); !ok {
			retry.Reset(wait)
		}
		w.markSynced()
	}
	readKV()

	dropTicker := time.NewTicker(time.Second)
	defer dropTicker.Stop()
	var redetect <-chan time.Time
	if w.settings.Compact {
		t := time.NewTicker(feedRedetect)
		defer t.Stop()
		redetect = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.closed:
			return nil
		case msg := <-msgs:
			w.handleMsg(msg)
		case r := <-w.fetched:
			w.fetchedKey(r)
		case <-status:
			w.settings.Logf("feed: reconnected; reading the current decisions again")
			if w.mode.Load() == modeCompact {
				// Frames were lost meanwhile: a key frame of every pool
				// now, asked for (missed).
				for pool, cp := range w.compact {
					if cp.ids != nil {
						w.missed(pool, cp)
					}
				}
				continue
			}
			kv.reset()
			readKV()
		case <-retry.C:
			readKV()
		case <-redetect:
			if w.mode.Load() == modeJSON {
				w.redetect(ctx, msgs)
			}
		case <-dropTicker.C:
			w.countDropped(lastDropped)
		}
	}
}

// subscribeFeeds subscribes to the feed the watcher follows: with Compact,
// the compact feed when the server has its bucket (one request binds it;
// the key frames are read next, by readKV), else the JSON snapshots (it
// looks for the bucket again every feedRedetect). The JSON snapshots of a
// joining router's pools never cross the wire when it follows the compact
// feed.
func (w *Watcher) subscribeFeeds(ctx context.Context, msgs chan *nats.Msg) error {
	w.mode.Store(modeJSON)
	if w.settings.Compact {
		bctx, cancel := context.WithTimeout(ctx, kvReadTimeout)
		kv, err := w.bindFeed(bctx)
		cancel()
		if err == nil {
			if w.feedSubs, err = w.subscribe(msgs, w.subjects.FeedWildcard(), w.subjects.Feed); err != nil {
				return err
			}
			w.feedKV = kv
			w.mode.Store(modeCompact)
			w.settings.Logf("feed: following the compact feed (%s)", w.subjects.FeedWildcard())
			return nil
		}
		w.settings.Logf("feed: following the JSON snapshots (%s): no compact feed: %v", w.subjects.DecisionsWildcard(), err)
	}
	var err error
	w.jsonSubs, err = w.subscribe(msgs, w.subjects.DecisionsWildcard(), w.subjects.Decisions)
	return err
}

// redetect looks for the fw_feed bucket while the watcher follows the JSON
// snapshots though asked for the compact feed (the bucket was missing),
// and switches to the compact feed when it is there: it subscribes to the
// feed, reads the key frames, and then leaves the JSON snapshots.
func (w *Watcher) redetect(ctx context.Context, msgs chan *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, kvReadTimeout)
	defer cancel()
	kv, err := w.bindFeed(ctx)
	if err != nil {
		return
	}
	subs, err := w.subscribe(msgs, w.subjects.FeedWildcard(), w.subjects.Feed)
	if err != nil {
		return
	}
	if err := w.readKeys(ctx, kv); err != nil {
		unsubscribe(subs)
		return
	}
	w.feedSubs, w.feedKV = subs, kv
	w.enterCompact()
}

// enterCompact leaves the JSON snapshots for the compact feed.
func (w *Watcher) enterCompact() {
	w.mode.Store(modeCompact)
	unsubscribe(w.jsonSubs)
	w.jsonSubs = nil
	w.settings.Logf("feed: following the compact feed (%s)", w.subjects.FeedWildcard())
}

func unsubscribe(subs []*nats.Subscription) {
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

func (w *Watcher) markSynced() {
	select {
	case <-w.synced:
	default:
		close(w.synced)
	}
}

// subscribe subscribes to the followed pools' subjects of one feed (the
// wildcard, or each pool's), delivering into msgs.
func (w *Watcher) subscribe(msgs chan *nats.Msg, wildcard string, of func(pool string) string) ([]*nats.Subscription, error) {
	subjects := []string{wildcard}
	if w.follow != nil {
		subjects = subjects[:0]
		for _, p := range w.settings.Pools {
			subjects = append(subjects, of(p))
		}
	}
	var subs []*nats.Subscription
	for _, subject := range subjects {
		sub, err := w.nc.ChanSubscribe(subject, msgs)
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return nil, fmt.Errorf("feed: subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// countDropped adds the messages nats.go dropped on the subscriptions
// since the last call (last holds the counts already added) to the
// dropped metric.
func (w *Watcher) countDropped(last map[*nats.Subscription]int) {
	for _, subs := range [][]*nats.Subscription{w.jsonSubs, w.feedSubs} {
		for _, sub := range subs {
			if n, err := sub.Dropped(); err == nil && n > last[sub] {
				w.dropped.Add(n - last[sub])
				last[sub] = n
			}
		}
	}
}

// handleMsg applies a snapshot received on a decisions subject, or a
// frame of the compact feed; what the mode does not follow (left in the
// buffer when it changed) is dropped.
func (w *Watcher) handleMsg(msg *nats.Msg) {
	mode := w.mode.Load()
	if pool, ok := w.subjects.FeedPool(msg.Subject); ok {
		if mode != modeJSON {
			w.handleFrame(pool, msg.Subject, msg.Data)
		}
		return
	}
	pool, ok := w.subjects.DecisionsPool(msg.Subject)
	if !ok || mode == modeCompact {
		return
	}
	snap, err := decodeSnapshot(msg.Data, pool)
	if err != nil {
		w.malformed.Inc()
		w.settings.Logf("feed: ignoring snapshot on %s: %v", msg.Subject, err)
		return
	}
	w.apply(snap)
}

// apply makes snap the pool's current snapshot when it is newer, and then
// calls OnUpdate. A snapshot whose fence is lower than the highest fence
// seen for the pool is dropped first (counted in
// fleetwatch_feed_snapshots_fenced_total): it comes from an instance that
// lost the pool's partition to another. It runs on Run's goroutine only, the
// single writer.
func (w *Watcher) apply(snap *fleetwatch.Snapshot) bool {
	if w.follow != nil && !w.follow[snap.Pool] {
		return false
	}
	m := *w.pools.Load()
	slot := m[snap.Pool]
	var fence uint64
	if slot != nil {
		prev := slot.Load()
		fence = prev.fence
		if snap.Fence != 0 && snap.Fence < fence {
			w.fenced.Inc()
			return false
		}
		if !snap.NewerThan(prev.snap) {
			w.older.Inc()
			return false
		}
	}
	e := &watched{snap: snap, received: w.settings.Now(), fence: max(fence, snap.Fence)}
	if slot == nil {
		next := make(poolSlots, len(m)+1)
		for k, v := range m {
			next[k] = v
		}
		slot = new(atomic.Pointer[watched])
		slot.Store(e)
		next[snap.Pool] = slot
		w.pools.Store(&next)
	} else {
		slot.Store(e)
	}
	w.applied.Inc()
	w.settings.OnUpdate(snap)
	return true
}

// decodeSnapshot decodes and checks a snapshot published for pool (on its
// subject or under its key). It accepts unknown fields (forward
// compatibility) but not a snapshot a router could not act on
// (fleetwatch.Snapshot.Validate) nor one of another pool. The error wraps
// ErrMalformed, and fleetwatch.ErrInvalidSnapshot when Validate failed.
func decodeSnapshot(data []byte, pool string) (*fleetwatch.Snapshot, error) {
	var snap fleetwatch.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := snap.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if snap.Pool != pool {
		return nil, fmt.Errorf("%w: pool %q published for pool %q", ErrMalformed, snap.Pool, pool)
	}
	return &snap, nil
}

// Close stops a running Run and waits for it to return; every later Run
// returns ErrClosed. It is idempotent and safe concurrently with Run, from
// any goroutine but OnUpdate's (Run calls it).
func (w *Watcher) Close() {
	w.once.Do(func() { close(w.closed) })
	w.mu.Lock()
	done := w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
}

// kvReader reads the decisions bucket for Run: it binds the bucket lazily
// (the publisher may create it after the router starts) and backs off while
// JetStream is unavailable.
type kvReader struct {
	w       *Watcher
	kv      jetstream.KeyValue
	off     bool          // no JetStream, or NoKV: nothing to read
	backoff time.Duration // next retry wait
}

const (
	kvReadTimeout = 5 * time.Second
	kvMinBackoff  = 100 * time.Millisecond
	kvMaxBackoff  = 5 * time.Second
)

func newKVReader(w *Watcher) *kvReader {
	return &kvReader{w: w, off: w.settings.NoKV, backoff: kvMinBackoff}
}

// reset forgets the bound bucket after a reconnect: the server may be a new
// one whose bucket must be bound again.
func (r *kvReader) reset() {
	r.kv = nil
	r.off = r.w.settings.NoKV
	r.backoff = kvMinBackoff
}

// read applies every followed key's current value. It returns false and
// how long to wait before trying again when the read failed.
func (r *kvReader) read(ctx context.Context) (retryAfter time.Duration, ok bool) {
	if r.off {
		return 0, true
	}
	ctx, cancel := context.WithTimeout(ctx, kvReadTimeout)
	defer cancel()
	err := r.readOnce(ctx)
	switch {
	case err == nil:
		r.w.kvReads.Inc()
		r.backoff = kvMinBackoff
		return 0, true
	case errors.Is(err, errNoJetStream):
		r.off = true
		r.w.settings.Logf("feed: JetStream not available: following %s only", r.w.subjects.DecisionsWildcard())
		return 0, true
	case errors.Is(err, jetstream.ErrBucketNotFound):
		// No publisher has created the bucket yet: the subjects will
		// carry the first snapshots within a heartbeat.
		r.w.kvReads.Inc()
		return 0, true
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return 0, true
	}
	r.w.kvErrors.Inc()
	wait := r.backoff
	r.backoff = min(2*r.backoff, kvMaxBackoff)
	r.w.settings.Logf("feed: reading the current decisions failed (retrying in %v): %v", wait, err)
	return wait, false
}

func (r *kvReader) readOnce(ctx context.Context) error {
	if r.w.mode.Load() == modeCompact {
		return r.w.readKeys(ctx, r.w.feedKV) // at start
	}
	if r.kv == nil {
		js, err := jetstream.New(r.w.nc)
		if err != nil {
			return fmt.Errorf("feed: jetstream: %w", err)
		}
		if err := jetStreamAvailable(ctx, js); err != nil {
			return err
		}
		kv, err := js.KeyValue(ctx, r.w.subjects.BucketDecisions())
		if err != nil {
			return fmt.Errorf("feed: bind bucket %s: %w", r.w.subjects.BucketDecisions(), err)
		}
		r.kv = kv
	}
	var watcher jetstream.KeyWatcher
	var err error
	if r.w.follow == nil {
		watcher, err = r.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	} else {
		watcher, err = r.kv.WatchFiltered(ctx, r.w.settings.Pools, jetstream.IgnoreDeletes())
	}
	if err != nil {
		return fmt.Errorf("feed: watch bucket %s: %w", r.w.subjects.BucketDecisions(), err)
	}
	defer func() { _ = watcher.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case entry, ok := <-watcher.Updates():
			if !ok {
				return fmt.Errorf("feed: watch of bucket %s ended before its current values", r.w.subjects.BucketDecisions())
			}
			if entry == nil {
				return nil // every current value has been delivered
			}
			snap, err := decodeSnapshot(entry.Value(), entry.Key())
			if err != nil {
				r.w.malformed.Inc()
				r.w.settings.Logf("feed: ignoring %s[%s]: %v", r.w.subjects.BucketDecisions(), entry.Key(), err)
				continue
			}
			r.w.apply(snap)
		}
	}
}
