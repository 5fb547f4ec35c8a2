package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// lastSnapshots reads the last published snapshot of every pool from the
// decisions bucket: what the previous analyzer decided, and when. A value
// that does not decode or validate is skipped and logged.
func (s *Server) lastSnapshots(ctx context.Context) ([]fleetwatch.Snapshot, error) {
	bucket := s.subj.BucketDecisions()
	kv, err := s.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil // a first start
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: list keys: %w", bucket, err)
	}
	var snaps []fleetwatch.Snapshot
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			s.logf("restore: bucket %s key %s: %v", bucket, key, err)
			continue
		}
		var snap fleetwatch.Snapshot
		if err := json.Unmarshal(e.Value(), &snap); err != nil {
			s.logf("restore: bucket %s key %s: %v", bucket, key, err)
			continue
		}
		if err := snap.Validate(); err != nil {
			s.logf("restore: bucket %s key %s: %v", bucket, key, err)
			continue
		}
		snaps = append(snaps, snap)
	}
	return snaps, nil
}

// restore rebuilds the analyzer before anything is published: the last
// snapshots from the KV, then the outcome stream replayed from one window
// before the oldest of them (or one window before now, whichever is
// earlier; the stream's retention bounds both), evaluating at event time,
// then the snapshots' breakers, trip counts, weights and drift statuses
// laid over what the replay decided (analyzer.Restore: an open breaker
// never closes early because of a restart).
func (s *Server) restore(ctx context.Context) {
	now := time.Now()
	last, err := s.lastSnapshots(ctx)
	if err != nil {
		s.logf("restore: %v (starting from the outcome stream alone)", err)
	}
	since := now.Add(-s.window)
	for _, snap := range last {
		if from := snap.At.Add(-s.window); from.Before(since) {
			since = from
		}
	}
	if err := s.replay(ctx, since); err != nil {
		s.logf("replay: %v (starting with empty windows)", err)
	}
	if len(last) > 0 {
		r := s.an.Restore(last, time.Now())
		s.logf("restored %d pools from %s: %d breakers open, %d half-open, %d drift statuses, %d weights",
			len(last), s.subj.BucketDecisions(), r.Open, r.HalfOpen, r.Drift, r.Weights)
	}
}
