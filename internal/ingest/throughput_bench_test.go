package ingest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// The throughput of each ingest path against publishing the same events
// straight to NATS, in one run (BENCHMARKS.md "Ingest paths"):
//
//	go test -run '^$' -bench IngestPath -benchmem ./internal/ingest
//
// One op is one batch of benchEvents events: 4 pools x 10 backends, ok
// with TTFT and duration, as a proxy reports them. Every path ends in
// publishes to a real embedded NATS server over loopback; the HTTP paths
// go through a real socket, one request at a time on one kept-alive
// connection (on 2 shared cores, concurrent requests measured no faster).
// events/s is the figure to compare.
const benchEvents = 100

type benchEvent struct {
	pool, host string
	port       int
	ttftMs     int
	durMs      int
}

func benchBatch() []benchEvent {
	out := make([]benchEvent, benchEvents)
	for i := range out {
		out[i] = benchEvent{pool: fmt.Sprintf("pool-%d", i%4), host: fmt.Sprintf("10.0.0.%d", i%10), port: 8000, ttftMs: 100 + i, durMs: 900 + i}
	}
	return out
}

func (e benchEvent) outcomeJSON(ts string) string {
	return fmt.Sprintf(`{"pool":%q,"backend":"%s:%d","ts":%q,"status":200,"outcome":"ok","ttft_ms":%d,"duration_ms":%d}`,
		e.pool, e.host, e.port, ts, e.ttftMs, e.durMs)
}

// nginxLine is the event as the documented JSON log_format writes it.
func (e benchEvent) nginxLine(now time.Time) string {
	return fmt.Sprintf(`{"msec":"%d.%03d","status":"200","upstream_name":%q,"upstream_addr":"%s:%d","upstream_status":"200","upstream_header_time":"%.3f","upstream_response_time":"%.3f"}`,
		now.Unix(), now.Nanosecond()/1e6, e.pool, e.host, e.port, float64(e.ttftMs)/1000, float64(e.durMs)/1000)
}

func benchNATS(b *testing.B) *nats.Conn {
	url, _ := feedtest.NewServer(b)
	return feedtest.Connect(b, url)
}

func reportRate(b *testing.B, start time.Time) {
	b.ReportMetric(float64(b.N*benchEvents)/time.Since(start).Seconds(), "events/s")
}

// serveHTTP serves the HTTP adapters on a loopback socket and returns
// their base URL and metrics.
func serveHTTP(b *testing.B, nc *nats.Conn) (string, *ingest.HTTP) {
	h := ingest.NewHTTP(ingest.HTTPSettings{Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{Source: "bench"})})
	mux := http.NewServeMux()
	h.Register(mux)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	b.Cleanup(func() { srv.Close(); <-done })
	return "http://" + ln.Addr().String(), h
}

func post(b *testing.B, c *http.Client, url, ct string, body []byte) {
	resp, err := c.Post(url, ct, bytes.NewReader(body))
	if err != nil {
		b.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Errorf("%s: status %d", url, resp.StatusCode)
	}
}

