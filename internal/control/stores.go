package control

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/probes"
)

// The JetStream stores of a deployment's drift probes, shared by serve
// (which writes them) and the CLI (which reads them, and writes them when
// no serve runs): the KV buckets of baselines and drift states and the
// stream FW_DRIFT of alerts and review digests.

// DriftRetention is how long FW_DRIFT keeps alerts and digests.
const DriftRetention = 30 * 24 * time.Hour

// KVBaselines stores baselines in the JetStream KV bucket fw_probe_baselines
// under "<pool>.<base64url(backend)>": pool ids are valid keys, backend ids
// may hold any printable character, and base64url has no '.', so the key is
// unique.
type KVBaselines struct{ KV jetstream.KeyValue }

// Key is the key of a backend's value in the buckets of baselines, drift
// states and overrides: "<pool>.<base64url(backend)>".
func Key(pool, backend string) string {
	return pool + "." + base64.RawURLEncoding.EncodeToString([]byte(backend))
}

// Load implements probes.Store.
func (s KVBaselines) Load(ctx context.Context, pool, backend string) ([]byte, error) {
	e, err := s.KV.Get(ctx, Key(pool, backend))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, probes.ErrNoBaseline
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

// Save implements probes.Store; nil data clears the baseline.
func (s KVBaselines) Save(ctx context.Context, pool, backend string, data []byte) error {
	_, err := s.KV.Put(ctx, Key(pool, backend), data)
	return err
}

// OpenBaselines creates or opens the baselines bucket (5 revisions kept per
// key, so a re-baseline leaves the previous baseline for audit).
func OpenBaselines(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      subj.BucketBaselines(),
		Description: "fleetwatch drift probe baselines",
		History:     5,
		Storage:     jetstream.FileStorage,
	})
}

// BucketDriftState is the JetStream KV bucket of each backend's drift state
// (drift.DriftState) under subj's prefix: fw_drift for the default one.
func BucketDriftState(subj fleetwatch.Subjects) string {
	return strings.TrimSuffix(subj.BucketBaselines(), "_probe_baselines") + "_drift"
}

// KVStates stores drift states in the bucket BucketDriftState, under the
// same keys as the baselines ("<pool>.<base64url(backend)>").
type KVStates struct{ KV jetstream.KeyValue }

// Load implements probes.Store.
func (s KVStates) Load(ctx context.Context, pool, backend string) ([]byte, error) {
	e, err := s.KV.Get(ctx, Key(pool, backend))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, probes.ErrNoState
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

// Save implements probes.Store; nil data clears the state.
func (s KVStates) Save(ctx context.Context, pool, backend string, data []byte) error {
	_, err := s.KV.Put(ctx, Key(pool, backend), data)
	return err
}

// OpenDriftStates creates or opens the drift state bucket (the latest
// value per key: the history of changes is the alerts in FW_DRIFT).
func OpenDriftStates(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketDriftState(subj),
		Description: "fleetwatch drift state per backend: status, CUSUM, cooldown, last alert, quarantine",
		History:     1,
		Storage:     jetstream.FileStorage,
	})
}

// EnsureDriftStream creates or updates FW_DRIFT capturing fw.drift.>.
func EnsureDriftStream(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (jetstream.Stream, error) {
	return js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        subj.StreamDrift(),
		Description: "fleetwatch drift alerts and review digests",
		Subjects:    []string{subj.DriftWildcard()},
		MaxAge:      DriftRetention,
		Storage:     jetstream.FileStorage,
	})
}

// ReadDrift reads FW_DRIFT from since: the alerts, and the review digests.
func ReadDrift(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects, since time.Time) ([]fleetwatch.DriftAlert, []fleetwatch.DriftReview, error) {
	stream, err := js.Stream(ctx, subj.StreamDrift())
	if err != nil {
		return nil, nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj.DriftWildcard()},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return nil, nil, err
	}
	var alerts []fleetwatch.DriftAlert
	var reviews []fleetwatch.DriftReview
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, nil, err
		}
		n := 0
		var last jetstream.Msg
		for m := range batch.Messages() {
			n++
			last = m
			if m.Subject() == subj.DriftReview() {
				var r fleetwatch.DriftReview
				if json.Unmarshal(m.Data(), &r) == nil {
					reviews = append(reviews, r)
				}
				continue
			}
			var a fleetwatch.DriftAlert
			if json.Unmarshal(m.Data(), &a) == nil && a.Backend != "" {
				alerts = append(alerts, a)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, nil, err
		}
		if n == 0 {
			break
		}
		if md, err := last.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	return alerts, reviews, nil
}

// LastReview is when the last review digest in FW_DRIFT was made.
func LastReview(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (time.Time, bool, error) {
	stream, err := js.Stream(ctx, subj.StreamDrift())
	if err != nil {
		return time.Time{}, false, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, subj.DriftReview())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	var r fleetwatch.DriftReview
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return time.Time{}, false, nil
	}
	return r.At.Time, true, nil
}
