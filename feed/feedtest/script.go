package feedtest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// Script publishes decision snapshots the way fleetwatch does (JSON on
// fw.decisions.<pool>, last value in the fw_decisions KV bucket), so that
// router-side code can be tested against exact, scripted snapshots without
// running an analyzer. It talks to NATS directly, not through package feed,
// so that the feed package's own tests can use it as an independent
// publisher.
type Script struct {
	t        testing.TB
	nc       *nats.Conn
	subjects fleetwatch.Subjects
	kv       jetstream.KeyValue // nil without JetStream
}

// NewScript returns a Script publishing with nc under prefix ("" = "fw").
// When the server has JetStream it creates (or binds) the decisions bucket.
func NewScript(t testing.TB, nc *nats.Conn, prefix string) *Script {
	t.Helper()
	s := &Script{t: t, nc: nc, subjects: fleetwatch.Subjects{Prefix: prefix}}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("feedtest: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return s // core NATS only: subject publishing still works
		}
		t.Fatalf("feedtest: jetstream account info: %v", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:  s.subjects.BucketDecisions(),
		History: 1,
	})
	if err != nil {
		t.Fatalf("feedtest: decisions bucket: %v", err)
	}
	s.kv = kv
	return s
}

// HasKV reports whether the Script writes to the KV bucket.
func (s *Script) HasKV() bool { return s.kv != nil }

// Publish publishes each snapshot on its pool's subject and puts it in the
// KV bucket, in order, and flushes the connection.
func (s *Script) Publish(snaps ...*fleetwatch.Snapshot) {
	s.t.Helper()
	for _, snap := range snaps {
		data := s.encode(snap)
		s.PublishRaw(snap.Pool, data)
		s.PutRaw(snap.Pool, data)
	}
	s.flush()
}

// PublishSubject publishes the snapshots on their subjects only (as a
// publisher without JetStream would).
func (s *Script) PublishSubject(snaps ...*fleetwatch.Snapshot) {
	s.t.Helper()
	for _, snap := range snaps {
		s.PublishRaw(snap.Pool, s.encode(snap))
	}
	s.flush()
}

// Put puts the snapshots in the KV bucket only (as the state a late-joining
// router reads at start).
func (s *Script) Put(snaps ...*fleetwatch.Snapshot) {
	s.t.Helper()
	for _, snap := range snaps {
		s.PutRaw(snap.Pool, s.encode(snap))
	}
}

// PublishRaw publishes data on pool's decisions subject, for malformed
// payloads.
func (s *Script) PublishRaw(pool string, data []byte) {
	s.t.Helper()
	if err := s.nc.Publish(s.subjects.Decisions(pool), data); err != nil {
		s.t.Fatalf("feedtest: publish %s: %v", pool, err)
	}
}

// PutRaw puts data under pool in the KV bucket; it does nothing without
// JetStream.
func (s *Script) PutRaw(pool string, data []byte) {
	s.t.Helper()
	if s.kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.kv.Put(ctx, pool, data); err != nil {
		s.t.Fatalf("feedtest: kv put %s: %v", pool, err)
	}
}

func (s *Script) encode(snap *fleetwatch.Snapshot) []byte {
	s.t.Helper()
	data, err := json.Marshal(snap)
	if err != nil {
		s.t.Fatalf("feedtest: encode snapshot: %v", err)
	}
	return data
}

func (s *Script) flush() {
	s.t.Helper()
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		s.t.Fatalf("feedtest: flush: %v", err)
	}
}

// Snapshot builds a minimal valid snapshot: protocol version 1, balance mode,
// shed when all open, the default affinity tolerance, a 5 s TTL, and the
// given backends (which the caller lists sorted by id).
func Snapshot(pool, epoch string, seq uint64, at time.Time, backends ...fleetwatch.Backend) *fleetwatch.Snapshot {
	return &fleetwatch.Snapshot{
		V:                 fleetwatch.ProtocolVersion,
		Pool:              pool,
		Epoch:             epoch,
		Seq:               seq,
		At:                fleetwatch.At(at),
		TTLMs:             5000,
		Mode:              fleetwatch.ModeBalance,
		AllOpen:           fleetwatch.AllOpenShed,
		AffinityTolerance: fleetwatch.DefaultAffinityTolerance,
		Backends:          backends,
	}
}

// Closed returns a healthy backend decision with weight 1.
func Closed(id string) fleetwatch.Backend {
	return fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftUnknown}
}

// Open returns an open backend decision whose breaker half-opens at until.
func Open(id string, until time.Time, reason string) fleetwatch.Backend {
	return fleetwatch.Backend{
		Backend: id, State: fleetwatch.StateOpen, Weight: 0,
		OpenUntil: new(fleetwatch.At(until)), Reason: reason, Drift: fleetwatch.DriftUnknown,
	}
}
