package collector

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// limitSink tracks at most maxPools pools, like the analyzer's limits: an
// event of another pool is refused with too_many_pools.
type limitSink struct {
	maxPools int

	mu       sync.Mutex // guards pools and accepted
	pools    map[string]bool
	accepted int
}

func (s *limitSink) Observe(batch []fleetwatch.Event) bool {
	s.ObserveRefusing(batch, nil)
	return false
}

func (s *limitSink) ObserveRefusing(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (bool, []fleetwatch.Refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools == nil {
		s.pools = map[string]bool{}
	}
	for i := range batch {
		p := batch[i].Pool
		if !s.pools[p] && len(s.pools) >= s.maxPools {
			refused = append(refused, fleetwatch.Refusal{Index: i, Reason: fleetwatch.ReasonTooManyPools})
			continue
		}
		s.pools[p] = true
		s.accepted++
	}
	return false, refused
}

func (s *limitSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// TestRefusedEventsAreRejected: events a RefusingSink refuses are rejected
// with the sink's reason, counted by reason and by source (at most
// MaxRejectSources sources, then "other"), and described on fw.rejects.
func TestRefusedEventsAreRejected(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	rejects, err := nc.SubscribeSync("fw.rejects")
	if err != nil {
		t.Fatal(err)
	}
	set := metrics.NewSet()
	sink := &limitSink{maxPools: 1}
	c, _ := startCollector(t, nc, sink, Settings{Metrics: set, MaxRejectSources: 2, NoJetStream: true})

	var lines []string
	lines = append(lines, `{"pool":"real","backend":"b","status":200,"source":"edge-1"}`)
	for i := range 10 {
		lines = append(lines, fmt.Sprintf(`{"pool":"invented-%d","backend":"b","status":200,"source":"src-%d"}`, i, i%4))
	}
	lines = append(lines, `{"pool":"invented-x","backend":"b","status":200}`)
	publish(t, nc, "fw.outcomes.flood", strings.Join(lines, "\n"))

	waitFor(t, "11 refusals", func() bool { return c.Stats().Rejected[fleetwatch.ReasonTooManyPools] == 11 })
	if got := sink.count(); got != 1 {
		t.Errorf("sink accepted %d events, want 1", got)
	}
	msg, err := rejects.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no reject notice: %v", err)
	}
	var notice fleetwatch.Reject
	if err := json.Unmarshal(msg.Data, &notice); err != nil {
		t.Fatal(err)
	}
	if notice.Code != fleetwatch.ReasonTooManyPools || notice.Reason != "too many pools" || notice.Source != "src-0" ||
		!strings.Contains(notice.Sample, `"pool":"invented-0"`) {
		t.Errorf("notice = %+v", notice)
	}

	var text strings.Builder
	set.WritePrometheus(&text)
	got := map[string]bool{}
	for _, line := range strings.Split(text.String(), "\n") {
		if strings.HasPrefix(line, "fleetwatch_ingest_rejects_by_source_total") {
			got[line] = true
		}
	}
	// src-0 and src-1 came first (3 events each); src-2 and src-3 are
	// "other" (2 each); the event without source is "unknown".
	want := map[string]bool{
		`fleetwatch_ingest_rejects_by_source_total{reason="too_many_pools",source="src-0"} 3`:   true,
		`fleetwatch_ingest_rejects_by_source_total{reason="too_many_pools",source="src-1"} 3`:   true,
		`fleetwatch_ingest_rejects_by_source_total{reason="too_many_pools",source="other"} 4`:   true,
		`fleetwatch_ingest_rejects_by_source_total{reason="too_many_pools",source="unknown"} 1`: true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rejects by source (-want +got):\n%s", diff)
	}
}

// TestStreamBuffersBounded: a burst of more distinct pools than
// maxStreamPools is republished at once rather than held, one buffer per
// pool.
func TestStreamBuffersBounded(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	c, err := New(nc, &limitSink{maxPools: 1 << 30}, Settings{StreamFlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !c.JetStream() {
		t.Fatal("the test server has JetStream")
	}
	w := newWorker(c)
	var b strings.Builder
	for i := range 3 * maxStreamPools {
		fmt.Fprintf(&b, `{"pool":"p-%d","backend":"b","status":200}`+"\n", i)
	}
	w.onMsg(&nats.Msg{Subject: "fw.outcomes.flood", Data: []byte(b.String())})
	w.mu.Lock()
	held := len(w.pools)
	w.mu.Unlock()
	if held > maxStreamPools {
		t.Errorf("%d pools hold a republish buffer, want at most %d", held, maxStreamPools)
	}
	if got := c.Stats().StreamPublished; got < 2*maxStreamPools {
		t.Errorf("republished %d batches during the burst, want at least %d", got, 2*maxStreamPools)
	}
	w.flush(false)
	w.flush(true)
}
