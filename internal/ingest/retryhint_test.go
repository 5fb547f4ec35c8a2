package ingest_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
)

// A failed LiteLLM call's retry_after_ms is the provider's stated wait,
// from the logged response headers or the error message.
func TestMapLiteLLMRetryHints(t *testing.T) {
	const base = `"status":"failure","model_group":"g","api_base":"x","endTime":"2026-12-03T08:00:00Z"`
	tests := []struct {
		name    string
		payload string
		want    float64
	}{
		{"retry-after in response_headers", `{` + base + `,"error_information":{"error_code":"429"},"response_headers":{"retry-after":"7"}}`, 7000},
		{"openai reset as LiteLLM logs it", `{` + base + `,"error_information":{"error_code":429},` +
			`"hidden_params":{"additional_headers":{"llm_provider-x-ratelimit-reset-requests":"2m0s","x_ratelimit_remaining_requests":0}}}`, 120_000},
		{"retry-after-ms as a number", `{` + base + `,"error_information":{"error_code":429},"hidden_params":{"response_headers":{"Retry-After-Ms":1500}}}`, 1500},
		{"anthropic reset against endTime", `{` + base + `,"error_information":{"error_code":429},` +
			`"response_headers":{"anthropic-ratelimit-tokens-reset":"2026-12-03T08:00:30Z"}}`, 30_000},
		{"google retryDelay in error_message", `{` + base + `,"error_information":{"error_code":"429","error_message":` +
			`"litellm.RateLimitError: VertexAIException - {\n  \"error\": {\"code\": 429, \"details\": [{\"@type\": \"type.googleapis.com/google.rpc.RetryInfo\", \"retryDelay\": \"180s\"}]}}"}}`, 180_000},
		{"retryDelay in error_str", `{` + base + `,"error_information":{"error_code":503},"error_str":"{\"error\":{\"retryDelay\":\"20s\"}}"}`, 20_000},
		{"capped at an hour", `{` + base + `,"error_information":{"error_code":429},"response_headers":{"retry-after":"86400"}}`, retryhint.MaxMs},
		{"a 500's reset headers say nothing", `{` + base + `,"error_information":{"error_code":500},"response_headers":{"x-ratelimit-reset-requests":"2m0s"}}`, 0},
		{"a success is never throttled", `{"status":"success","model_group":"g","api_base":"x","response_headers":{"retry-after":"7"}}`, 0},
		{"malformed", `{` + base + `,"error_information":{"error_code":429},"response_headers":{"retry-after":"soon"}}`, 0},
		{"headers not an object", `{` + base + `,"error_information":{"error_code":429},"response_headers":"retry-after: 7"}`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ev fleetwatch.Event
			if skip, err := ingest.MapLiteLLM([]byte(tc.payload), ingest.LiteLLMSettings{}, nil, &ev); err != nil || skip != "" {
				t.Fatalf("skip %q err %v", skip, err)
			}
			if diff := cmp.Diff(tc.want, ev.RetryAfterMs); diff != "" {
				t.Errorf("retry_after_ms (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMapSpanRetryHints(t *testing.T) {
	end := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		attrs   map[string]any
		message string // the span's status message
		want    float64
	}{
		{"retry-after as a string array", map[string]any{"http.response.status_code": 429, "http.response.header.retry-after": []any{"12"}}, "", 12_000},
		{"openai reset as a string", map[string]any{"http.response.status_code": 429, "http.response.header.x-ratelimit-reset-tokens": "1m30.5s"}, "", 90_500},
		{"anthropic reset against the span's end", map[string]any{"http.response.status_code": 429,
			"http.response.header.anthropic-ratelimit-requests-reset": []any{"2026-12-03T08:01:00Z"}}, "", 60_000},
		{"google retryDelay in the status message", map[string]any{"http.response.status_code": 429},
			`429 RESOURCE_EXHAUSTED {"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`, 30_000},
		{"empty array", map[string]any{"http.response.status_code": 429, "http.response.header.retry-after": []any{}}, "", 0},
		{"a success", map[string]any{"http.response.header.retry-after": []any{"12"}}, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			span := ptrace.NewSpan()
			span.SetStartTimestamp(pcommon.NewTimestampFromTime(end.Add(-time.Second)))
			span.SetEndTimestamp(pcommon.NewTimestampFromTime(end))
			attrs := map[string]any{"gen_ai.request.model": "m", "server.address": "h"}
			for k, v := range tc.attrs {
				attrs[k] = v
			}
			if err := span.Attributes().FromRaw(attrs); err != nil {
				t.Fatal(err)
			}
			if tc.message != "" {
				span.Status().SetCode(ptrace.StatusCodeError)
				span.Status().SetMessage(tc.message)
			}
			var ev fleetwatch.Event
			if skip := ingest.MapSpan(span, pcommon.NewMap(), ingest.OTLPSettings{}, nil, &ev); skip != "" {
				t.Fatalf("skip %q", skip)
			}
			if diff := cmp.Diff(tc.want, ev.RetryAfterMs); diff != "" {
				t.Errorf("retry_after_ms (-want +got):\n%s", diff)
			}
		})
	}
}

// Malformed hints are counted per adapter and source.
func TestRetryHintMalformedCounted(t *testing.T) {
	h, base := startHTTP(t)
	body := `{"status":"failure","model_group":"g","api_base":"x","error_information":{"error_code":429},"response_headers":{"x-ratelimit-reset-requests":"soon"}}`
	if code, raw := postBody(t, base+"/v1/ingest/litellm", "application/json", []byte(body)); code != 200 {
		t.Fatalf("litellm: %d %s", code, raw)
	}
	td := ptrace.NewTraces()
	span := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	span.SetEndTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	span.Attributes().FromRaw(map[string]any{"gen_ai.request.model": "m", "server.address": "h",
		"http.response.status_code": 503, "http.response.header.retry-after": []any{"-4"}})
	raw, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	if code, raw := postBody(t, base+"/v1/traces", "application/x-protobuf", raw); code != 200 {
		t.Fatalf("otlp: %d %q", code, raw)
	}
	got := map[string]uint64{
		"litellm": h.Metrics(ingest.AdapterLiteLLM).RetryHintsMalformed(retryhint.ResetRequests),
		"otlp":    h.Metrics(ingest.AdapterOTLP).RetryHintsMalformed(retryhint.RetryAfter),
	}
	if diff := cmp.Diff(map[string]uint64{"litellm": 1, "otlp": 1}, got); diff != "" {
		t.Errorf("malformed (-want +got):\n%s", diff)
	}
}
