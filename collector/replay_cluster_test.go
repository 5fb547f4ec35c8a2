package collector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

// TestReplayRidesOutANodeLoss kills, while a replay of an R3 FW_OUTCOMES
// runs on an in-process three-node cluster, the node that hosts the
// replay's consumer: the replay must still hand over every stored event,
// its ordered consumer recreated on another node, rather than end early
// (a takeover would then be abandoned and its pools stay silent).
func TestReplayRidesOutANodeLoss(t *testing.T) {
	t.Parallel()
	cluster, err := natsrv.StartCluster(natsrv.ClusterSettings{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Shutdown)
	nc, err := nats.Connect(cluster.ClientURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, _ := startCollector(t, nc, &recordingSink{}, Settings{StreamReplicas: 3})
	if !c.JetStream() {
		t.Fatal("no JetStream on the cluster")
	}
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	const messages, perMessage = 600, 5
	for i := range messages {
		var b strings.Builder
		for j := range perMessage {
			fmt.Fprintf(&b, `{"pool":"p%d","backend":"b%d","status":200,"ttft_ms":%d}`+"\n", i%7, j, i)
		}
		var err error
		for try := 0; try < 5; try++ { // a loaded machine can keep an R3 ack past the client's 5 s
			if _, err = js.Publish(ctx, fleetwatch.Subjects{}.Accepted("test"), []byte(b.String()), jetstream.WithMsgID(fmt.Sprint(i))); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("storing message %d: %v", i, err)
		}
	}

	var once sync.Once
	var killed string
	n, err := c.Replay(ctx, time.Now().Add(-time.Hour), func([]fleetwatch.Event) {
		once.Do(func() {
			killed = killConsumerHost(t, js, cluster)
		})
	})
	t.Logf("killed %s during the replay; replayed %d events: %v", killed, n, err)
	if err != nil || n != messages*perMessage {
		t.Errorf("replay after a node loss: %d events, %v; want %d, no error", n, err, messages*perMessage)
	}
}

// killConsumerHost shuts down the node that leads FW_OUTCOMES' only
// consumer (the replay's), or the stream's leader when the consumer's is
// not known, and returns its name.
func killConsumerHost(t *testing.T, js jetstream.JetStream, cluster *natsrv.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, "FW_OUTCOMES")
	if err != nil {
		t.Fatal(err)
	}
	leader := stream.CachedInfo().Cluster.Leader
	for list := stream.ListConsumers(ctx); ; {
		info, ok := <-list.Info()
		if !ok {
			break
		}
		if info.Cluster != nil && info.Cluster.Leader != "" {
			leader = info.Cluster.Leader
		}
	}
	for _, n := range cluster.Nodes {
		if n.NATS().Name() == leader {
			n.Shutdown()
			return leader
		}
	}
	t.Fatalf("no node named %q", leader)
	return ""
}

// nextStored waits again while the stream still holds what is left, and
// gives up after one wait once it no longer does (purged here, as messages
// that aged out).
func TestNextStoredWaitsOnlyWhileStored(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "s.x", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer filtered on a subject nothing is stored on stands for
	// one that cannot deliver (its node lost): the stream holds 1..3.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"s.none"}})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullExpiry(replayPullExpiry))
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	const wait = 300 * time.Millisecond
	agains := 0
	_, waited, err := nextStored(ctx, it, stream, 0, 3, wait, func(time.Duration) { agains++ })
	if !errors.Is(err, errNoneStored) || agains != replayStallWaits-1 || waited != replayStallWaits*wait {
		t.Errorf("stream holding the rest: %v after %v, %d waits again; want errNoneStored after %d waits", err, waited, agains, replayStallWaits)
	}
	if err := stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	agains = 0
	_, waited, err = nextStored(ctx, it, stream, 0, 3, wait, func(time.Duration) { agains++ })
	if !errors.Is(err, errNoneStored) || agains != 0 || waited != wait {
		t.Errorf("stream purged: %v after %v, %d waits again; want errNoneStored after one wait", err, waited, agains)
	}
}
