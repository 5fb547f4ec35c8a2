package fakeai

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// getMetrics returns the fake's /metrics page.
func getMetrics(t *testing.T, srv *Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// TestMetricsReflectInFlight: the vLLM gauges count the requests holding a
// slot as running and the queued ones as waiting, and the KV-cache usage
// follows running.
func TestMetricsReflectInFlight(t *testing.T) {
	srv := start(t, Settings{KVCacheRequests: 4, Behavior: Behavior{MaxConcurrent: 2, TTFT: time.Hour, Model: "m1"}})
	idle := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m1"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m1"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m1"} 0.0
`
	// The load gauges come first; the configuration info gauges follow
	// (identity.go).
	if got := getMetrics(t, srv); !strings.HasPrefix(got, idle) || !strings.Contains(got[len(idle):], "vllm:model_config_info{") {
		t.Errorf("idle /metrics:\n%s\nwant the load gauges:\n%s\nthen the info gauges", got, idle)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { post(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"}) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	eventually(t, "two running, one waiting", func() bool {
		page := getMetrics(t, srv)
		return strings.Contains(page, `vllm:num_requests_running{engine="0",model_name="m1"} 2.0`) &&
			strings.Contains(page, `vllm:num_requests_waiting{engine="0",model_name="m1"} 1.0`) &&
			strings.Contains(page, `vllm:kv_cache_usage_perc{engine="0",model_name="m1"} 0.5`)
	})
}

// TestORCAHeader: a non-streaming answer carries the ORCA report in the
// format asked for, exactly as vLLM writes it; no header without the ask,
// for an unknown format, or on a stream.
func TestORCAHeader(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	ask := func(format string, stream bool) http.Header {
		t.Helper()
		b, _ := json.Marshal(chatBody(map[string]any{"stream": stream}))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/chat/completions", bytes.NewReader(b))
		if format != "" {
			req.Header.Set("endpoint-load-metrics-format", format)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header
	}
	// The answering request is itself running: 1 of 32 in the KV cache.
	for _, tt := range []struct {
		format string
		stream bool
		want   string
	}{
		{"TEXT", false, "TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=0.03125"},
		{"text", false, "TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=0.03125"},
		{"JSON", false, `JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.03125}}`},
		{"", false, ""},
		{"BIN", false, ""},
		{"TEXT", true, ""},
	} {
		if got := ask(tt.format, tt.stream).Get("endpoint-load-metrics"); got != tt.want {
			t.Errorf("format %q stream %v: endpoint-load-metrics = %q, want %q", tt.format, tt.stream, got, tt.want)
		}
	}
}

func TestPyFloat(t *testing.T) {
	for v, want := range map[float64]string{0: "0.0", 3: "3.0", 0.4: "0.4", 1e-5: "1e-05", 1234567: "1234567.0", 1e16: "1e+16", 0.03125: "0.03125"} {
		if got := pyFloat(v); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", v, got, want)
		}
	}
}
