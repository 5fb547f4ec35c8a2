package natsrv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterKeepsAReplicatedBucketWithANodeDown: a KV bucket of three
// replicas on a three-node cluster keeps its values and takes writes after
// one node shuts down.
func TestClusterKeepsAReplicatedBucketWithANodeDown(t *testing.T) {
	c, err := StartCluster(ClusterSettings{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	nc, err := nats.Connect(c.ClientURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	c.Nodes[0].Shutdown()
	var e jetstream.KeyValueEntry
	for {
		// Each attempt has its own timeout: a put sent while the client
		// reconnects, or before the stream has a new leader, gets no
		// answer at all and would otherwise wait for the whole deadline.
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err = kv.Put(actx, "k2", []byte("2")); err == nil {
			e, err = kv.Get(actx, "k")
		}
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the bucket is not usable with a node down: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if string(e.Value()) != "1" {
		t.Errorf("k = %q after a node went down, want 1", e.Value())
	}
}
