package route

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// batchSink records what an OutcomePublisher publishes.
type batchSink struct {
	mu      sync.Mutex
	batches []string
	fail    bool
}

func (s *batchSink) publish(subject string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("nats: connection closed")
	}
	s.batches = append(s.batches, subject+" "+string(data))
	return nil
}

func (s *batchSink) lines() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]string
	for _, b := range s.batches {
		out = append(out, strings.Split(strings.TrimSuffix(b, "\n"), "\n"))
	}
	return out
}

func counterValue(set *metrics.Set, name string) uint64 {
	return set.GetOrCreateCounter(name).Get()
}

func TestOutcomePublisherBatchesByTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sink batchSink
		set := metrics.NewSet()
		p := mustPublisher(t, PublisherSettings{Subject: "fw.outcomes.r1", Publish: sink.publish, Metrics: set})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		for _, b := range []string{"a", "b", "c"} {
			p.Publish(fleetwatch.Event{Pool: "p", Backend: b, Status: 200, HasStatus: true})
		}
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		if got := sink.lines(); len(got) != 0 {
			t.Errorf("published %v before the 10ms flush", got)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		want := [][]string{{
			`fw.outcomes.r1 {"v":1,"pool":"p","backend":"a","status":200,"outcome":"ok"}`,
			`{"v":1,"pool":"p","backend":"b","status":200,"outcome":"ok"}`,
			`{"v":1,"pool":"p","backend":"c","status":200,"outcome":"ok"}`,
		}}
		if diff := cmp.Diff(want, sink.lines()); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		// Closing flushes what is queued.
		p.Publish(fleetwatch.Event{Pool: "p", Backend: "d"})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := len(sink.lines()); n != 2 {
			t.Errorf("%d batches after close, want 2", n)
		}
		if got := counterValue(set, "fleetwatch_route_events_published_total"); got != 4 {
			t.Errorf("published counter %d, want 4", got)
		}
	})
}

func TestOutcomePublisherBatchesBySize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sink batchSink
		p := mustPublisher(t, PublisherSettings{Subject: "s", Publish: sink.publish, MaxBatch: 100, Interval: time.Hour})
		go p.Run(t.Context())
		for range 4 { // ~60 bytes each: a batch is flushed once it reaches 100
			p.Publish(fleetwatch.Event{Pool: "pool", Backend: "backend-x"})
		}
		synctest.Wait()
		got := sink.lines()
		if len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 2 {
			t.Errorf("batches %v, want two of two events", got)
		}
		p.Close()
		p.Wait()
	})
}

func TestOutcomePublisherNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := batchSink{fail: true}
		set := metrics.NewSet()
		p := mustPublisher(t, PublisherSettings{Subject: "s", Publish: sink.publish, Queue: 2, Metrics: set})
		// Not running: the queue holds two, the rest are dropped at once.
		for range 5 {
			p.Publish(fleetwatch.Event{Pool: "p", Backend: "b"})
		}
		if got := counterValue(set, "fleetwatch_route_events_dropped_total"); got != 3 {
			t.Errorf("dropped %d with a full queue, want 3", got)
		}
		// Running against a failing NATS: the two queued are dropped too.
		go p.Run(t.Context())
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if got := counterValue(set, "fleetwatch_route_events_dropped_total"); got != 5 {
			t.Errorf("dropped %d after failed publishes, want 5", got)
		}
		p.Close()
		p.Wait()
		p.Publish(fleetwatch.Event{Pool: "p", Backend: "b"})
		if got := counterValue(set, "fleetwatch_route_events_dropped_total"); got != 6 {
			t.Errorf("dropped %d after close, want 6", got)
		}
	})
}

func mustPublisher(t *testing.T, s PublisherSettings) *OutcomePublisher {
	t.Helper()
	p, err := NewOutcomePublisher(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewOutcomePublisherNeedsSubjectAndPublish(t *testing.T) {
	var sink batchSink
	for _, s := range []PublisherSettings{{Publish: sink.publish}, {Subject: "s"}} {
		if _, err := NewOutcomePublisher(s); !errors.Is(err, ErrPublisherSettings) {
			t.Errorf("NewOutcomePublisher(%+v) = %v, want ErrPublisherSettings", s, err)
		}
	}
}

// Through a real NATS server: the batches arrive as NDJSON that decodes to
// the events published, in order.
func TestOutcomePublisherOverNATS(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := testkit.CollectEvents(t, nc)
	p := mustPublisher(t, PublisherSettings{Subject: "fw.outcomes.edge-1", Publish: nc.Publish})
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }() // exits on Close
	var want []fleetwatch.Event
	for i := range 500 {
		ev := fleetwatch.Event{Pool: "p", Backend: fmt.Sprint("b", i%3), Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, Source: "edge-1"}
		want = append(want, ev)
		p.Publish(ev)
	}
	p.Close()
	// Close may come before Run has started: Run then publishes what was
	// queued and says ErrClosed.
	if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "500 events", func() bool { return len(log.Events()) == 500 })
	if diff := cmp.Diff(want, log.Events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestOutcomePublisherLifecycle(t *testing.T) {
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		var sink batchSink
		p := mustPublisher(t, PublisherSettings{Subject: "s", Publish: sink.publish})
		return testkit.Lifecycle{Run: p.Run, Close: func() error {
			err := p.Close()
			p.Wait() // the contract's Close returns once Run did
			return err
		}}
	}, ErrRunning, ErrClosed)
}
