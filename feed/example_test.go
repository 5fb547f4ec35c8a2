package feed_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// A router follows one pool's decisions: it reads the current snapshot from
// the KV bucket at start, then applies every newer one, and uses Effective to
// fail static when the feed goes quiet.
func ExampleWatcher() {
	t := newExampleTB() // an Example has no *testing.T
	defer t.cleanup()

	url, _ := feedtest.NewServer(t)
	at := time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)
	// fleetwatch published this before the router started.
	feedtest.NewScript(t, feedtest.Connect(t, url), "").Publish(
		feedtest.Snapshot("llama-3.1-70b", "01JB4X", 1234, at,
			feedtest.Closed("vllm-a"),
			feedtest.Open("vllm-b", at.Add(30*time.Second), "error rate 0.42 >= 0.25 over 120 requests in 30s")))

	now := at.Add(time.Second) // the router's clock
	w, err := feed.NewWatcher(feedtest.Connect(t, url), feed.WatcherSettings{
		Pools: []string{"llama-3.1-70b"},
		Now:   func() time.Time { return now },
		OnUpdate: func(s *fleetwatch.Snapshot) {
			fmt.Printf("update: %s seq %d\n", s.Pool, s.Seq)
		},
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	<-w.Synced()

	v, _ := w.View("llama-3.1-70b")
	fmt.Println("stale:", v.Stale)
	for _, b := range v.Snapshot.Backends {
		fmt.Printf("%s %s weight %.0f\n", b.Backend, b.State, b.Weight)
	}

	// A minute later with no new snapshot: vllm-b's breaker has expired,
	// so the router spreads evenly on its own signals.
	later := feed.Effective(v.Snapshot, at.Add(time.Minute))
	for _, b := range later.Backends {
		fmt.Printf("stale view: %s %s weight %.0f\n", b.Backend, b.State, b.Weight)
	}

	cancel()
	<-done
	// Output:
	// update: llama-3.1-70b seq 1234
	// stale: false
	// vllm-a closed weight 1
	// vllm-b open weight 0
	// stale view: vllm-a closed weight 1
	// stale view: vllm-b closed weight 1
}

// exampleTB is the part of testing.TB that feedtest uses, for examples.
// The embedded interface is nil: any other method panics.
type exampleTB struct {
	testing.TB
	dir      string
	cleanups []func()
}

func newExampleTB() *exampleTB {
	dir, err := os.MkdirTemp("", "feed-example-")
	if err != nil {
		panic(err)
	}
	return &exampleTB{dir: dir}
}

func (t *exampleTB) Helper()                           {}
func (t *exampleTB) Name() string                      { return "example" }
func (t *exampleTB) TempDir() string                   { return t.dir }
func (t *exampleTB) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (t *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	_ = os.RemoveAll(t.dir)
}
