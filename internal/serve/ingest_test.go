package serve

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

const ingestToken = "ingest-test-token"

// startIngestServer runs serve with a bearer token and the given ingest
// block, and returns it with a connection to its NATS server.
func startIngestServer(t *testing.T, ingestYAML string) *running {
	t.Helper()
	yaml := "http: {bearer_token_env: FW_TOKEN}\nprobes: {disabled: true}\nanalyzer: {min_requests: 10}\n" + ingestYAML
	getenv := func(k string) string {
		if k == "FW_TOKEN" {
			return ingestToken
		}
		return ""
	}
	r := startServer(t, yaml, Options{Getenv: getenv})
	// The collector subscribes as Run starts, beside the HTTP server:
	// wait until it consumes, so that no event the test posts is
	// published before anyone listens.
	nc := feedtest.Connect(t, r.NATSURL())
	testkit.WaitConsuming(t, nc, testkit.SubscribeSnapshots(t, nc), "warmup", "w")
	return r
}

// post sends body to path with the token (or none) and returns the status
// and the body.
func post(t *testing.T, url, contentType string, body []byte, token string, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// metricValue reads one series of serve's /metrics.
func metricValue(t *testing.T, r *running, series string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.httpURL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+ingestToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestIngestOutcomesHTTP: POST /v1/outcomes takes NDJSON behind the bearer
// token, rejects the bad lines with the collector's reasons (listed in the
// answer and counted under fleetwatch_ingest_rejects_total), publishes the
// rest on fw.outcomes.<pool>, where the collector takes them, and the
// failures open the failing backend's breaker.
func TestIngestOutcomesHTTP(t *testing.T) {
	r := startIngestServer(t, "ingest: {max_body_bytes: 8192}\n")
	nc := feedtest.Connect(t, r.NATSURL())
	events := testkit.CollectEvents(t, nc)
	snaps := testkit.SubscribeSnapshots(t, nc)

	var body bytes.Buffer
	for i := range 30 {
		fmt.Fprintf(&body, `{"pool":"p","backend":"dead","status":503,"source":"edge"}`+"\n")
		fmt.Fprintf(&body, `{"pool":"p","backend":"good","status":200,"ttft_ms":%d}`+"\n", 100+i)
		if i == 3 {
			body.WriteString(`{"pool":"p","backend":"good","status":200,"ttft_ms":-1}` + "\n") // line 9
			body.WriteString("\n")                                                             // line 10: blank
			body.WriteString(`{"pool":"p",` + "\n")                                            // line 11
		}
	}
	if code, _ := post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", body.Bytes(), ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", code)
	}
	if code, _ := post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", body.Bytes(), "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d, want 401", code)
	}
	code, raw := post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", body.Bytes(), ingestToken)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/outcomes: %d %s", code, raw)
	}
	var res ingest.Response
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	want := ingest.Response{Accepted: 60, Rejected: 2, Rejects: []ingest.Rejected{
		{Index: 8, Line: 9, Reason: fleetwatch.ReasonOutOfRange, Error: "ttft_ms out of range"},
		{Index: 9, Line: 11, Reason: fleetwatch.ReasonBadJSON, Error: "bad json at offset 12"},
	}}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
	testkit.Eventually(t, 20*time.Second, "the collector to take the 60 events", func() bool {
		return r.IngestStats().AcceptedTotal() >= 61
	})
	testkit.Eventually(t, 20*time.Second, "dead to open", func() bool {
		b, ok := snaps.Backend("p", "dead")
		return ok && b.State == fleetwatch.StateOpen
	})
	if n := events.Messages("fw.outcomes.p"); n == 0 {
		t.Errorf("no message on fw.outcomes.p")
	}
	sources := map[string]int{}
	for _, ev := range events.Events() {
		sources[ev.Source]++
	}
	if diff := cmp.Diff(map[string]int{"edge": 30, config.DefaultIngestSource: 30}, sources); diff != "" {
		t.Errorf("sources (-want +got):\n%s", diff)
	}
	for series, want := range map[string]string{
		`fleetwatch_ingest_rejects_total{reason="out_of_range"}`:                           "1",
		`fleetwatch_ingest_rejects_total{reason="bad_json"}`:                               "1",
		`fleetwatch_ingest_adapter_rejects_total{adapter="outcomes",reason="bad_json"}`:    "1",
		`fleetwatch_ingest_adapter_events_total{adapter="outcomes"}`:                       "60",
		`fleetwatch_ingest_adapter_requests_total{adapter="outcomes"}`:                     "1",
		`fleetwatch_ingest_adapter_rejects_total{adapter="litellm",reason="out_of_range"}`: "0",
	} {
		if got := metricValue(t, r, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}

	// All rejected: 400. Beyond max_body_bytes: 413, nothing published.
	code, raw = post(t, r.httpURL+"/v1/outcomes", "application/json", []byte(`{"pool":"p"}`), ingestToken)
	if code != http.StatusBadRequest || !strings.Contains(string(raw), `"missing_field"`) {
		t.Errorf("an invalid event: %d %s", code, raw)
	}
	big := bytes.Repeat([]byte(`{"pool":"p","backend":"good","status":200}`+"\n"), 300)
	code, raw = post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", big, ingestToken)
	if code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of %d bytes: %d %s, want 413", len(big), code, raw)
	}
	// The limit holds after decompression too; a small gzip body is fine.
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(big)
	zw.Close()
	if code, _ := post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", zipped.Bytes(), ingestToken, "Content-Encoding", "gzip"); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a gzip body of %d bytes unpacked: %d, want 413", len(big), code)
	}
	zipped.Reset()
	zw = gzip.NewWriter(&zipped)
	zw.Write(big[:len(big)/10])
	zw.Close()
	if code, raw := post(t, r.httpURL+"/v1/outcomes", "application/x-ndjson", zipped.Bytes(), ingestToken, "Content-Encoding", "gzip"); code != http.StatusOK {
		t.Errorf("a small gzip body: %d %s", code, raw)
	}
	if got := metricValue(t, r, `fleetwatch_ingest_adapter_too_large_total{adapter="outcomes"}`); got != "2" {
		t.Errorf("too_large = %q, want 2", got)
	}
}

