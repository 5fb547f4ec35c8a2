package feed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// The watcher's compact mode (WatcherSettings.Compact; docs/PROTOCOL.md
// "Compact feed (extension)"). Run binds the fw_feed bucket first: when it
// is there, the watcher subscribes to the compact feed alone and reads
// each pool's key frame from the bucket by direct get, a request to the
// stream that no consumer serves, at start and after every reconnect;
// when it is not (a serve that does not publish it, or no JetStream), it
// follows the JSON snapshots, and looks for the bucket again every
// feedRedetect. A load frame based on a key frame the watcher does not
// have makes it fetch the key frame; one whose number is not the next is
// a gap, counted, and like a reconnect it makes the watcher ask serve for
// a decision snapshot now (fw.resync.<pool>) and distrust the loads the
// missed frames may have moved until that key frame (missed).

// Watcher modes.
const (
	modeJSON int32 = iota
	modeCompact
)

// feedRedetect is how often a watcher asked for the compact feed that
// follows the JSON snapshots looks for the fw_feed bucket again (a
// variable for the tests).
var feedRedetect = 30 * time.Second

const (
	// keyFetchEvery spaces the key frame fetches of one pool.
	keyFetchEvery = time.Second
	// keyFetchTimeout bounds one fetch.
	keyFetchTimeout = 2 * time.Second
	// maxFetches bounds the fetches in flight.
	maxFetches = 8
)

// compactPool is what the watcher knows of one pool's compact feed (Run's
// goroutine only).
type compactPool struct {
	epoch string
	hash  uint32
	seq   uint64 // the key frame's snapshot seq: the base of its load frames
	// applied is the seq of the snapshot last handed to OnUpdate, which the
	// load updates name (LoadUpdate.Base): seq, or an earlier one when the
	// key frames since repeated its decisions (applyKey's refresh).
	applied uint64
	n       uint64   // the last frame's number
	ids     []string // the key frame's backends, in its order
	fetchAt time.Time
	// gapped: frames were missed since the key frame; untrusted, per
	// backend of it, whether its load may be outdated (missed).
	gapped    bool
	untrusted []bool
	resyncAt  time.Time      // the last resync request
	loads     Loads          // decoded load frames, reused
	update    p2c.LoadUpdate // reused
}

// keyResult is a fetched key frame.
type keyResult struct {
	pool string
	data []byte
	err  error
}

// handleFrame applies a compact frame of pool.
func (w *Watcher) handleFrame(pool, subject string, data []byte) {
	if w.follow != nil && !w.follow[pool] {
		return
	}
	kind, err := FrameKind(data)
	if err != nil {
		w.malformed.Inc()
		w.settings.Logf("feed: ignoring frame on %s: %v", subject, err)
		return
	}
	if kind == FrameKey {
		w.applyKey(pool, data, subject)
		return
	}
	cp := w.compact[pool]
	if cp == nil {
		cp = &compactPool{}
		w.compact[pool] = cp
	}
	if err := DecodeLoads(data, &cp.loads); err != nil {
		w.malformed.Inc()
		w.settings.Logf("feed: ignoring frame on %s: %v", subject, err)
		return
	}
	l := &cp.loads
	switch {
	case cp.ids == nil || l.Epoch != cp.hash || l.Base != cp.seq:
		if l.Epoch == cp.hash && l.Base < cp.seq {
			w.older.Inc() // a load frame of an older key frame
			return
		}
		w.fetchKey(pool) // the key frame it is based on was missed
		return
	case l.N <= cp.n:
		w.older.Inc()
		return
	case l.N != cp.n+1:
		w.gaps.Inc()
		w.missed(pool, cp)
	}
	cp.n = l.N
	w.applyLoads(pool, cp)
}

// applyLoads hands cp's decoded load frame to OnLoads and renews the
// pool's freshness.
func (w *Watcher) applyLoads(pool string, cp *compactPool) {
	l := &cp.loads
	u := &cp.update
	l.Update(u, cp.epoch, cp.applied, cp.ids)
	if cp.gapped {
		cp.distrust(l, u)
	}
	if slot := (*w.pools.Load())[pool]; slot != nil {
		at := l.At.UnixNano()
		if e := slot.Load(); e.snap.Epoch == cp.epoch && e.snap.Seq == cp.applied && at > e.heard.Load() {
			e.heard.Store(at)
		}
	}
	w.loadsApplied.Inc()
	w.settings.OnLoads(pool, u)
}

