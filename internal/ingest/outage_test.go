package ingest_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestNATSOutage: while the NATS server is down, a log adapter's events
// wait in the connection's reconnect buffer (bounded: 16 KiB here) and
// reach the server when it is back; what does not fit is refused, counted
// as unpublished, and nothing else is lost or sent twice.
func TestNATSOutage(t *testing.T) {
	port := freePort(t)
	store := t.TempDir()
	url, srv := feedtest.NewServer(t, feedtest.WithPort(port), feedtest.WithStoreDir(store))
	reconnected := make(chan struct{}, 1)
	nc := feedtest.Connect(t, url,
		nats.ReconnectBufSize(16<<10), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	// The publisher's own subscription: nats.go sends it again on
	// reconnecting, before the buffered messages.
	got, err := nc.SubscribeSync("fw.outcomes.>")
	if err != nil {
		t.Fatal(err)
	}
	m := ingest.NewMetrics(nil, ingest.AdapterNginx)
	in, err := ingest.NewLogIngester(ingest.LogSettings{
		Format: ingest.AdapterNginx, Pool: "chat",
		Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{}),
		Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	line := func(i int) []byte {
		return fmt.Appendf(nil, `{"time":"2026-12-03T08:00:00Z","upstream_addr":"10.0.0.%d:8000","upstream_status":"200","upstream_header_time":"0.120","upstream_response_time":"1.500","status":"200"}`, i%250+1)
	}
	count := func() int {
		n := 0
		for {
			msg, err := got.NextMsg(2 * time.Second)
			if err != nil {
				return n
			}
			n += bytes.Count(msg.Data, []byte("\n")) // one NDJSON line per event
		}
	}

	// Connected: one event per line.
	for i := range 10 {
		if err := in.Lines([][]byte{line(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 10 {
		t.Fatalf("connected: %d events arrived, want 10", n)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.Eventually(t, 10*time.Second, "the client to notice", func() bool { return !nc.IsConnected() })
	const sent = 400 // about 100 KiB of events: several times the buffer
	refused := 0
	for i := range sent {
		if err := in.Lines([][]byte{line(i)}); err != nil {
			refused++
		}
	}
	if refused == 0 || refused == sent {
		t.Fatalf("%d of %d lines refused during the outage, want some but not all (a bounded buffer)", refused, sent)
	}
	if got := int(m.Unpublished.Get()); got != refused {
		t.Errorf("unpublished = %d, want %d (one event per refused line)", got, refused)
	}
	if got := int(m.PublishErrs.Get()); got != refused {
		t.Errorf("publish errors = %d, want %d", got, refused)
	}

	feedtest.NewServer(t, feedtest.WithPort(port), feedtest.WithStoreDir(store))
	select {
	case <-reconnected:
	case <-time.After(20 * time.Second):
		t.Fatal("no reconnect")
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, want := count(), sent-refused; n != want {
		t.Errorf("after the outage %d events arrived, want the %d buffered ones", n, want)
	}
	if got, want := int(m.Events.Get()), 10+sent-refused; got != want {
		t.Errorf("events counted published = %d, want %d", got, want)
	}
}
