package main

import (
	"github.com/fleetwatch/fleetwatch/internal/config"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

func TestCountContentEvents(t *testing.T) {
	tests := []struct {
		name  string
		chunk string
		want  int
	}{
		{"role chunk", `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n", 0},
		{"chat token", `data: {"choices":[{"delta":{"content":"hi"}}]}` + "\n\n", 1},
		{"completions token", `data: {"choices":[{"text":" x","index":0}]}` + "\n\n", 1},
		{"finish chunk", `data: {"choices":[{"delta":{},"finish_reason":"stop"}]}` + "\n\n", 0},
		{"done", "data: [DONE]\n\n", 0},
		{"three events", `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":""}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":"b"}}]}` + "\n\n", 2},
		{"no newline", `data: {"choices":[{"delta":{"content":"a"}}]}`, 1},
	}
	for _, tc := range tests {
		if got := countContentEvents([]byte(tc.chunk)); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestScanMeta(t *testing.T) {
	body := `{"id":"x","system_fingerprint":"fp_44709d6fcb","choices":[],` +
		`"usage":{"prompt_tokens":1200,"completion_tokens":350,"total_tokens":1550,"prompt_tokens_details":{"cached_tokens":1024}}}`
	var got responseMeta
	scanMeta([]byte(body), &got)
	want := responseMeta{promptTokens: 1200, completionTokens: 350, cachedTokens: 1024, fingerprint: "fp_44709d6fcb"}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(responseMeta{})); diff != "" {
		t.Errorf("meta (-want +got):\n%s", diff)
	}
}

func TestRetryAfterMs(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   float64
	}{
		{"none", http.Header{}, 0},
		{"seconds", http.Header{"Retry-After": {"2"}}, 2000},
		{"ms wins", http.Header{"Retry-After": {"2"}, "Retry-After-Ms": {"1500"}}, 1500},
		{"date", http.Header{"Retry-After": {now.Add(3 * time.Second).Format(http.TimeFormat)}}, 3000},
		{"date past", http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, 0},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0},
		{"capped", http.Header{"Retry-After": {"99999999"}}, fleetwatch.MaxDurationMs},
	}
	for _, tc := range tests {
		if got := retryAfterMs(tc.header, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBackendTarget(t *testing.T) {
	tests := []struct{ base, path, want string }{
		{"http://h:1", "/v1/completions", "http://h:1/v1/completions"},
		{"http://h:1/", "/v1/completions", "http://h:1/v1/completions"},
		{"http://h:1/v1", "/v1/chat/completions", "http://h:1/v1/chat/completions"},
		{"https://api.example.com/openai/v1/", "/v1/embeddings", "https://api.example.com/openai/v1/embeddings"},
	}
	for _, tc := range tests {
		pools, err := newRoutePools(&config.Config{Pools: []config.PoolConfig{{ID: "p", Backends: []config.BackendConfig{{ID: "b", URL: tc.base}}}}}, p2c.Settings{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pools["p"].backends["b"].target(tc.path); got != tc.want {
			t.Errorf("%s + %s = %s, want %s", tc.base, tc.path, got, tc.want)
		}
	}
}

// TestRouteTTFTIsTheFirstToken checks that a stream's TTFT is taken at the
// first content chunk, not at the headers (which the fake sends at once with
// a role-only chunk). A lower bound only: a timer never fires early.
func TestRouteTTFTIsTheFirstToken(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := collectRouteEvents(t, feedtest.Connect(t, natsURL))
	backends := startFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{TTFT: 150 * time.Millisecond})
	c := newRouteClient(t, startRouteCmd(t, routeConfig(t, natsURL, backends, "")))
	if r, err := c.chat("", "hello", true); err != nil || r.status != 200 {
		t.Fatalf("%v %d", err, r.status)
	}
	eventually(t, 30*time.Second, "the event", func() bool { return len(log.snapshot()) == 1 })
	ev := log.snapshot()[0]
	if !ev.HasTTFT || ev.TTFTMs < 150 || ev.DurationMs < ev.TTFTMs || ev.OutputTokens != 4 {
		t.Errorf("event ttft %v (has %v) duration %v output %d: want ttft >= 150 and 4 tokens",
			ev.TTFTMs, ev.HasTTFT, ev.DurationMs, ev.OutputTokens)
	}
}