func BenchmarkIngestPath(b *testing.B) {
	evs := benchBatch()
	ts := time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00")

	// Baselines: the events published straight to NATS, as a proxy that
	// speaks the protocol does: one message per event, or one NDJSON
	// message per batch. Flushed (a round trip to the server) at the end.
	b.Run("nats-direct-per-event", func(b *testing.B) {
		nc := benchNATS(b)
		msgs := make([][]byte, len(evs))
		for i, e := range evs {
			msgs[i] = []byte(e.outcomeJSON(ts))
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			for _, m := range msgs {
				if err := nc.Publish("fw.outcomes.bench", m); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		reportRate(b, start)
	})
	var ndjson bytes.Buffer
	for _, e := range evs {
		ndjson.WriteString(e.outcomeJSON(ts) + "\n")
	}
	b.Run("nats-direct-ndjson", func(b *testing.B) {
		nc := benchNATS(b)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if err := nc.Publish("fw.outcomes.bench", ndjson.Bytes()); err != nil {
				b.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		reportRate(b, start)
	})

	// POST /v1/outcomes: the NDJSON batch in one request.
	b.Run("http-outcomes-ndjson", func(b *testing.B) {
		nc := benchNATS(b)
		base, h := serveHTTP(b, nc)
		c := &http.Client{}
		b.Cleanup(c.CloseIdleConnections)
		b.ReportAllocs()
		b.SetBytes(int64(ndjson.Len()))
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			post(b, c, base+"/v1/outcomes", "application/x-ndjson", ndjson.Bytes())
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		reportRate(b, start)
		if got := h.Metrics(ingest.AdapterOutcomes).Events.Get(); got != uint64(b.N*benchEvents) {
			b.Fatalf("%d events accepted, want %d", got, b.N*benchEvents)
		}
	})

	// POST /v1/traces: the batch as 100 GenAI spans in one binary protobuf
	// ExportTraceServiceRequest, as an OTLP/HTTP exporter sends it.
	b.Run("otlp-http-protobuf", func(b *testing.B) {
		nc := benchNATS(b)
		base, h := serveHTTP(b, nc)
		td := ptrace.NewTraces()
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", "gateway")
		spans := rs.ScopeSpans().AppendEmpty().Spans()
		end := time.Now()
		for _, e := range evs {
			s := spans.AppendEmpty()
			s.SetName("chat " + e.pool)
			s.SetKind(ptrace.SpanKindClient)
			a := s.Attributes()
			a.PutStr("gen_ai.operation.name", "chat")
			a.PutStr("gen_ai.request.model", e.pool)
			a.PutStr("server.address", e.host)
			a.PutInt("server.port", int64(e.port))
			a.PutDouble("gen_ai.response.time_to_first_chunk", float64(e.ttftMs)/1000)
			a.PutInt("gen_ai.usage.input_tokens", 1200)
			a.PutInt("gen_ai.usage.output_tokens", 350)
			s.SetStartTimestamp(pcommon.NewTimestampFromTime(end.Add(-time.Duration(e.durMs) * time.Millisecond)))
			s.SetEndTimestamp(pcommon.NewTimestampFromTime(end))
		}
		body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		if err != nil {
			b.Fatal(err)
		}
		c := &http.Client{}
		b.Cleanup(c.CloseIdleConnections)
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			post(b, c, base+"/v1/traces", "application/x-protobuf", body)
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		reportRate(b, start)
		if got := h.Metrics(ingest.AdapterOTLP).Events.Get(); got != uint64(b.N*benchEvents) {
			b.Fatalf("%d events accepted, want %d", got, b.N*benchEvents)
		}
	})

	// fleetwatch ingest nginx: the batch as nginx JSON access log lines,
	// b.N batches written to a file before the clock starts, then read by
	// the tailer (RunLog, offset file included) from its start until every
	// event is published and flushed.
	b.Run("nginx-tail-file", func(b *testing.B) {
		nc := benchNATS(b)
		dir := b.TempDir()
		logFile := filepath.Join(dir, "access.log")
		f, err := os.Create(logFile)
		if err != nil {
			b.Fatal(err)
		}
		w := bufio.NewWriterSize(f, 1<<20)
		now := time.Now()
		var lines bytes.Buffer
		for _, e := range evs {
			lines.WriteString(e.nginxLine(now) + "\n")
		}
		for range b.N {
			w.Write(lines.Bytes())
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		m := ingest.NewMetrics(nil, ingest.AdapterNginx)
		in, err := ingest.NewLogIngester(ingest.LogSettings{
			Format:  ingest.AdapterNginx,
			Mapping: ingest.NewMapping(nil, false, ""),
			Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{Source: "bench"}),
			Metrics: m,
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		b.ReportAllocs()
		b.SetBytes(int64(lines.Len()))
		b.ResetTimer()
		start := time.Now()
		go func() {
			stopped <- ingest.RunLog(ctx, ingest.LogRunSettings{Ingester: in, File: logFile,
				Tail: ingest.TailSettings{OffsetFile: filepath.Join(dir, "offset"), FromStart: true, Poll: time.Millisecond}})
		}()
		want := uint64(b.N * benchEvents)
		for m.Events.Get() < want {
			select {
			case err := <-stopped:
				b.Fatalf("RunLog ended: %v", err)
			case <-time.After(100 * time.Microsecond):
			}
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		reportRate(b, start)
		b.StopTimer()
		cancel()
		<-stopped
		if p := m.ParseErrors.Get(); p != 0 {
			b.Fatalf("%d parse errors", p)
		}
	})
}
