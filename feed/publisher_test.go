package feed

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

var t0 = time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)

func TestPublisherSubjectAndKV(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	sub, err := nc.SubscribeSync("fw.decisions.>")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.KV() {
		t.Fatal("KV() = false on a JetStream server")
	}
	snap := feedtest.Snapshot("meta-llama/Llama-3.1-70B-Instruct", "e1", 7, t0,
		feedtest.Closed("vllm-a"), feedtest.Open("vllm-b", t0.Add(30*time.Second), "error rate 0.5"))
	if err := p.Publish(t.Context(), snap); err != nil {
		t.Fatal(err)
	}

	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := "fw.decisions.meta-llama/Llama-3.1-70B-Instruct"; msg.Subject != want {
		t.Errorf("subject = %q, want %q", msg.Subject, want)
	}
	var got fleetwatch.Snapshot
	if err := json.Unmarshal(msg.Data, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*snap, got); diff != "" {
		t.Errorf("subject payload (-want +got):\n%s", diff)
	}

	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(t.Context(), snap.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var fromKV fleetwatch.Snapshot
	if err := json.Unmarshal(entry.Value(), &fromKV); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*snap, fromKV); diff != "" {
		t.Errorf("KV value (-want +got):\n%s", diff)
	}
	if got := p.published.Get(); got != 1 {
		t.Errorf("published counter = %d, want 1", got)
	}
}

func TestPublisherWithoutJetStream(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	sub, err := nc.SubscribeSync("acme.decisions.p1")
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{Prefix: "acme", Logf: func(f string, _ ...any) {
		logged = append(logged, f)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if p.KV() {
		t.Error("KV() = true without JetStream")
	}
	if len(logged) == 0 {
		t.Error("no log line saying the KV is unavailable")
	}
	if err := p.Publish(t.Context(), feedtest.Snapshot("p1", "e", 1, t0)); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no snapshot on the subject: %v", err)
	}
}

func TestPublisherKVFailureStillPublishesSubject(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	// Delete the bucket under the publisher: every put now fails.
	js, _ := jetstream.New(nc)
	if err := js.DeleteKeyValue(t.Context(), "fw_decisions"); err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync("fw.decisions.p1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := p.Publish(ctx, feedtest.Snapshot("p1", "e", 1, t0)); err != nil {
		t.Errorf("Publish error = %v: the subject publish worked, and the KV put is asynchronous", err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no snapshot on the subject after a KV failure: %v", err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.kvPutErrs.Get(); got != 1 {
		t.Errorf("kv put errors = %d, want 1", got)
	}
}

func TestPublisherRejectsInvalidSnapshot(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync(fleetwatch.Subjects{}.DecisionsWildcard())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), nil); !errors.Is(err, ErrInvalidSnapshot) {
		t.Errorf("Publish(nil) error = %v, want ErrInvalidSnapshot", err)
	}
	overweight := feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("a"))
	overweight.Backends[0].Weight = 1.5
	tests := []struct {
		name string
		snap *fleetwatch.Snapshot
		kind error
	}{
		{"pool with a space", feedtest.Snapshot("bad pool", "e", 1, t0), fleetwatch.ErrInvalidPool},
		{"pool with ..", feedtest.Snapshot("a..b", "e", 1, t0), fleetwatch.ErrInvalidPool},
		{"backends not sorted", feedtest.Snapshot("p", "e", 1, t0, feedtest.Closed("b"), feedtest.Closed("a")), fleetwatch.ErrBadValue},
		{"weight above 1", overweight, fleetwatch.ErrOutOfRange},
	}
	for _, tt := range tests {
		err := p.Publish(t.Context(), tt.snap)
		if !errors.Is(err, ErrInvalidSnapshot) || !errors.Is(err, fleetwatch.ErrInvalidSnapshot) || !errors.Is(err, tt.kind) {
			t.Errorf("%s: Publish error = %v, want ErrInvalidSnapshot, fleetwatch.ErrInvalidSnapshot and %v", tt.name, err, tt.kind)
		}
	}
	// Nothing was sent: the first message on the subjects is the valid
	// snapshot published last.
	if err := p.Publish(t.Context(), feedtest.Snapshot("p", "e", 2, t0, feedtest.Closed("a"))); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got fleetwatch.Snapshot
	if err := json.Unmarshal(msg.Data, &got); err != nil || got.Seq != 2 {
		t.Errorf("first message on %s: seq %d (%v), want the valid snapshot, seq 2", msg.Subject, got.Seq, err)
	}
}

func TestPublisherClosedConnection(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := p.Publish(t.Context(), feedtest.Snapshot("p1", "e", 1, t0)); !errors.Is(err, ErrPublish) {
		t.Errorf("Publish on a closed connection: error = %v, want ErrPublish", err)
	}
	if got := p.publishErrs.Get(); got != 1 {
		t.Errorf("publish errors = %d, want 1", got)
	}
}

func TestPublisherAfterServerRestart(t *testing.T) {
	store := t.TempDir()
	url, srv := feedtest.NewServer(t, feedtest.WithStoreDir(store))
	nc := feedtest.Connect(t, url)
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), feedtest.Snapshot("p", "e", 1, t0)); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	url2, _ := feedtest.NewServer(t, feedtest.WithStoreDir(store), feedtest.WithPort(feedtest.Port(srv)))

	// The heartbeat keeps publishing; once the client is back, puts succeed.
	checker := feedtest.Connect(t, url2)
	js, _ := jetstream.New(checker)
	seq := uint64(1)
	waitFor(t, "a snapshot in the restarted server's KV", func() bool {
		seq++
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := p.Publish(ctx, feedtest.Snapshot("p", "e", seq, t0)); err != nil {
			return false
		}
		if err := p.Flush(ctx); err != nil {
			return false
		}
		kv, err := js.KeyValue(ctx, "fw_decisions")
		if err != nil {
			return false
		}
		entry, err := kv.Get(ctx, "p")
		if err != nil {
			return false
		}
		var got fleetwatch.Snapshot
		return json.Unmarshal(entry.Value(), &got) == nil && got.Seq == seq
	})
}
