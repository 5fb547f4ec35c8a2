package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStreamStore is the Store of a JetStream key-value bucket (fw_leases).
//
// Writes go through nats.go's KeyValue (compare-and-set by expected
// revision). Reads of lease keys ask the stream's leader
// ($JS.API.STREAM.MSG.GET), not a replica (KeyValue.Get reads any replica
// with direct gets): a replica answers during an election, and a standby
// must not count an election as time in which the holder could have
// renewed. The bucket keeps a key for KeyMaxAge after its last write, far
// longer than any election, so that no lease ends by the store's clock.
type JetStreamStore struct {
	nc *nats.Conn
	js jetstream.JetStream
	s  StoreSettings

	// mu guards kv and stream, bound by the first Ensure, and created.
	mu      sync.Mutex
	kv      jetstream.KeyValue
	stream  jetstream.Stream
	created bool // the first Ensure created the bucket
}

// StoreSettings configure a JetStreamStore.
type StoreSettings struct {
	// Bucket is the bucket's name (Subjects.BucketLeases).
	Bucket string
	// Replicas of the bucket's stream. If zero, 1.
	Replicas int
	// TTL is the lease TTL (the bucket's duplicate window).
	TTL time.Duration
	// Floor returns the least first revision of a bucket made again (the
	// server lost it): above every fence used before. If nil, the clock in
	// microseconds.
	Floor func(ctx context.Context) uint64
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
}

// KeyMaxAge is how long the bucket keeps a key after its last write: a
// dead instance's member key goes away after it, a lease key is never
// aged out by an election (DECISIONS.md "Elections without silence").
func KeyMaxAge(ttl time.Duration) time.Duration { return max(time.Hour, 20*ttl) }

// NewJetStreamStore returns the store of the bucket; Ensure creates or
// binds it.
func NewJetStreamStore(nc *nats.Conn, js jetstream.JetStream, s StoreSettings) *JetStreamStore {
	if s.Replicas <= 0 {
		s.Replicas = 1
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.Floor == nil {
		s.Floor = func(context.Context) uint64 { return uint64(time.Now().UnixMicro()) }
	}
	return &JetStreamStore{nc: nc, js: js, s: s}
}

func (j *JetStreamStore) streamName() string { return "KV_" + j.s.Bucket }
func (j *JetStreamStore) subject(key string) string {
	return "$KV." + j.s.Bucket + "." + key
}

// StreamConfig is the stream behind the bucket, laid out as nats.go's
// CreateKeyValue lays out a bucket (so that KeyValue binds it), on file,
// with first sequence floor.
func (j *JetStreamStore) StreamConfig(floor uint64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              j.streamName(),
		Description:       "fleetwatch: partition leases of the serve instances",
		Subjects:          []string{"$KV." + j.s.Bucket + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxAge:            KeyMaxAge(j.s.TTL),
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          j.s.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        min(2*time.Minute, j.s.TTL),
		Discard:           jetstream.DiscardNew,
		FirstSeq:          floor,
	}
}

// Ensure binds the bucket, creating it when the server does not have it
// (its first revision above Floor), and applies the key max age to one
// made by an earlier version (whose max age was the lease TTL: keys
// expired in an election). It is called at start and whenever the server
// may have lost the bucket.
func (j *JetStreamStore) Ensure(ctx context.Context) error {
	name := j.streamName()
	stream, err := j.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		floor := j.s.Floor(ctx)
		stream, err = j.js.CreateStream(ctx, j.StreamConfig(floor))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			stream, err = j.js.Stream(ctx, name)
		}
		if err != nil {
			return fmt.Errorf("ha: lease bucket %s: %w", j.s.Bucket, err)
		}
		if j.bound() {
			j.s.Logf("ha: the server had no lease bucket %s: created it again (first revision %d)", j.s.Bucket, floor)
		} else {
			j.mu.Lock()
			j.created = true
			j.mu.Unlock()
		}
	case err != nil:
		return fmt.Errorf("ha: lease bucket %s: %w", j.s.Bucket, err)
	default:
		cfg := stream.CachedInfo().Config
		if cfg.Storage == jetstream.MemoryStorage && !j.bound() {
			j.s.Logf("ha: lease bucket %s is memory storage (an earlier version made it): a restart of NATS loses it and serve creates it again on file; delete it while no serve runs to move it now", j.s.Bucket)
		}
		want := j.StreamConfig(0)
		if cfg.MaxAge != want.MaxAge || cfg.Duplicates != want.Duplicates {
			cfg.MaxAge, cfg.Duplicates = want.MaxAge, want.Duplicates
			if _, err := j.js.UpdateStream(ctx, cfg); err != nil {
				j.s.Logf("ha: using lease bucket %s as configured (max age %v: %v)", j.s.Bucket, stream.CachedInfo().Config.MaxAge, err)
			}
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.stream = stream
	if j.kv != nil {
		return nil // the handle names the bucket: it works with the stream made again
	}
	kv, err := j.js.KeyValue(ctx, j.s.Bucket)
	if err != nil {
		return fmt.Errorf("ha: lease bucket %s: %w", j.s.Bucket, err)
	}
	j.kv = kv
	return nil
}

// Created reports whether the first Ensure created the bucket (a new
// deployment: Settings.FreshStore).
func (j *JetStreamStore) Created() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.created
}

