package serve

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/fleetwatch/fleetwatch/internal/config"
)

func TestMain(m *testing.M) {
	testkit.RaiseParallel(4) // the end-to-end tests mostly wait for their servers
	goleak.VerifyTestMain(m,
		// The embedded server's and chromedp's background goroutines end
		// asynchronously after Shutdown/cancel returns.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("github.com/chromedp/chromedp.(*Browser).run"),
	)
}

// running is a Server started by startServer.
type running struct {
	*Server
	httpURL string
	cancel  context.CancelFunc
	done    chan error

	once sync.Once
	err  error
}

// stop ends Run (as a signal would) and returns its error; it may be called
// again and returns the same.
func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}

// startServer runs a Server in process from the YAML configuration yaml:
// an embedded NATS server and HTTP on random loopback ports, the data
// directory under t.TempDir(). It stops in t's cleanup (if not stopped
// before).
func startServer(t *testing.T, yaml string, opts Options) *running {
	t.Helper()
	return newServer(t, yaml, filepath.Join(t.TempDir(), "data"), opts).run(t)
}

// newServer builds a Server (New only: its NATS server is up, nothing runs
// yet) with data as its data directory.
func newServer(t *testing.T, yaml, data string, opts Options) *running {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.URL == "" {
		cfg.NATS.Listen = "127.0.0.1:-1"
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = data
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &running{Server: s, httpURL: "http://" + s.HTTPAddr(), done: make(chan error, 1)}
}

// run starts Run; t's cleanup stops it (if not stopped before).
func (r *running) run(t *testing.T) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}
