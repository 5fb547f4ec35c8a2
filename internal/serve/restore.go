package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// lastSnapshots reads the last published snapshot of every pool that keep
// accepts from the decisions bucket: what the previous analyzer decided, and
// when. A value that does not decode or validate is skipped and logged.
//
// The keys are listed from the bucket stream's subjects (a stream info
// request, answered by the stream's leader), not by KeyValue.ListKeys,
// which creates a consumer: a request to the JetStream meta leader, which
// may be in an election of its own while the stream answers (a takeover
// after a node loss failed on "list keys: context deadline exceeded").
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
	stream, err := s.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	prefix := "$KV." + bucket + "."
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("bucket %s: listing keys: %w", bucket, err)
	}
	var snaps []fleetwatch.Snapshot
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, prefix)
		if !keep(key) {
			continue
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyDeleted) || errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
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
