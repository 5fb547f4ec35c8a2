package route

import (
	"bytes"
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// llamaPool is one pool "llama" (model alias "llama-3.1-70b") over the fakes.
func llamaPool(backends []*fakeai.Server) Pool {
	p := Pool{ID: "llama", Models: []string{"llama-3.1-70b"}}
	for _, s := range backends {
		p.Backends = append(p.Backends, Backend{ID: s.Name(), URL: s.URL()})
	}
	return p
}

// testRouter is a Router wired as `fleetwatch route` wires it: an outcome
// publisher and a feed watcher on a real NATS connection, one metrics set,
// served on a loopback port.
type testRouter struct {
	*Router
	url     string
	set     *metrics.Set
	events  *OutcomePublisher
	watcher *feed.Watcher
}

// startRouter builds a router over pools with s (Pools, Publisher and
// Metrics are filled in), following and publishing on natsURL, and serves
// it; everything stops in t.Cleanup, in the order runRoute stops it.
func startRouter(t testing.TB, natsURL string, s Settings) *testRouter {
	t.Helper()
	nc := feedtest.Connect(t, natsURL)
	tr := &testRouter{set: metrics.NewSet()}
	var err error
	if s.Source == "" {
		s.Source = "test-route"
	}
	tr.events, err = NewOutcomePublisher(PublisherSettings{
		Subject: fleetwatch.Subjects{}.OutcomesFrom(s.Source),
		Publish: nc.Publish,
		Metrics: tr.set,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Publisher, s.Metrics = tr.events, tr.set
	tr.Router, err = New(s)
	if err != nil {
		t.Fatal(err)
	}
	tr.watcher, err = feed.NewWatcher(nc, feed.WatcherSettings{Pools: tr.Pools(), OnUpdate: tr.Apply, Metrics: tr.set})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); tr.events.Run(ctx) }()  // exits on cancel
	go func() { defer wg.Done(); tr.watcher.Run(ctx) }() // exits on cancel
	srv := httptest.NewServer(tr.Router)
	tr.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		tr.Close()
		cancel()
		wg.Wait()
	})
	return tr
}

// metricsText is what /metrics would serve.
func (tr *testRouter) metricsText() string {
	var b bytes.Buffer
	tr.set.WritePrometheus(&b)
	return b.String()
}

// testkit.ChatClient sends OpenAI requests to the router.
// eventually polls cond every 10ms until it holds, failing the test after
// timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyEvery(t, timeout, 10*time.Millisecond, what, cond)
}