// applyKey applies a key frame, from the feed subject or a fetch (where
// names it for the log).
func (w *Watcher) applyKey(pool string, data []byte, where string) {
	cp := w.compact[pool]
	if cp == nil {
		cp = &compactPool{}
		w.compact[pool] = cp
	}
	// Most key frames repeat the decisions applied: decoded where nothing
	// is allocated (the scratch, when the pool has a key frame applied),
	// and applied as loads when they do; decoded again to be kept when
	// they do not.
	var scratch *keyScratch
	if cp.ids != nil {
		scratch, w.scratch.known = &w.scratch, cp.ids
	}
	snap, n, err := decodeKey(data, pool, scratch)
	if err != nil {
		w.malformed.Inc()
		w.settings.Logf("feed: ignoring key frame of %s: %v", where, err)
		return
	}
	if cp.ids != nil && snap.Epoch == cp.epoch && n <= cp.n {
		w.older.Inc()
		return
	}
	if scratch != nil {
		if w.refresh(pool, cp, snap, n) {
			return
		}
		snap, _, _ = DecodeKey(data, pool) // the same bytes: decoded above
	}
	if !w.apply(snap) {
		// Not newer than the snapshot applied. When it is that very
		// snapshot (its JSON came first while the mode was unknown), its
		// load frames apply to it.
		v, ok := w.View(pool)
		if !ok || v.Snapshot.Epoch != snap.Epoch || v.Snapshot.Seq != snap.Seq {
			return
		}
	}
	cp.epoch, cp.hash, cp.seq, cp.applied, cp.n, cp.gapped = snap.Epoch, EpochHash(snap.Epoch), snap.Seq, snap.Seq, n, false
	cp.ids = cp.ids[:0]
	for i := range snap.Backends {
		cp.ids = append(cp.ids, snap.Backends[i].Backend)
	}
}

// refresh applies a key frame, snap (decoded into the watcher's scratch:
// not kept), that repeats the decisions of the snapshot applied (most
// are: KeyEvery's, a resync's, a fetch's) as what it then is, every
// backend's load: OnLoads gets a load update of every backend based on
// the snapshot applied, which the key frame renews as a load frame does
// (View: not stale until its at + ttl_ms), and the load frames based on
// the key frame apply to that snapshot too. Rebuilding a picker for
// decisions it has costs many times a load frame (BENCHMARKS.md "A router
// following a pool"). It reports false, and does nothing, when the
// decisions differ or the router has none of this epoch.
func (w *Watcher) refresh(pool string, cp *compactPool, snap *fleetwatch.Snapshot, n uint64) bool {
	slot := (*w.pools.Load())[pool]
	if slot == nil || snap.Epoch != cp.epoch || snap.Seq <= cp.seq {
		return false
	}
	e := slot.Load()
	if e.snap.Seq != cp.applied || !RepeatsDecisions(e.snap, snap) {
		return false
	}
	cp.seq, cp.n, cp.gapped = snap.Seq, n, false
	if at := snap.At.UnixNano(); at > e.heard.Load() {
		e.heard.Store(at)
	}
	u := &cp.update
	KeyLoads(u, e.snap, snap)
	w.refreshed.Inc()
	w.settings.OnLoads(pool, u)
	return true
}

// MaxRepeatSpan bounds how long key frames may repeat the decisions of one
// snapshot applied (RepeatsDecisions): the picker keeps its load decays
// relative to that snapshot's at (p2c), and exp(span / load_stale) must
// stay a float64 (load_stale is at least 50ms: 600 at most); it also
// bounds how long anything else the snapshot applied holds stays as it
// was. A key frame rebuilds the picker at least this often.
const MaxRepeatSpan = 30 * time.Second

// RepeatsDecisions reports whether key frame snap repeats the decisions of
// applied, the snapshot a router applied, so that it may be applied as its
// loads (KeyLoads, p2c.Picker.UpdateLoads) instead of as a new snapshot:
// both of one epoch, snap newer and at most MaxRepeatSpan after it; the
// same pool fields and backends, each with the same state, weight,
// priority, open_until, quota, cost, override and drift (what the compact
// encoder keys on); the same backends with an EWMA (a load update can
// move one, not remove it); and the p95 TTFT a first-token deadline
// reads (a key frame carries that one) within p95Step of applied's. Not
// in shadow mode: its picker compares two states and applies no load
// update (p2c.Picker.UpdateLoads), so every key frame is a snapshot
// there. feed.Watcher does this in compact mode; the simulator's routers
// too.
func RepeatsDecisions(applied, snap *fleetwatch.Snapshot) bool {
	span := snap.At.Sub(applied.At.Time)
	return snap.Epoch == applied.Epoch && snap.Seq > applied.Seq && span >= 0 && span <= MaxRepeatSpan &&
		!snap.Shadow.On() && sameDecisions(applied, snap)
}

