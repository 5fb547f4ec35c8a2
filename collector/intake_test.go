package collector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// startIntakeCollector runs a collector with the durable intake until stop.
func startIntakeCollector(t *testing.T, nc *nats.Conn, sink Sink) (stop func()) {
	t.Helper()
	c, err := New(nc, sink, Settings{Intake: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestIntakeKeepsEventsPublishedWhileNoCollectorRuns: with the durable
// intake, events published before any collector runs, and between two
// collectors, all reach a sink once the next collector runs; none is lost
// and none is delivered twice.
func TestIntakeKeepsEventsPublishedWhileNoCollectorRuns(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	// The first collector creates the stream and its consumer, then stops.
	first := &recordingSink{}
	stopFirst := startIntakeCollector(t, nc, first)
	publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"live","status":200}`)
	waitFor(t, "the live event", func() bool { return first.len() == 1 })
	stopFirst()

	// Nobody consumes now: a core subscription would see none of these.
	const n = 300
	for i := range n {
		publish(t, nc, fmt.Sprintf("fw.outcomes.edge-%d", i%3), fmt.Sprintf(`{"pool":"p","backend":"b%d","status":500}`, i%7))
	}
	second := &recordingSink{}
	startIntakeCollector(t, nc, second)
	waitFor(t, "every event published while no collector ran", func() bool { return second.len() >= n })
	time.Sleep(200 * time.Millisecond) // a duplicate would arrive within this
	if got := second.len(); got != n {
		t.Errorf("the second collector got %d events, want exactly %d", got, n)
	}
	for _, ev := range second.snapshot() {
		if ev.Backend == "live" {
			t.Errorf("the event the first collector took was delivered again: %+v", ev)
		}
		if ev.Outcome != fleetwatch.OutcomeError || ev.TS.IsZero() {
			t.Errorf("event %+v: want an error with the time the stream stored it", ev)
		}
	}
}

// TestIntakeWithTwoCollectorsDeliversEachEventOnce: two collectors on one
// intake share the durable consumer; together they get every event, once.
func TestIntakeWithTwoCollectorsDeliversEachEventOnce(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	a, b := &recordingSink{}, &recordingSink{}
	startIntakeCollector(t, nc, a)
	startIntakeCollector(t, feedtest.Connect(t, url), b)
	const n = 2000
	for i := range n {
		if err := nc.Publish("fw.outcomes", fmt.Appendf(nil, `{"pool":"p","backend":"b%d","status":200}`, i%5)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	waitFor(t, "every event", func() bool { return a.len()+b.len() >= n })
	time.Sleep(200 * time.Millisecond)
	if got := a.len() + b.len(); got != n {
		t.Errorf("%d events in all, want exactly %d", got, n)
	}
}

func TestIntakeNeedsJetStream(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	if _, err := New(nc, &recordingSink{}, Settings{Intake: true, NoJetStream: true}); err == nil {
		t.Error("New with Intake and NoJetStream succeeded")
	}
}
