package ingest_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// BenchmarkAddRaw: validating and batching a /v1/outcomes body of 100
// events (go test -bench AddRaw -benchmem ./internal/ingest).
func BenchmarkAddRaw(b *testing.B) {
	var body bytes.Buffer
	for i := range 100 {
		fmt.Fprintf(&body, `{"pool":"p%d","backend":"b%d","status":200,"ttft_ms":%d,"duration_ms":900}`+"\n", i%4, i%10, 100+i)
	}
	e := ingest.NewEmitter(&recorder{}, ingest.EmitterSettings{})
	m := ingest.NewMetrics(nil, ingest.AdapterOutcomes)
	b.SetBytes(int64(body.Len()))
	b.ReportAllocs()
	for b.Loop() {
		batch := e.NewBatch(m)
		batch.AddRaw(body.Bytes(), 1)
		if batch.Accepted != 100 {
			b.Fatal(batch.Rejects)
		}
	}
}

// BenchmarkParseNginx: one JSON access log line with a retried upstream.
func BenchmarkParseNginx(b *testing.B) {
	line := []byte(`{"msec":"1764741600.123","status":"200","upstream_name":"llama","upstream_addr":"10.0.0.1:8000, 10.0.0.2:8000","upstream_status":"500, 200","upstream_header_time":"0.010, 0.150","upstream_response_time":"0.011, 1.250"}`)
	var out []ingest.Attempt
	b.ReportAllocs()
	for b.Loop() {
		out, _ = ingest.ParseNginx(line, out[:0])
	}
}

// BenchmarkParseHAProxy: one httplog line over syslog.
func BenchmarkParseHAProxy(b *testing.B) {
	line := []byte(`<134>Dec  3 06:00:00 haproxy[4242]: 10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe llama/s1 2/0/1/150/1203 200 512 - - ---- 3/3/1/1/0 0/0 "POST /v1/chat/completions HTTP/1.1"`)
	var out []ingest.Attempt
	b.ReportAllocs()
	for b.Loop() {
		out, _ = ingest.ParseHAProxy(ingest.SyslogMessage(line), out[:0])
	}
}
