package feed

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// bigSnapshot is a pool of n closed backends b-000, b-001, ... whose
// requests grow with the index, with b-007 and b-011 open and b-013
// half-open (few requests each).
func bigSnapshot(pool string, n int) *fleetwatch.Snapshot {
	var backends []fleetwatch.Backend
	for i := range n {
		b := feedtest.Closed(fmt.Sprintf("b-%03d", i))
		b.Requests = int64(100 + i)
		b.Reason = "a reason long enough to make each entry of the snapshot a few hundred bytes"
		switch i {
		case 7, 11:
			b = feedtest.Open(b.Backend, t0.Add(time.Minute), "5 consecutive failures")
		case 13:
			b.State, b.Weight = fleetwatch.StateHalfOpen, 0.05
		}
		backends = append(backends, b)
	}
	return feedtest.Snapshot(pool, "e", 1, t0, backends...)
}

// TestPublisherTruncatesOverMaxPayload: a snapshot larger than the
// server's max_payload is published truncated on the subject and in the
// KV, keeping open and half-open backends, then configured ones, then the
// busiest, sorted by id, with truncated and backends_total set.
func TestPublisherTruncatesOverMaxPayload(t *testing.T) {
	const maxPayload = 8192
	url, _ := feedtest.NewServer(t, feedtest.WithMaxPayload(maxPayload))
	nc := feedtest.Connect(t, url)
	sub, err := nc.SubscribeSync("fw.decisions.>")
	if err != nil {
		t.Fatal(err)
	}
	var logs []string
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{
		Configured: func(pool, backend string) bool { return pool == "big" && backend == "b-002" },
		Logf:       func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := bigSnapshot("big", 200)
	if full, _ := json.Marshal(snap); len(full) < 5*maxPayload {
		t.Fatalf("the test snapshot is only %d bytes", len(full))
	}
	if err := p.Publish(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no truncated snapshot on the subject: %v", err)
	}
	if len(msg.Data) > maxPayload {
		t.Errorf("published %d bytes, over max_payload %d", len(msg.Data), maxPayload)
	}
	var got fleetwatch.Snapshot
	if err := json.Unmarshal(msg.Data, &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("truncated snapshot does not validate: %v", err)
	}
	if !got.Truncated || got.BackendsTotal != 200 || len(got.Backends) < 5 || len(got.Backends) >= 200 {
		t.Fatalf("truncated = %v, backends_total = %d, %d backends kept", got.Truncated, got.BackendsTotal, len(got.Backends))
	}
	var ids []string
	minRequests := int64(1 << 62)
	for _, b := range got.Backends {
		ids = append(ids, b.Backend)
		if b.State == fleetwatch.StateClosed && b.Backend != "b-002" {
			minRequests = min(minRequests, b.Requests)
		}
	}
	for _, must := range []string{"b-007", "b-011", "b-013", "b-002"} {
		if !slices.Contains(ids, must) {
			t.Errorf("kept %v, which lacks %s", ids, must)
		}
	}
	if !slices.IsSorted(ids) {
		t.Errorf("kept backends are not sorted by id: %v", ids)
	}
	// The other kept backends are the busiest: every closed backend left
	// out has fewer requests than every one kept.
	for _, b := range snap.Backends {
		if !slices.Contains(ids, b.Backend) && b.Requests >= minRequests {
			t.Errorf("%s (%d requests) left out while one with %d was kept", b.Backend, b.Requests, minRequests)
		}
	}
	if got := p.truncated.Get(); got != 1 {
		t.Errorf("truncated counter = %d, want 1", got)
	}
	if len(logs) == 0 {
		t.Error("truncation was not logged")
	}
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(t.Context(), "big")
	if err != nil {
		t.Fatalf("the truncated snapshot is not in the KV: %v (put errors %d)", err, p.kvPutErrs.Get())
	}
	if string(entry.Value()) != string(msg.Data) {
		t.Errorf("KV value differs from the subject's")
	}

	// A snapshot that fits is sent whole.
	small := bigSnapshot("small", 3)
	if err := p.Publish(t.Context(), small); err != nil {
		t.Fatal(err)
	}
	msg, err = sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var whole fleetwatch.Snapshot
	if err := json.Unmarshal(msg.Data, &whole); err != nil {
		t.Fatal(err)
	}
	if whole.Truncated || whole.BackendsTotal != 0 || len(whole.Backends) != 3 {
		t.Errorf("small snapshot: truncated %v, backends_total %d, %d backends", whole.Truncated, whole.BackendsTotal, len(whole.Backends))
	}
}

func TestSnapshotValidateBackendsTotal(t *testing.T) {
	snap := bigSnapshot("p", 3)
	snap.Truncated, snap.BackendsTotal = true, 2
	if err := snap.Validate(); !errors.Is(err, fleetwatch.ErrOutOfRange) {
		t.Errorf("backends_total below the backends listed: Validate = %v, want ErrOutOfRange", err)
	}
	snap.BackendsTotal = 10
	if err := snap.Validate(); err != nil {
		t.Errorf("a valid truncated snapshot: %v", err)
	}
}

// TestPublisherKVKeepsLatestPerPool: many pools published many times in a
// burst end up with their latest snapshot in the KV; every queued snapshot
// (and each pool's one key frame: the decisions do not change) was either
// put or superseded by a newer one of its key.
func TestPublisherKVKeepsLatestPerPool(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	p, err := NewPublisher(t.Context(), nc, PublisherSettings{KVEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	const pools, rounds = 300, 20
	for seq := uint64(1); seq <= rounds; seq++ {
		for i := range pools {
			if err := p.Publish(t.Context(), feedtest.Snapshot(fmt.Sprintf("pool-%03d", i), "e", seq, t0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if put, superseded, failed := p.kvPuts.Get(), p.kvSuperseded.Get(), p.kvPutErrs.Get(); put+superseded+failed != pools*rounds+pools || failed != 0 {
		t.Errorf("puts %d + superseded %d + failed %d, want %d with none failed", put, superseded, failed, pools*rounds+pools)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pools; i += 37 {
		entry, err := kv.Get(t.Context(), fmt.Sprintf("pool-%03d", i))
		if err != nil {
			t.Fatal(err)
		}
		var got fleetwatch.Snapshot
		if err := json.Unmarshal(entry.Value(), &got); err != nil {
			t.Fatal(err)
		}
		if got.Seq != rounds {
			t.Errorf("pool-%03d: KV holds seq %d, want the latest %d", i, got.Seq, rounds)
		}
	}
}

// BenchmarkPublish is the caller's cost of one Publish of a 20-backend
// snapshot, on a JetStream server, cycling over 1,000 pools: the subject
// publish and the queueing of the KV put (the put itself runs on the
// worker). The baseline, in the same run, is what Publish did before: the
// encoding, the subject publish and a synchronous KV put.
func BenchmarkPublish(b *testing.B) {
	url, _ := feedtest.NewServer(b)
	nc := feedtest.Connect(b, url)
	var backends []fleetwatch.Backend
	for i := range 20 {
		backends = append(backends, feedtest.Closed(fmt.Sprintf("backend-%02d", i)))
	}
	snaps := make([]*fleetwatch.Snapshot, 1000)
	for i := range snaps {
		snaps[i] = feedtest.Snapshot(fmt.Sprintf("pool-%04d", i), "e", 1, t0, backends...)
	}
	p, err := NewPublisher(b.Context(), nc, PublisherSettings{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sync-kv-baseline", func(b *testing.B) {
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(b.Context(), "fw_decisions")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			snap := snaps[i%len(snaps)]
			data, err := json.Marshal(snap)
			if err != nil {
				b.Fatal(err)
			}
			if err := nc.Publish("fw.decisions."+snap.Pool, data); err != nil {
				b.Fatal(err)
			}
			if _, err := kv.Put(b.Context(), snap.Pool, data); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("publisher", func(b *testing.B) {
		superseded := p.kvSuperseded.Get()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := p.Publish(b.Context(), snaps[i%len(snaps)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.StopTimer()
		if err := p.Flush(b.Context()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(p.kvSuperseded.Get()-superseded)/float64(b.N), "superseded/op")
	})
}