// KeyLoads sets u to the load update that applies key frame snap to the
// snapshot applied, whose decisions it repeats (RepeatsDecisions): every
// backend's load and EWMA, the pool's median and retry budget rate, at
// snap's at, based on applied (its epoch and seq), Full. u's slice is
// reused.
func KeyLoads(u *p2c.LoadUpdate, applied, snap *fleetwatch.Snapshot) {
	u.Epoch, u.Base, u.At, u.Full = applied.Epoch, applied.Seq, snap.At.Time, true
	u.Median, u.Budget = 0, math.NaN()
	if snap.MedianEWMATTFTMs != nil {
		u.Median = *snap.MedianEWMATTFTMs
	}
	if rb := snap.RetryBudget; rb != nil {
		u.Budget = rb.PerSec
	}
	u.Backends = u.Backends[:0]
	for i := range snap.Backends {
		b := &snap.Backends[i]
		bl := p2c.BackendLoad{Backend: b.Backend, Running: math.NaN(), Waiting: math.NaN(), AgeMs: -1,
			NoLoad: b.Load == nil, EWMATTFTMs: math.NaN()}
		if l := b.Load; l != nil {
			bl.Running, bl.Waiting, bl.AgeMs, bl.Metrics = l.Running, l.Waiting, l.AgeMs, l.Source == fleetwatch.LoadSourceMetrics
		}
		if b.EWMATTFTMs != nil {
			bl.EWMATTFTMs = *b.EWMATTFTMs
		}
		u.Backends = append(u.Backends, bl)
	}
}

// p95Step is how far the p95 TTFT a router's first-token deadline reads
// (route.PoolP95TTFT: a key frame carries that one) may move, relatively,
// before a key frame is applied as new decisions rather than refreshed.
const p95Step = 0.05

// sameDecisions is RepeatsDecisions without the epoch, seq and span.
func sameDecisions(a, b *fleetwatch.Snapshot) bool {
	if headerOf(a) != headerOf(b) || len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		x, y := &a.Backends[i], &b.Backends[i]
		dx, dy := decidedOf(x), decidedOf(y)
		if x.Backend != y.Backend || (x.EWMATTFTMs == nil) != (y.EWMATTFTMs == nil) || !sameCost(dx.cost, dy.cost) {
			return false
		}
		dx.cost, dy.cost = 0, 0
		if dx != dy {
			return false
		}
	}
	// The deadline reads the largest p95 of the backends not open, which
	// often moves from one backend to another of about the same: its
	// value counts, not whose it is.
	pa, pb := deadlineP95(a), deadlineP95(b)
	if (pa < 0) != (pb < 0) {
		return false
	}
	if pa >= 0 {
		x, y := *a.Backends[pa].P95TTFTMs, *b.Backends[pb].P95TTFTMs
		if math.Abs(y-x) > p95Step*x {
			return false
		}
	}
	return true
}

// fetchKey fetches pool's key frame from the bucket, at most once per
// keyFetchEvery and maxFetches at a time; the result comes back to Run's
// loop.
func (w *Watcher) fetchKey(pool string) {
	cp := w.compact[pool]
	now := time.Now()
	if w.feedKV == nil || w.fetching[pool] || len(w.fetching) >= maxFetches || now.Sub(cp.fetchAt) < keyFetchEvery {
		return
	}
	cp.fetchAt = now
	w.fetching[pool] = true
	w.keyFetches.Inc()
	kv, runCtx := w.feedKV, w.runCtx
	go func() { // ends with the fetch, or with Run
		ctx, cancel := context.WithTimeout(runCtx, keyFetchTimeout)
		defer cancel()
		r := keyResult{pool: pool}
		if e, err := kv.Get(ctx, pool); err != nil {
			r.err = err
		} else {
			r.data = e.Value()
		}
		select {
		case w.fetched <- r:
		case <-w.closed:
		case <-runCtx.Done():
		}
	}()
}

