package feedtest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

func TestScriptPublishesSubjectAndKV(t *testing.T) {
	url, srv := NewServer(t)
	if !srv.JetStreamEnabled() {
		t.Fatal("NewServer without JetStream")
	}
	nc := Connect(t, url)
	sub, err := nc.SubscribeSync("acme.decisions.>")
	if err != nil {
		t.Fatal(err)
	}
	script := NewScript(t, nc, "acme")
	if !script.HasKV() {
		t.Fatal("HasKV() = false with JetStream")
	}
	at := time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)
	want := Snapshot("a/b", "e1", 3, at, Closed("x"), Open("y", at.Add(time.Minute), "why"))
	script.Publish(want)

	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got fleetwatch.Snapshot
	if err := json.Unmarshal(msg.Data, &got); err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "acme.decisions.a/b" {
		t.Errorf("subject %q", msg.Subject)
	}
	if diff := cmp.Diff(*want, got); diff != "" {
		t.Errorf("subject payload (-want +got):\n%s", diff)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), "acme_decisions")
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(context.Background(), "a/b")
	if err != nil {
		t.Fatal(err)
	}
	if string(entry.Value()) != string(msg.Data) {
		t.Errorf("KV value %s differs from the subject payload %s", entry.Value(), msg.Data)
	}
}

func TestScriptWithoutJetStream(t *testing.T) {
	url, srv := NewServer(t, WithoutJetStream())
	if srv.JetStreamEnabled() {
		t.Fatal("WithoutJetStream server has JetStream")
	}
	nc := Connect(t, url)
	sub, err := nc.SubscribeSync("fw.decisions.p")
	if err != nil {
		t.Fatal(err)
	}
	script := NewScript(t, nc, "")
	if script.HasKV() {
		t.Error("HasKV() = true without JetStream")
	}
	script.Publish(Snapshot("p", "e", 1, time.Now()))
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no snapshot on the subject: %v", err)
	}
}

func TestRestartOnSamePortAndStore(t *testing.T) {
	store := t.TempDir()
	url, srv := NewServer(t, WithStoreDir(store))
	script := NewScript(t, Connect(t, url), "")
	script.Put(Snapshot("p", "e", 7, time.Now()))
	srv.Shutdown()
	srv.WaitForShutdown()

	url2, _ := NewServer(t, WithStoreDir(store), WithPort(Port(srv)))
	if url2 != url {
		t.Fatalf("restarted at %s, want %s", url2, url)
	}
	js, _ := jetstream.New(Connect(t, url2))
	kv, err := js.KeyValue(context.Background(), "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), "p"); err != nil {
		t.Errorf("the restarted server lost the KV value: %v", err)
	}
}
