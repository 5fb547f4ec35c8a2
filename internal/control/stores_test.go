package control

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/probes"
)

func TestKeyIsUniquePerBackend(t *testing.T) {
	// backend ids may hold '.', '/' and spaces; the key must still split
	// into exactly one pool and one backend
	seen := map[string][2]string{}
	for _, pb := range [][2]string{{"p", "a.b"}, {"p.a", "b"}, {"p", "a/b"}, {"p", "a b"}, {"p", "ab"}} {
		k := Key(pb[0], pb[1])
		if other, dup := seen[k]; dup {
			t.Errorf("Key(%q, %q) = Key(%q, %q) = %q", pb[0], pb[1], other[0], other[1], k)
		}
		seen[k] = pb
	}
	if got := Key("llama", "vllm-a"); got != "llama.dmxsbS1h" {
		t.Errorf("Key(llama, vllm-a) = %q, want llama.dmxsbS1h (the key the buckets already hold)", got)
	}
}

func TestStoresRoundTrip(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	js, err := jetstream.New(feedtest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{Prefix: "acme"}
	if got := BucketDriftState(subj); got != "acme_drift" {
		t.Errorf("BucketDriftState = %q, want acme_drift", got)
	}
	if got := BucketDriftState(fleetwatch.Subjects{}); got != "fw_drift" {
		t.Errorf("BucketDriftState (default prefix) = %q, want fw_drift", got)
	}

	bkv, err := OpenBaselines(t.Context(), js, subj)
	if err != nil {
		t.Fatal(err)
	}
	skv, err := OpenDriftStates(t.Context(), js, subj)
	if err != nil {
		t.Fatal(err)
	}
	var baselines probes.Store = KVBaselines{KV: bkv}
	var states probes.Store = KVStates{KV: skv}
	if _, err := baselines.Load(t.Context(), "p", "b"); !errors.Is(err, probes.ErrNoBaseline) {
		t.Errorf("baseline of a new backend: %v, want probes.ErrNoBaseline", err)
	}
	if _, err := states.Load(t.Context(), "p", "b"); !errors.Is(err, probes.ErrNoState) {
		t.Errorf("state of a new backend: %v, want probes.ErrNoState", err)
	}
	if err := baselines.Save(t.Context(), "p", "b.1", []byte("base")); err != nil {
		t.Fatal(err)
	}
	if err := states.Save(t.Context(), "p", "b.1", []byte("state")); err != nil {
		t.Fatal(err)
	}
	if got, err := baselines.Load(t.Context(), "p", "b.1"); err != nil || string(got) != "base" {
		t.Errorf("baseline = %q, %v; want base", got, err)
	}
	if got, err := states.Load(t.Context(), "p", "b.1"); err != nil || string(got) != "state" {
		t.Errorf("state = %q, %v; want state", got, err)
	}
	if e, err := bkv.Get(t.Context(), Key("p", "b.1")); err != nil || string(e.Value()) != "base" {
		t.Errorf("the baseline is not under Key(p, b.1): %v", err)
	}

	if _, _, err := LastReview(t.Context(), js, subj); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("LastReview without %s: %v, want ErrStreamNotFound", subj.StreamDrift(), err)
	}
	if _, err := EnsureDriftStream(t.Context(), js, subj); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := LastReview(t.Context(), js, subj); ok || err != nil {
		t.Errorf("LastReview of an empty stream: %v, %v; want none", ok, err)
	}
	at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	alert, _ := json.Marshal(fleetwatch.DriftAlert{Pool: "p", Backend: "b.1", Status: fleetwatch.DriftOK, At: fleetwatch.At(at)})
	review, _ := json.Marshal(fleetwatch.DriftReview{At: fleetwatch.At(at)})
	if _, err := js.Publish(t.Context(), subj.Drift("p"), alert); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), subj.DriftReview(), review); err != nil {
		t.Fatal(err)
	}
	alerts, reviews, err := ReadDrift(t.Context(), js, subj, time.Now().Add(-time.Hour))
	if err != nil || len(alerts) != 1 || len(reviews) != 1 || alerts[0].Backend != "b.1" {
		t.Errorf("ReadDrift = %d alerts, %d reviews, %v; want 1 and 1", len(alerts), len(reviews), err)
	}
	if last, ok, err := LastReview(t.Context(), js, subj); err != nil || !ok || !last.Equal(at) {
		t.Errorf("LastReview = %v, %v, %v; want %v", last, ok, err, at)
	}
}

func TestOpenOverrides(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	js, err := jetstream.New(feedtest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{}
	kv, err := OpenOverrides(t.Context(), js, subj, 1)
	if err != nil {
		t.Fatal(err)
	}
	if kv.Bucket() != subj.BucketOverrides() {
		t.Errorf("bucket %s, want %s", kv.Bucket(), subj.BucketOverrides())
	}
	s, err := js.Stream(t.Context(), subj.StreamAudit())
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.MaxAge != AuditRetention || len(cfg.Subjects) != 1 || cfg.Subjects[0] != subj.OverridesAudit() {
		t.Errorf("audit stream %+v, want %s kept %v", cfg, subj.OverridesAudit(), AuditRetention)
	}
	if _, err := OpenOverrides(t.Context(), js, subj, 1); err != nil {
		t.Errorf("a second open: %v (it must be idempotent)", err)
	}
}
