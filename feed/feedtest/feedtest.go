// Package feedtest holds test helpers for code that talks to fleetwatch over
// NATS: an embedded nats-server on a random loopback port with a per-test
// JetStream store, a connected client, and Script, a scripted decision
// snapshot publisher for router tests.
//
// It imports nats-server directly, a documented exception to DESIGN.md's
// import table: it exists so that every test in the project uses a real
// server the same way (nats-server's own test harness does the same: port -1,
// a temporary store, shutdown in cleanup). Import it from tests only.
package feedtest

import (
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Option changes how NewServer starts its server.
type Option func(*server.Options)

// WithoutJetStream starts a core-NATS-only server.
func WithoutJetStream() Option {
	return func(o *server.Options) { o.JetStream = false }
}

// WithStoreDir uses dir as the JetStream store instead of a fresh
// t.TempDir(), so that a restarted server finds the previous one's state.
func WithStoreDir(dir string) Option {
	return func(o *server.Options) { o.StoreDir = dir }
}

// WithPort listens on port instead of a random one, so that a restarted
// server is found by clients of the previous one.
func WithPort(port int) Option {
	return func(o *server.Options) { o.Port = port }
}

// WithMaxPayload sets the server's max_payload (default 1 MiB), to test
// what a publisher does with a message the server would refuse.
func WithMaxPayload(n int32) Option {
	return func(o *server.Options) { o.MaxPayload = n }
}

// NewServer starts an embedded NATS server on 127.0.0.1 with a random port
// and JetStream in a t.TempDir() store, and shuts it down in t.Cleanup. It
// returns the client URL and the server (tests may shut it down earlier, for
// example to exercise reconnects; shutting down twice is harmless).
func NewServer(t testing.TB, opts ...Option) (url string, srv *server.Server) {
	t.Helper()
	o := &server.Options{
		ServerName: "feedtest",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   t.TempDir(),
	}
	for _, opt := range opts {
		opt(o)
	}
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("feedtest: new server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("feedtest: server not ready for connections")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv.ClientURL(), srv
}

// Port returns the client port of srv, for WithPort on a restart. It works
// after srv was shut down too.
func Port(srv *server.Server) int {
	u, err := url.Parse(srv.ClientURL())
	if err != nil {
		return 0
	}
	port, _ := strconv.Atoi(u.Port())
	return port
}

// Connect connects a client to url and closes it in t.Cleanup. The client
// reconnects forever with a short wait, so tests that restart the server see
// it come back quickly.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("feedtest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
