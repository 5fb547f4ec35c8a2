package serve

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestHACapacity measures the figures of docs/DEPLOY.md "Capacity": the
// event rate two instances take together (NDJSON batches of 100 events over
// 200 pools, each event taken by either collector and observed by its
// partition's owner), and the time a takeover's rebuild takes to replay
// those events. It is a measurement, run on demand:
//
//	FLEETWATCH_HA_CAPACITY=1 go test -count=1 -v -run TestHACapacity ./internal/serve
func TestHACapacity(t *testing.T) {
	if os.Getenv("FLEETWATCH_HA_CAPACITY") == "" {
		t.Skip("a measurement: set FLEETWATCH_HA_CAPACITY=1")
	}
	url, _ := feedtest.NewServer(t)
	yaml := strings.Replace(haYAML(url, 1), "lease_ttl: 3s", "lease_ttl: 5s", 1)
	a := startInstance(t, "a", yaml)
	b := startInstance(t, "b", yaml)
	ins := []*instance{a, b}
	testkit.Eventually(t, 30*time.Second, "the partitions spread", func() bool {
		ok, all, _ := exclusive(ins, 8)
		return ok && all && len(a.ownedPartitions()) == 4
	})
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const batches, perBatch = 4000, 100
	payloads := make([][]byte, 50)
	for i := range payloads {
		var sb strings.Builder
		for j := range perBatch {
			sb.WriteString(testkit.Event(fmt.Sprintf("pool-%d", (i*perBatch+j)%200), fmt.Sprintf("b%d", j%5), 200, 100) + "\n")
		}
		payloads[i] = []byte(sb.String())
	}
	start := time.Now()
	for i := range batches {
		if err := nc.Publish("fw.outcomes.bench", payloads[i%len(payloads)]); err != nil {
			t.Fatal(err)
		}
		if i%200 == 199 {
			time.Sleep(time.Millisecond) // let the server breathe: no slow consumer
		}
	}
	const want = batches * perBatch
	accepted := func() int { return int(a.IngestStats().AcceptedTotal() + b.IngestStats().AcceptedTotal()) }
	testkit.Eventually(t, 120*time.Second, "every event accepted", func() bool { return accepted() >= want })
	took := time.Since(start)
	var received uint64
	for _, in := range ins {
		received += in.m.fromOthers.Get()
	}
	report := fmt.Sprintf("two instances accepted %d events in %v: %.0f events/s together; %d were taken by the non-owner's collector and forwarded\n",
		want, took.Round(time.Millisecond), float64(want)/took.Seconds(), received)

	// b dies; a rebuilds b's partitions from the stream.
	killed := time.Now()
	b.kill()
	testkit.Eventually(t, 60*time.Second, "a to hold every partition", func() bool { return len(a.ownedPartitions()) == 8 })
	rebuilt := a.leases.LastRebuild()
	report += fmt.Sprintf("takeover of b's 4 partitions (about %d stored events of theirs) done %v after the kill (lease_ttl 5s); the last rebuild took %v\n",
		want/2, time.Since(killed).Round(time.Millisecond), rebuilt.Round(time.Millisecond))
	t.Log(report)
	_ = os.WriteFile(filepath.Join(testkit.ArtifactDir(t), "ha-capacity.txt"), []byte(report), 0o644)
}