// missed marks that a pool's frames were missed (a gap, a reconnect):
// until its next key frame, a load the missed frames may have moved keeps
// the report time the router has (it ages, and past load_stale the picker
// counts its own requests instead) unless a frame lists it again; and it
// asks serve for a decision snapshot now (fw.resync.<pool>, at most once
// a second), whose key frame brings every load again.
func (w *Watcher) missed(pool string, cp *compactPool) {
	cp.untrusted = cp.untrusted[:0]
	for range cp.ids {
		cp.untrusted = append(cp.untrusted, true)
	}
	cp.gapped = true
	if now := time.Now(); now.Sub(cp.resyncAt) >= keyFetchEvery {
		cp.resyncAt = now
		if err := w.nc.Publish(w.subjects.Resync(pool), nil); err == nil {
			w.resyncs.Inc()
		}
	}
}

// distrust leaves out of u the report times of the loads that may be
// outdated since a gap (missed), and trusts those u lists again.
func (cp *compactPool) distrust(l *Loads, u *p2c.LoadUpdate) {
	for _, e := range l.Entries {
		if (!math.IsNaN(e.Running) || e.NoLoad) && e.Index >= 0 && e.Index < len(cp.untrusted) {
			cp.untrusted[e.Index] = false
		}
	}
	for i, bad := range cp.untrusted {
		if bad && i < len(u.Backends) {
			u.Backends[i].AgeMs = -1
		}
	}
}

// fetchedKey applies a fetched key frame.
func (w *Watcher) fetchedKey(r keyResult) {
	delete(w.fetching, r.pool)
	switch {
	case errors.Is(r.err, jetstream.ErrKeyNotFound):
		// Not put yet: the key frame comes on the subject within KeyEvery.
	case r.err != nil:
		w.kvErrors.Inc()
		w.settings.Logf("feed: fetching the key frame of pool %s: %v", r.pool, r.err)
	default:
		w.applyKey(r.pool, r.data, w.subjects.BucketFeed()+"["+r.pool+"]")
	}
}

// bindFeed binds the fw_feed bucket: errNoJetStream or an error wrapping
// jetstream.ErrBucketNotFound when the server has none.
func (w *Watcher) bindFeed(ctx context.Context) (jetstream.KeyValue, error) {
	js, err := jetstream.New(w.nc)
	if err != nil {
		return nil, fmt.Errorf("feed: jetstream: %w", err)
	}
	if err := jetStreamAvailable(ctx, js); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, w.subjects.BucketFeed())
	if err != nil {
		return nil, fmt.Errorf("feed: bind bucket %s: %w", w.subjects.BucketFeed(), err)
	}
	return kv, nil
}

// readKeys applies the stored key frame of every followed pool: the
// listed pools, or every key of the bucket, listed from its stream's
// subjects (no consumer).
func (w *Watcher) readKeys(ctx context.Context, kv jetstream.KeyValue) error {
	pools := w.settings.Pools
	if w.follow == nil {
		js, err := jetstream.New(w.nc)
		if err != nil {
			return err
		}
		stream, err := js.Stream(ctx, "KV_"+w.subjects.BucketFeed())
		if err != nil {
			return fmt.Errorf("feed: stream of bucket %s: %w", w.subjects.BucketFeed(), err)
		}
		prefix := "$KV." + w.subjects.BucketFeed() + "."
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
		if err != nil {
			return fmt.Errorf("feed: list bucket %s: %w", w.subjects.BucketFeed(), err)
		}
		pools = pools[:0:0]
		for subj := range info.State.Subjects {
			pools = append(pools, strings.TrimPrefix(subj, prefix))
		}
	}
	for _, pool := range pools {
		e, err := kv.Get(ctx, pool)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			continue
		case err != nil:
			return fmt.Errorf("feed: get %s[%s]: %w", w.subjects.BucketFeed(), pool, err)
		}
		if fleetwatch.ValidatePoolID(pool) != nil {
			continue
		}
		w.applyKey(pool, e.Value(), w.subjects.BucketFeed()+"["+pool+"]")
	}
	return nil
}

// staleAt is when a view goes stale: the snapshot's StaleAt, later by as
// much as a load frame based on it was heard after its at.
func staleAt(snap *fleetwatch.Snapshot, heard int64) time.Time {
	t := snap.StaleAt()
	if d := heard - snap.At.UnixNano(); d > 0 {
		t = t.Add(time.Duration(d))
	}
	return t
}
