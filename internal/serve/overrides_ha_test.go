package serve

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestOverridesSharedByInstances runs two instances on one JetStream
// server and drains a backend of a pool owned by one through the HTTP API
// of the other: the owner publishes the drain, both list it.
func TestOverridesSharedByInstances(t *testing.T) {
	t.Parallel() // waits on leases mostly
	url, _ := feedtest.NewServer(t)
	yaml := haYAML(url, 1)
	a := startInstance(t, "a", yaml)
	b := startInstance(t, "b", yaml)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub := recordPublished(t, nc)
	pools := poolsPerPartition(8)
	var pool string
	testkit.Eventually(t, 30*time.Second, "the partitions spread over both instances", func() bool {
		trafficFor(t, nc, pools)
		ok, all, _ := exclusive([]*instance{a, b}, 8)
		if !ok || !all || len(b.ownedPartitions()) == 0 {
			return false
		}
		for _, p := range pools {
			if slices.Contains(b.ownedPartitions(), fleetwatch.PartitionOf(p, 8)) {
				pool = p
				return true
			}
		}
		return false
	})
	testkit.Eventually(t, 10*time.Second, "the pool published by b", func() bool {
		trafficFor(t, nc, pools)
		_, ok := pub.first(pool, time.Time{}, func(s *fleetwatch.Snapshot) bool { return s.Epoch == b.an.Epoch() && s.Find("good") != nil })
		return ok
	})

	// a knows b's pool from the decisions bucket, which b writes after it
	// publishes the snapshot (a loaded full suite once had a ask in
	// between and answer 404, unknown pool): a drain through a succeeds
	// once the bucket holds the pool, and an unknown pool changes nothing,
	// so the request is repeated while it is unknown.
	from := time.Now()
	req := control.OverrideRequest{Action: "drain", Pool: pool, Backend: "good", Reason: "rack move", For: "5m", Who: "dana"}
	var (
		code  int
		reply control.OverrideReply
	)
	testkit.Eventually(t, 10*time.Second, "a to know b's pool and take the drain", func() bool {
		code, reply = postOverride(t, "http://"+a.HTTPAddr(), req)
		return code != 404
	})
	if code != 200 {
		t.Fatalf("drain through a: %d %+v", code, reply)
	}
	testkit.Eventually(t, 10*time.Second, "b, the owner, to publish the drain set through a", func() bool {
		_, ok := pub.first(pool, from, func(s *fleetwatch.Snapshot) bool {
			g := s.Find("good")
			return s.Epoch == b.an.Epoch() && g != nil && g.Weight == 0 && g.Override != nil && g.Override.Who == "dana"
		})
		return ok
	})
	// Each instance lists what its own watch of the overrides bucket
	// delivered: b publishing the drain says nothing of when a's watch
	// delivers it (a full suite's load once showed a still empty then).
	for _, in := range []*instance{a, b} {
		testkit.Eventually(t, 10*time.Second, in.name+" to list the drain", func() bool {
			_, r := getOverrides(t, "http://"+in.HTTPAddr())
			return len(r.Overrides) == 1 && r.Overrides[0].Pool == pool
		})
	}

	// a does not own the pool: it knows its backends from the decisions
	// bucket, and refuses a typo naming them.
	code, reply = postOverride(t, "http://"+a.HTTPAddr(), control.OverrideRequest{Action: "drain", Pool: pool, Backend: "good-WRONG", Reason: "typo", For: "5m"})
	if want := "(known backends of " + pool + ": good)"; code != 404 || !strings.Contains(reply.Error, want) {
		t.Errorf("drain of %s/good-WRONG through a: %d %q, want 404 with %s", pool, code, reply.Error, want)
	}
	if _, r := getOverrides(t, "http://"+b.HTTPAddr()); len(r.Overrides) != 1 {
		t.Errorf("b lists %+v after a refused override, want the drain alone", r.Overrides)
	}
}
