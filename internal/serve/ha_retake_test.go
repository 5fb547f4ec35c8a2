package serve

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestHARetakesALeaseNobodyHolds changes four lease keys under a live
// instance on a real JetStream (internal/ha's tests cover the timing in
// simulated time): a key purged (as a bucket made again, or a key aged out
// in a long election: nobody held it since) and a key rewritten with this
// instance's name (an unanswered renewal that landed after all) are taken
// again in place, at a higher fence, without the partition ever stopping
// being live; a key deleted (by an operator: someone may have held it) and
// a key naming another instance are lost, their pools forgotten, and taken
// back with a rebuild once the other holder is seen not to renew.
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
	before := map[int]uint64{}
	for p := range 4 {
		before[p] = a.leases.Fence(p)
	}

	var gone atomic.Int32 // partition 0 or 2 not live at some poll
	watching, cancel := context.WithCancel(ctx)
	defer cancel()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for watching.Err() == nil {
			v := a.leases.View()
			for _, p := range []int{0, 2} {
				if !v.Live(p) {
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
	if _, err := kv.Put(ctx, "p.2", []byte(a.leases.ID())); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "p.3", []byte("someone-else")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "two leases taken again, two lost", func() bool {
		st := a.leases.Stats()
		return st.Retaken >= 2 && st.Lost >= 2
	})
	cancel()
	<-polled
	if p := gone.Load(); p != 0 {
		t.Errorf("partition %d stopped being live while its lease was taken again", p-1)
	}
	if st := a.leases.Stats(); st.Retaken != 2 || st.Lost != 2 {
		t.Errorf("%d leases taken again and %d lost, want 2 and 2", st.Retaken, st.Lost)
	}
	// The two lost are taken back once observed for a TTL (3 s here),
	// with a rebuild, under higher fences.
	testkit.Eventually(t, 20*time.Second, "every partition held again", func() bool {
		return len(a.ownedPartitions()) == 8
	})
	for p, f := range before {
		if got := a.leases.Fence(p); got <= f {
			t.Errorf("partition %d: fence %d now, want above %d", p, got, f)
		}
		e, err := kv.Get(ctx, leaseKey(p))
		if err != nil || string(e.Value()) != a.leases.ID() {
			t.Errorf("partition %d: lease key %v (%v), want this instance's", p, e, err)
		}
	}
}

func leaseKey(p int) string { return fmt.Sprintf("p.%d", p) }
