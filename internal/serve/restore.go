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

// lastSnapshots reads the last published snapshot of every pool that keep
// accepts from the decisions bucket: what the previous analyzer decided, and
// when. A value that does not decode or validate is skipped and logged.
func (s *Server) lastSnapshots(ctx context.Context, keep func(pool string) bool) ([]fleetwatch.Snapshot, error) {
	bucket := s.subj.BucketDecisions()
	// Bounded: right after a cluster restart the bucket's stream may have
	// no leader for seconds, and a takeover tries again sooner than the
	// client's default 5 s.
	bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	kv, err := s.js.KeyValue(bctx, bucket)
	cancel()
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
		if !keep(key) {
			continue
		}
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
