package ingest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// startHTTP serves the HTTP adapters over a real NATS server.
func startHTTP(t *testing.T) (*ingest.HTTP, string) {
	t.Helper()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	h := ingest.NewHTTP(ingest.HTTPSettings{Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{})})
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return h, srv.URL
}

func postBody(t *testing.T, url, contentType string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// TestOTLPNotAccepted: a GenAI span with a negative token count is
// rejected as out_of_range, as on every other path; partial_success's
// rejected_spans counts every GenAI span that made no event (rejected, or
// skipped for no_pool or no_upstream), not the non-GenAI spans.
func TestOTLPNotAccepted(t *testing.T) {
	h, base := startHTTP(t)
	td := ptrace.NewTraces()
	spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	now := time.Now()
	span := func(attrs map[string]any) {
		s := spans.AppendEmpty()
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(now.Add(-time.Second)))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(now))
		if err := s.Attributes().FromRaw(attrs); err != nil {
			t.Fatal(err)
		}
	}
	span(map[string]any{"gen_ai.request.model": "m", "server.address": "h", "gen_ai.usage.input_tokens": 12})
	span(map[string]any{"gen_ai.request.model": "m", "server.address": "h", "gen_ai.usage.input_tokens": -3})
	span(map[string]any{"gen_ai.request.model": "m", "server.address": "h", "gen_ai.usage.output_tokens": "-1"})
	span(map[string]any{"gen_ai.request.model": "m"})                                 // no_upstream
	span(map[string]any{"gen_ai.operation.name": "chat", "server.address": "h"})      // no_pool
	span(map[string]any{"http.request.method": "GET", "server.address": "elsewhere"}) // not_llm
	body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	code, raw := postBody(t, base+"/v1/traces", "application/x-protobuf", body)
	resp := ptraceotlp.NewExportResponse()
	if err := resp.UnmarshalProto(raw); code != http.StatusOK || err != nil {
		t.Fatalf("export: %d %q (%v)", code, raw, err)
	}
	if got := resp.PartialSuccess().RejectedSpans(); got != 4 {
		t.Errorf("rejected_spans = %d, want 4 (two out of range, no_upstream, no_pool); %q", got, resp.PartialSuccess().ErrorMessage())
	}
	m := h.Metrics(ingest.AdapterOTLP)
	got := map[string]uint64{
		"events":       m.Events.Get(),
		"out_of_range": m.Rejected(fleetwatch.ReasonOutOfRange),
		"no_upstream":  m.Skipped(ingest.SkipNoUpstream),
		"no_pool":      m.Skipped(ingest.SkipNoPool),
		"not_llm":      m.Skipped(ingest.SkipNotLLM),
	}
	want := map[string]uint64{"events": 1, "out_of_range": 2, "no_upstream": 1, "no_pool": 1, "not_llm": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

// TestLiteLLMAnswer: the answer always carries `skipped`, zero included;
// a negative token count is rejected as out_of_range.
func TestLiteLLMAnswer(t *testing.T) {
	h, base := startHTTP(t)
	body := `[{"status":"success","model_group":"g","api_base":"http://a/v1","startTime":1764741600.0,"endTime":1764741601.0,"prompt_tokens":3},` +
		`{"status":"success","model_group":"g","api_base":"http://a/v1","prompt_tokens":-2}]`
	code, raw := postBody(t, base+"/v1/ingest/litellm", "application/json", []byte(body))
	var res map[string]any
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("%d %q: %v", code, raw, err)
	}
	if code != http.StatusOK || res["accepted"] != 1.0 || res["rejected"] != 1.0 || res["skipped"] != 0.0 {
		t.Errorf("answer %d %s, want 200 with accepted 1, rejected 1, skipped 0", code, raw)
	}
	if got := h.Metrics(ingest.AdapterLiteLLM).Rejected(fleetwatch.ReasonOutOfRange); got != 1 {
		t.Errorf("out_of_range rejects = %d, want 1", got)
	}
}
