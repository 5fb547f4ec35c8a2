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
	epoch   string
	hash    uint32
	seq     uint64   // the key frame's snapshot seq: the base of its load frames
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
	l.Update(u, cp.epoch, cp.seq, cp.ids)
	if cp.gapped {
		cp.distrust(l, u)
	}
	if slot := (*w.pools.Load())[pool]; slot != nil {
		at := l.At.UnixNano()
		if e := slot.Load(); e.snap.Epoch == cp.epoch && e.snap.Seq == cp.seq && at > e.heard.Load() {
			e.heard.Store(at)
		}
	}
	w.loadsApplied.Inc()
	w.settings.OnLoads(pool, u)
}

// applyKey applies a key frame, from the feed subject or a fetch (where
// names it for the log).
func (w *Watcher) applyKey(pool string, data []byte, where string) {
	snap, n, err := DecodeKey(data, pool)
	if err != nil {
		w.malformed.Inc()
		w.settings.Logf("feed: ignoring key frame of %s: %v", where, err)
		return
	}
	cp := w.compact[pool]
	if cp == nil {
		cp = &compactPool{}
		w.compact[pool] = cp
	}
	if cp.ids != nil && snap.Epoch == cp.epoch && n <= cp.n {
		w.older.Inc()
		return
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
	cp.epoch, cp.hash, cp.seq, cp.n, cp.gapped = snap.Epoch, EpochHash(snap.Epoch), snap.Seq, n, false
	cp.ids = cp.ids[:0]
	for i := range snap.Backends {
		cp.ids = append(cp.ids, snap.Backends[i].Backend)
	}
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
