package serve

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestHARetakesALeaseNobodyHolds makes the server refuse renewals of three
// leases that nobody else holds, as an election longer than the lease TTL
// does (the bucket's max age removes the key meanwhile, or an unanswered
// renewal lands after all): the key purged, the key deleted, the key
// rewritten with this instance's name. The instance must take each lease
// again at a higher fence and keep its partition live throughout, not lose
// it and rebuild (its pools silent for the takeover).
func TestHARetakesALeaseNobodyHolds(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	a := startInstance(t, "a", haYAML(url, 1))
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, "fw_leases")
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "KV_fw_leases")
	if err != nil {
		t.Fatal(err)
	}
	fence := func(p int) uint64 { return a.ha.view.Load().fence[p] }
	before := map[int]uint64{0: fence(0), 1: fence(1), 2: fence(2)}

	var gone atomic.Int32 // a partition of the three not live at some poll
	watching, cancel := context.WithCancel(ctx)
	defer cancel()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for watching.Err() == nil {
			live := a.ha.view.Load().live
			for p := range 3 {
				if !live[p] {
					gone.Store(int32(p) + 1)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	if err := stream.Purge(ctx, jetstream.WithPurgeSubject("$KV.fw_leases.p.0")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "p.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "p.2", []byte(a.ha.id)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "three leases taken again", func() bool {
		return a.ha.retaken.Get() >= 3
	})
	cancel()
	<-polled
	if n := a.ha.lost.Get(); n != 0 {
		t.Errorf("%d leases lost, want none: a lease nobody else holds is taken again", n)
	}
	if p := gone.Load(); p != 0 {
		t.Errorf("partition %d stopped being live while its lease was taken again", p-1)
	}
	for p, f := range before {
		if got := fence(p); got <= f {
			t.Errorf("partition %d: fence %d after the retake, want above %d", p, got, f)
		}
		e, err := kv.Get(ctx, leaseKey(p))
		if err != nil || string(e.Value()) != a.ha.id {
			t.Errorf("partition %d: lease key %v (%v), want this instance's", p, e, err)
		}
	}
	if got := a.ownedPartitions(); len(got) != 8 {
		t.Errorf("partitions %v held, want all 8", got)
	}

	// A key another instance holds is not taken: the lease is lost.
	if _, err := kv.Put(ctx, "p.3", []byte("someone-else")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "partition 3 lost to its other holder", func() bool {
		return a.ha.lost.Get() == 1 && !a.ha.view.Load().held[3]
	})
	if n := a.ha.retaken.Get(); n != 3 {
		t.Errorf("%d leases taken again, want 3: a key naming another instance is theirs", n)
	}
}