// litellmPayload is a LiteLLM StandardLoggingPayload as its generic_api
// callback posts it (the fields that matter, plus some that do not).
func litellmPayload(group, apiBase, status string, start, firstChunk, end float64, errorCode string) map[string]any {
	p := map[string]any{
		"id": "chatcmpl-1", "call_type": "acompletion", "status": status,
		"model": "openai/" + group, "model_group": group, "model_id": "deploy-" + apiBase,
		"api_base": apiBase, "startTime": start, "endTime": end, "completionStartTime": firstChunk,
		"response_time": end - start, "prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46,
		"cache_hit": nil, "metadata": map[string]any{"user_api_key_hash": "x"}, "messages": []any{},
		"hidden_params": map[string]any{"api_base": apiBase, "model_id": "deploy"},
		"error_str":     nil, "error_information": nil,
	}
	if status == "failure" {
		p["error_str"] = "litellm.RateLimitError: boom"
		p["error_information"] = map[string]any{"error_code": errorCode, "error_class": "RateLimitError", "llm_provider": "openai"}
	}
	return p
}

// TestIngestLiteLLM: LiteLLM's logging payloads, in each of the callback's
// log formats (json_array, ndjson, single), become outcome events whose pool
// is the model group and whose backend is the configured backend of the
// api_base (or the api_base itself), with TTFT from completionStartTime.
func TestIngestLiteLLM(t *testing.T) {
	r := startIngestServer(t, `pools:
  - id: gpt-4o
    backends:
      - id: azure-east
        url: https://east.example.com/v1
`)
	nc := feedtest.Connect(t, r.NATSURL())
	events := testkit.CollectEvents(t, nc)
	const t0 = 1767225600.0 // 2026-01-01T00:00:00Z
	ok := litellmPayload("gpt-4o", "https://east.example.com/v1", "success", t0, t0+0.25, t0+1.5, "")
	throttled := litellmPayload("gpt-4o", "http://10.0.0.7:8000", "failure", t0, t0, t0+0.1, "429")
	cached := litellmPayload("gpt-4o", "https://east.example.com/v1", "success", t0, t0, t0, "")
	cached["cache_hit"] = true

	array, _ := json.Marshal([]any{ok, throttled, cached, "not an object"})
	code, raw := post(t, r.httpURL+"/v1/ingest/litellm", "application/json", array, ingestToken)
	if code != http.StatusOK {
		t.Fatalf("json_array: %d %s", code, raw)
	}
	var res ingest.Response
	json.Unmarshal(raw, &res)
	if res.Accepted != 2 || res.Skipped == nil || *res.Skipped != 1 || res.Rejected != 1 || res.Rejects[0].Reason != fleetwatch.ReasonBadJSON {
		t.Errorf("json_array answer: %s", raw)
	}
	var ndjson bytes.Buffer
	for range 2 {
		b, _ := json.Marshal(ok)
		ndjson.Write(append(b, '\n'))
	}
	if code, raw := post(t, r.httpURL+"/v1/ingest/litellm", "application/json", ndjson.Bytes(), ingestToken); code != http.StatusOK || !strings.Contains(string(raw), `"accepted":2`) {
		t.Errorf("ndjson: %d %s", code, raw)
	}
	single, _ := json.MarshalIndent(throttled, "", "  ")
	if code, raw := post(t, r.httpURL+"/v1/ingest/litellm", "application/json", single, ingestToken); code != http.StatusOK || !strings.Contains(string(raw), `"accepted":1`) {
		t.Errorf("single: %d %s", code, raw)
	}

	testkit.Eventually(t, 10*time.Second, "5 events", func() bool { return len(events.Events()) >= 5 })
	got := events.Events()
	wantOK := fleetwatch.Event{
		Pool: "gpt-4o", Backend: "azure-east", TS: time.Unix(int64(t0)+1, 5e8).UTC(),
		Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, TTFTMs: 250, HasTTFT: true,
		DurationMs: 1500, HasDuration: true, InputTokens: 12, OutputTokens: 34, Source: config.DefaultIngestSource,
	}
	wantThrottled := fleetwatch.Event{
		Pool: "gpt-4o", Backend: "http://10.0.0.7:8000", TS: time.Unix(int64(t0), 1e8).UTC(),
		Status: 429, HasStatus: true, Outcome: fleetwatch.OutcomeThrottled,
		DurationMs: 100, HasDuration: true, InputTokens: 12, OutputTokens: 34, Source: config.DefaultIngestSource,
	}
	if diff := cmp.Diff([]fleetwatch.Event{wantOK, wantThrottled, wantOK, wantOK, wantThrottled}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	testkit.Eventually(t, 10*time.Second, "the collector to take them", func() bool {
		return r.IngestStats().AcceptedTotal() >= 6
	})
	if got := metricValue(t, r, `fleetwatch_ingest_adapter_skipped_total{adapter="litellm",reason="no_upstream"}`); got != "1" {
		t.Errorf("skipped cache hits = %q, want 1", got)
	}
}

// TestIngestOTLPTraces: spans of the GenAI semantic conventions, exported
// by the real OpenTelemetry Go SDK over OTLP/HTTP (protobuf, gzip, bearer
// token), become outcome events on real NATS, and the failing server's
// breaker opens; a span that is not GenAI is skipped; JSON works too.
func TestIngestOTLPTraces(t *testing.T) {
	r := startIngestServer(t, `ingest:
  upstreams:
    - match: 10.0.0.9:8000
      backend: gpu-9
`)
	nc := feedtest.Connect(t, r.NATSURL())
	events := testkit.CollectEvents(t, nc)
	snaps := testkit.SubscribeSnapshots(t, nc)

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	exp, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpoint(r.HTTPAddr()), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + ingestToken}),
		otlptracehttp.WithCompression(otlptracehttp.GzipCompression),
		otlptracehttp.WithHTTPClient(client))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "chat-app"))))
	tracer := tp.Tracer("fleetwatch-test")
	span := func(server string, port int, fail string) {
		start := time.Now().Add(-800 * time.Millisecond)
		_, s := tracer.Start(context.Background(), "chat llama", trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start))
		s.SetAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.provider.name", "openai"),
			attribute.String("gen_ai.request.model", "llama3:8b"),
			attribute.String("gen_ai.response.model", "llama3-8b-instruct"),
			attribute.String("server.address", server), attribute.Int("server.port", port),
			attribute.Int("gen_ai.usage.input_tokens", 20), attribute.Int("gen_ai.usage.output_tokens", 7),
		)
		if fail != "" {
			s.SetAttributes(attribute.String("error.type", fail))
			s.SetStatus(codes.Error, "upstream failed")
		} else {
			s.SetAttributes(attribute.Float64("gen_ai.response.time_to_first_chunk", 0.125))
		}
		s.End(trace.WithTimestamp(start.Add(800 * time.Millisecond)))
	}
	for range 30 {
		span("10.0.0.9", 8000, "")
		span("10.0.0.8", 8000, "500")
	}
	span("10.0.0.8", 8000, "timeout")
	_, plain := tracer.Start(context.Background(), "GET /health")
	plain.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatalf("the exporter failed: %v", err)
	}

	testkit.Eventually(t, 20*time.Second, "61 events", func() bool { return len(events.Events()) >= 61 })
	counts := map[string]int{}
	for _, ev := range events.Events() {
		if ev.Pool != "llama3_8b" {
			t.Fatalf("event of pool %q: %+v", ev.Pool, ev)
		}
		counts[ev.Backend+" "+ev.Outcome.String()]++
		if ev.Backend == "gpu-9" && (!ev.HasTTFT || ev.TTFTMs != 125 || ev.InputTokens != 20 || ev.OutputTokens != 7 || !ev.HasDuration || ev.DurationMs != 800 || ev.TS.IsZero()) {
			t.Errorf("ok event %+v", ev)
		}
	}
	if diff := cmp.Diff(map[string]int{"gpu-9 ok": 30, "10.0.0.8:8000 error": 30, "10.0.0.8:8000 timeout": 1}, counts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	testkit.Eventually(t, 20*time.Second, "10.0.0.8:8000 to open", func() bool {
		b, ok := snaps.Backend("llama3_8b", "10.0.0.8:8000")
		return ok && b.State == fleetwatch.StateOpen
	})
	if got := metricValue(t, r, `fleetwatch_ingest_adapter_skipped_total{adapter="otlp",reason="not_llm"}`); got != "1" {
		t.Errorf("skipped = %q, want 1", got)
	}

	// OTLP/HTTP JSON, answered in JSON; a bad body gets 400 and a Status.
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	s := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	s.Attributes().PutStr("gen_ai.request.model", "json-model")
	s.Attributes().PutStr("server.address", "json-host")
	s.SetStartTimestamp(pcommon.NewTimestampFromTime(time.Now().Add(-time.Second)))
	s.SetEndTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	bad := rs.ScopeSpans().At(0).Spans().AppendEmpty()
	bad.Attributes().PutStr("gen_ai.request.model", strings.Repeat("m", 300)) // too long a pool id
	bad.Attributes().PutStr("server.address", "json-host")
	body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	code, raw := post(t, r.httpURL+"/v1/traces", "application/json", body, ingestToken)
	resp := ptraceotlp.NewExportResponse()
	if err := resp.UnmarshalJSON(raw); code != http.StatusOK || err != nil || resp.PartialSuccess().RejectedSpans() != 1 {
		t.Errorf("JSON export: %d %s (%v)", code, raw, err)
	}
	if code, raw := post(t, r.httpURL+"/v1/traces", "application/x-protobuf", []byte("\xff\xff\xff"), ingestToken); code != http.StatusBadRequest {
		t.Errorf("garbage: %d %s, want 400", code, raw)
	}
	if code, _ := post(t, r.httpURL+"/v1/traces", "text/plain", body, ingestToken); code != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d, want 415", code)
	}
	if code, _ := post(t, r.httpURL+"/v1/traces", "application/json", body, ""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	testkit.Eventually(t, 10*time.Second, "the JSON span's event", func() bool {
		for _, ev := range events.Events() {
			if ev.Pool == "json-model" && ev.Backend == "json-host" && ev.Outcome == fleetwatch.OutcomeOK {
				return true
			}
		}
		return false
	})
}