func (j *JetStreamStore) bound() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.kv != nil
}

func (j *JetStreamStore) handles() (jetstream.KeyValue, jetstream.Stream, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.kv == nil {
		return nil, nil, fmt.Errorf("ha: lease bucket %s not bound yet", j.s.Bucket)
	}
	return j.kv, j.stream, nil
}

// The JetStream API's error codes the store tells apart (nats-server's
// errors.json).
const (
	jsClusterNotAvailable jetstream.ErrorCode = 10008 // JSClusterNotAvailErr: no leader
	jsNoMessageFound      jetstream.ErrorCode = 10037 // JSNoMessageFoundErr
)

// classify maps a nats.go error of a write to the store's errors.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var api *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.As(err, &api) && api.ErrorCode == jsClusterNotAvailable,
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: %w", ErrNoLeader, err)
	}
	return err
}

// msgGetResponse is the answer to $JS.API.STREAM.MSG.GET.
type msgGetResponse struct {
	Error *struct {
		Code        int                 `json:"code"`
		ErrCode     jetstream.ErrorCode `json:"err_code"`
		Description string              `json:"description"`
	} `json:"error"`
	Message *struct {
		Seq    uint64 `json:"seq"`
		Header []byte `json:"hdrs"`
		Data   []byte `json:"data"`
	} `json:"message"`
}

// Read implements Store: the key's last entry from the stream's leader.
func (j *JetStreamStore) Read(ctx context.Context, key string) (Entry, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": j.subject(key)})
	msg, err := j.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+j.streamName(), req)
	if err != nil {
		return Entry{}, fmt.Errorf("ha: reading %s: %w", key, err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return Entry{}, fmt.Errorf("ha: reading %s: %w", key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == jsNoMessageFound:
		return Entry{}, ErrNotFound
	case resp.Error != nil && resp.Error.ErrCode == jsClusterNotAvailable:
		return Entry{}, fmt.Errorf("%w: %s", ErrNoLeader, resp.Error.Description)
	case resp.Error != nil:
		return Entry{}, fmt.Errorf("ha: reading %s: %s (%d)", key, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return Entry{}, fmt.Errorf("ha: reading %s: empty answer", key)
	}
	e := Entry{Value: string(resp.Message.Data), Revision: resp.Message.Seq}
	if len(resp.Message.Header) > 0 {
		if h, err := nats.DecodeHeadersMsg(resp.Message.Header); err == nil {
			op := h.Get("KV-Operation")
			e.Deleted = op == "DEL" || op == "PURGE"
		}
	}
	return e, nil
}

// Create implements Store.
func (j *JetStreamStore) Create(ctx context.Context, key, value string) (uint64, error) {
	kv, _, err := j.handles()
	if err != nil {
		return 0, err
	}
	rev, err := kv.Create(ctx, key, []byte(value))
	return rev, classify(err)
}

// Update implements Store.
func (j *JetStreamStore) Update(ctx context.Context, key, value string, rev uint64) (uint64, error) {
	kv, _, err := j.handles()
	if err != nil {
		return 0, err
	}
	next, err := kv.Update(ctx, key, []byte(value), rev)
	return next, classify(err)
}

// Delete implements Store; rev 0 deletes whatever the key holds.
func (j *JetStreamStore) Delete(ctx context.Context, key string, rev uint64) error {
	kv, _, err := j.handles()
	if err != nil {
		return err
	}
	if rev == 0 {
		return classify(kv.Delete(ctx, key))
	}
	return classify(kv.Delete(ctx, key, jetstream.LastRevision(rev)))
}

// Put implements Store.
func (j *JetStreamStore) Put(ctx context.Context, key, value string) (uint64, error) {
	kv, _, err := j.handles()
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, key, []byte(value))
	return rev, classify(err)
}

// Members implements Store: the keys are listed from the stream's subjects
// (a stream info request, answered by its leader: no consumer, so no
// request to the meta leader) and read from any replica.
func (j *JetStreamStore) Members(ctx context.Context, prefix string) (map[string]string, error) {
	kv, stream, err := j.handles()
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(j.subject(prefix)+">"))
	if err != nil {
		return nil, classify(err)
	}
	out := make(map[string]string, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		key := strings.TrimPrefix(subj, "$KV."+j.s.Bucket+".")
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, classify(err)
		}
		out[key] = string(e.Value())
	}
	return out, nil
}
