package route

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// checkRig is a router over one backend (so that no retry or pick gets in
// the way) publishing on real NATS, with the published events collected.
type checkRig struct {
	rt  *testRouter
	c   *testkit.ChatClient
	log *testkit.EventLog
}

func newCheckRig(t *testing.T, url string) *checkRig {
	t.Helper()
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	pool := Pool{ID: "llama", Models: []string{"llama-3.1-70b"}, Backends: []Backend{{ID: "b0", URL: url}}}
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}})
	return &checkRig{rt: rt, c: testkit.NewChatClient(rt.url), log: log}
}

// event waits for the only event and returns it.
func (r *checkRig) event(t *testing.T) fleetwatch.Event {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "the outcome event", func() bool { return len(r.log.Events()) >= 1 })
	evs := r.log.Events()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1: %+v", len(evs), evs)
	}
	return evs[0]
}

// fakeBackend starts a fake backend reporting the pool's model.
func fakeBackend(t *testing.T, b fakeai.Behavior) *fakeai.Server {
	t.Helper()
	if b.Model == "" {
		b.Model = "llama-3.1-70b"
	}
	srv, err := fakeai.Listen(fakeai.Settings{Name: "b0", Seed: 1, Behavior: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// sseBackend answers every request with the SSE body stream.
func sseBackend(t *testing.T, stream string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(stream))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

const anthropicStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"llama-3.1-70b\",\"stop_reason\":null}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"

// TestRouteStreamFailuresInPassing: a 200 stream that carries an error
// event after its first content and then ends with [DONE], or that just
// stops without a finish reason or [DONE], reaches the client as the
// backend sent it and is published as outcome error with its
// stream_error, counted per backend; a whole stream stays ok.
func TestRouteStreamFailuresInPassing(t *testing.T) {
	tests := []struct {
		name     string
		url      func(t *testing.T) string
		want     string // stream_error; "": ok
		wantBody string // in what the client got
	}{
		{"openai error event then DONE", func(t *testing.T) string {
			return fakeBackend(t, fakeai.Behavior{StreamErrorAfterTokens: 1}).URL()
		}, fleetwatch.StreamErrorEvent, `data: {"error":`},
		{"cut without finish or DONE", func(t *testing.T) string {
			return fakeBackend(t, fakeai.Behavior{StreamCutAfterTokens: 2}).URL()
		}, fleetwatch.StreamCut, `"content":"`},
		{"whole stream", func(t *testing.T) string { return fakeBackend(t, fakeai.Behavior{}).URL() }, "", "data: [DONE]"},
		{"vllm error object", func(t *testing.T) string {
			return sseBackend(t, `data: {"choices":[{"delta":{"content":"Hi"}}],"model":"llama-3.1-70b"}`+"\n\n"+
				`data: {"object":"error","message":"engine dead","type":"InternalServerError","code":500}`+"\n\n")
		}, fleetwatch.StreamErrorEvent, "engine dead"},
		{"anthropic error event", func(t *testing.T) string {
			return sseBackend(t, anthropicStart+"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
		}, fleetwatch.StreamErrorEvent, "overloaded_error"},
		{"anthropic whole stream", func(t *testing.T) string {
			return sseBackend(t, anthropicStart+"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n"+
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		}, "", "message_stop"},
		{"finish reason without DONE", func(t *testing.T) string {
			return sseBackend(t, `data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}`+"\n\n"+
				`data: {"choices":[{"delta":{},"finish_reason": "stop"}]}`+"\n\n")
		}, "", `"stop"`},
		{"text that names the markers is not one", func(t *testing.T) string {
			return sseBackend(t, `data: {"choices":[{"delta":{"content":"event: error data: [DONE] {\"error\":1}"}}]}`+"\n\n"+
				`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		}, "", "[DONE]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newCheckRig(t, tt.url(t))
			reply, err := r.c.Chat("", "hello world", true)
			if err != nil || reply.Status != 200 || !strings.Contains(string(reply.Body), tt.wantBody) {
				t.Fatalf("client got %v, status %d, body %q: want 200 and the backend's %q", err, reply.Status, reply.Body, tt.wantBody)
			}
			ev := r.event(t)
			wantOutcome := fleetwatch.OutcomeOK
			if tt.want != "" {
				wantOutcome = fleetwatch.OutcomeError
			}
			if ev.Outcome != wantOutcome || ev.Status != 200 || ev.StreamError != tt.want || !ev.HasTTFT {
				t.Errorf("event %+v: want outcome %v, status 200, stream_error %q, a TTFT", ev, wantOutcome, tt.want)
			}
			metric := fmt.Sprintf(`fleetwatch_route_stream_errors_total{pool="llama",backend="b0",reason="%s"} 1`, tt.want)
			if got := strings.Contains(r.rt.metricsText(), metric); got != (tt.want != "") {
				t.Errorf("metric %s present: %v, want %v", metric, got, tt.want != "")
			}
		})
	}
}

// TestRouteModelMismatch: an answer naming another model than the request's
// or the pool's is published with model_mismatch and counted, and stays ok;
// a dated snapshot of the requested model is no mismatch.
func TestRouteModelMismatch(t *testing.T) {
	for _, tt := range []struct {
		served, want string
	}{
		{"llama-3.1-8b", "llama-3.1-8b"},
		{"llama-3.1-70b-2024-07-23", ""},
		{"llama", ""}, // the pool id
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", tt.served, stream), func(t *testing.T) {
				r := newCheckRig(t, fakeBackend(t, fakeai.Behavior{Model: tt.served}).URL())
				if reply, err := r.c.Chat("", "hello", stream); err != nil || reply.Status != 200 {
					t.Fatalf("%v, status %d", err, reply.Status)
				}
				ev := r.event(t)
				if ev.Outcome != fleetwatch.OutcomeOK || ev.ModelMismatch != tt.want {
					t.Errorf("event %+v: want ok with model_mismatch %q", ev, tt.want)
				}
				metric := `fleetwatch_route_model_mismatch_total{pool="llama",backend="b0"} 1`
				if got := strings.Contains(r.rt.metricsText(), metric); got != (tt.want != "") {
					t.Errorf("metric %s present: %v", metric, got)
				}
			})
		}
	}
}

var weatherTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "get the weather of a city",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required": []string{"city"}},
}}

// TestRouteToolCallBroken: a request that requires a tool call (or names
// the function) and gets none, another function, or arguments that are not
// JSON is published with tool_call_broken and counted; a right call is not.
func TestRouteToolCallBroken(t *testing.T) {
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	for _, tt := range []struct {
		name   string
		modes  []string
		choice any
		want   bool
	}{
		{"right call", nil, "required", false},
		{"invalid arguments", []string{fakeai.BreakInvalidJSON}, "required", true},
		{"no call for a named function", []string{fakeai.BreakNoCall}, named, true},
		{"no call when not required", []string{fakeai.BreakNoCall}, "auto", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeBackend(t, fakeai.Behavior{})
			m := &fakeai.ToolModel{Modes: tt.modes}
			if tt.modes != nil {
				m.Break = 1
			}
			srv.SetToolModel(m)
			r := newCheckRig(t, srv.URL())
			reply, err := r.c.Post("/v1/chat/completions", map[string]any{"model": "llama-3.1-70b",
				"messages": []any{map[string]any{"role": "user", "content": "what is the weather in Paris"}},
				"tools":    []any{weatherTool}, "tool_choice": tt.choice})
			if err != nil || reply.Status != 200 {
				t.Fatalf("%v, status %d", err, reply.Status)
			}
			ev := r.event(t)
			if ev.Outcome != fleetwatch.OutcomeOK || ev.ToolCallBroken != tt.want {
				t.Errorf("event %+v (answer %s): want ok with tool_call_broken %v", ev, reply.Body, tt.want)
			}
			metric := `fleetwatch_route_tool_call_broken_total{pool="llama",backend="b0"} 1`
			if got := strings.Contains(r.rt.metricsText(), metric); got != tt.want {
				t.Errorf("metric %s present: %v", metric, got)
			}
		})
	}
}

// TestRouteStreamedToolCallBroken: tool-call arguments streamed in pieces
// are put together before they are judged.
func TestRouteStreamedToolCallBroken(t *testing.T) {
	delta := func(args string) string {
		return `data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":` + args + `}}]}}]}` + "\n\n"
	}
	end := `data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n"
	for _, tt := range []struct {
		name, stream string
		want         bool
	}{
		{"whole arguments", delta(`"{\"ci"`) + delta(`"ty\":\"Paris\"}"`) + end, false},
		{"arguments cut", delta(`"{\"ci"`) + delta(`"ty\":\"Par"`) + end, true},
		{"no call", `data: {"choices":[{"delta":{"content":"sunny"}}]}` + "\n\n" + end, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newCheckRig(t, sseBackend(t, tt.stream))
			reply, err := r.c.Post("/v1/chat/completions", map[string]any{"model": "llama-3.1-70b", "stream": true,
				"messages": []any{map[string]any{"role": "user", "content": "weather in Paris"}},
				"tools":    []any{weatherTool}, "tool_choice": "required"})
			if err != nil || reply.Status != 200 {
				t.Fatalf("%v, status %d", err, reply.Status)
			}
			if ev := r.event(t); ev.Outcome != fleetwatch.OutcomeOK || ev.ToolCallBroken != tt.want {
				t.Errorf("event %+v: want ok with tool_call_broken %v", ev, tt.want)
			}
		})
	}
}

// TestRouteFakeStream: a stream whose 40 tokens arrive at once after a
// 150ms wait is published with fake_stream and counted; the same tokens
// 5ms apart are a real stream (a router slowed for the whole 200 ms
// stream would see them pile up).
func TestRouteFakeStream(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    fakeai.Behavior
		want bool
	}{
		{"buffered", fakeai.Behavior{TTFT: 150 * time.Millisecond, BufferStream: true}, true},
		{"streamed", fakeai.Behavior{TTFT: 150 * time.Millisecond, TokenTime: 5 * time.Millisecond}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newCheckRig(t, fakeBackend(t, tt.b).URL())
			reply, err := r.c.Post("/v1/chat/completions", map[string]any{"model": "llama-3.1-70b", "stream": true,
				"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("word ", 50)}}, "max_tokens": 40})
			if err != nil || reply.Status != 200 {
				t.Fatalf("%v, status %d", err, reply.Status)
			}
			ev := r.event(t)
			if ev.Outcome != fleetwatch.OutcomeOK || ev.FakeStream != tt.want || ev.OutputTokens < fakeStreamChunks {
				t.Errorf("event %+v: want ok with fake_stream %v and >= %d tokens", ev, tt.want, fakeStreamChunks)
			}
			metric := `fleetwatch_route_fake_stream_total{pool="llama",backend="b0"} 1`
			if got := strings.Contains(r.rt.metricsText(), metric); got != tt.want {
				t.Errorf("metric %s present: %v", metric, got)
			}
		})
	}
}

// TestRouteSkipResponseChecks: with the checks off, a stream error event
// is ok again and no field is set.
func TestRouteSkipResponseChecks(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	srv := fakeBackend(t, fakeai.Behavior{StreamErrorAfterTokens: 1, Model: "other"})
	pool := Pool{ID: "llama", Models: []string{"llama-3.1-70b"}, Backends: []Backend{{ID: "b0", URL: srv.URL()}}}
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}, SkipResponseChecks: true})
	if reply, err := testkit.NewChatClient(rt.url).Chat("", "hi", true); err != nil || reply.Status != 200 {
		t.Fatalf("%v, status %d", err, reply.Status)
	}
	testkit.Eventually(t, 10*time.Second, "the event", func() bool { return len(log.Events()) == 1 })
	if ev := log.Events()[0]; ev.Outcome != fleetwatch.OutcomeOK || ev.StreamError != "" || ev.ModelMismatch != "" {
		t.Errorf("event %+v: want ok without checks", ev)
	}
}

// TestStreamCheckSplitReads: the markers are found wherever the reads
// split the stream, and markers in generated text never count.
func TestStreamCheckSplitReads(t *testing.T) {
	for _, tt := range []struct {
		name, stream string
		want         string
	}{
		{"error then done", `data: {"choices":[{"delta":{"content":"Hi"}}]}` + "\n\n" + `data: {"error":{"message":"x"}}` + "\n\ndata: [DONE]\n\n", fleetwatch.StreamErrorEvent},
		{"anthropic error", anthropicStart + "event: error\ndata: {}\n\n", fleetwatch.StreamErrorEvent},
		{"error first line", "event: error\ndata: {}\n\n", fleetwatch.StreamErrorEvent},
		{"finish", `data: {"choices":[{"delta":{},"finish_reason":"length"}]}` + "\n\n", ""},
		{"done only", "data: [DONE]\n\n", ""},
		{"cut", `data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n", fleetwatch.StreamCut},
		{"markers in text", `data: {"choices":[{"delta":{"content":"data: [DONE] event: error"}}]}` + "\n\n", fleetwatch.StreamCut},
		{"done after done in text", `data: {"choices":[{"delta":{"content":"[DONE]"}}]}` + "\n\ndata: [DONE]\n\n", ""},
	} {
		for i := 0; i <= len(tt.stream); i++ {
			var c streamCheck
			c.start(toolDemand{})
			c.scan([]byte(tt.stream[:i]))
			c.scan([]byte(tt.stream[i:]))
			if got := c.streamError(); got != tt.want {
				t.Errorf("%s split at %d: stream_error %q, want %q", tt.name, i, got, tt.want)
				break
			}
		}
	}
}

// FuzzStreamCheck: arbitrary streams never panic, and the verdict does not
// depend on where the reads split the stream (the markers are at most 32
// bytes, the overlap).
func FuzzStreamCheck(f *testing.F) {
	f.Add([]byte("data: {\"error\":{}}\n\ndata: [DONE]\n\n"), uint16(7), uint16(19))
	f.Add([]byte(anthropicStart+"event: error\n"), uint16(100), uint16(150))
	f.Add([]byte(`data: {"choices":[{"finish_reason": "stop"}]}`), uint16(30), uint16(31))
	f.Fuzz(func(t *testing.T, stream []byte, i, j uint16) {
		a, b := min(int(i), len(stream)), min(int(j), len(stream))
		if a > b {
			a, b = b, a
		}
		var whole, split streamCheck
		whole.start(toolDemand{offered: true, required: true})
		split.start(toolDemand{offered: true, required: true})
		whole.scan(stream)
		for _, part := range [][]byte{stream[:a], stream[a:b], stream[b:]} {
			split.scan(part)
		}
		if whole.streamError() != split.streamError() {
			t.Fatalf("%q: whole %q, split at %d, %d: %q", stream, whole.streamError(), a, b, split.streamError())
		}
		whole.calls.broken(whole.tools)
	})
}
