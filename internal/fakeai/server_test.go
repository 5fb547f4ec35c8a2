package fakeai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// start runs a fake backend on a loopback port for the test.
func start(t *testing.T, s Settings) *Server {
	t.Helper()
	srv, err := Listen(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// post sends body as JSON and returns the status, headers and body.
func post(ctx context.Context, t *testing.T, url string, body any) (int, http.Header, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data, err
}

func mustPost(ctx context.Context, t *testing.T, url string, body any) (int, http.Header, []byte) {
	t.Helper()
	code, h, b, err := post(ctx, t, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return code, h, b
}

func chatBody(extra map[string]any) map[string]any {
	m := map[string]any{
		"model": "m",
		"messages": []map[string]any{
			{"role": "system", "content": "you are terse"},
			{"role": "user", "content": "hello there world"},
		},
		"max_tokens": 5,
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type chatResp struct {
	Object            string `json:"object"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text     string `json:"text"`
		Logprobs *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decode(t *testing.T, b []byte) chatResp {
	t.Helper()
	var r chatResp
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return r
}

func TestChatNonStreaming(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{Model: "llama", Fingerprint: "fp_a"}})
	ctx := testCtx(t)
	code, _, body := mustPost(ctx, t, srv.URL()+"/v1/chat/completions",
		chatBody(map[string]any{"logprobs": true, "top_logprobs": 3}))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	r := decode(t, body)
	if r.Object != "chat.completion" || r.Model != "llama" || r.SystemFingerprint != "fp_a" {
		t.Errorf("object/model/fingerprint = %q %q %q", r.Object, r.Model, r.SystemFingerprint)
	}
	want := "system: you are terse user:"
	if got := r.Choices[0].Message.Content; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	if r.Choices[0].Message.Role != "assistant" || *r.Choices[0].FinishReason != "length" {
		t.Errorf("role %q finish %q", r.Choices[0].Message.Role, *r.Choices[0].FinishReason)
	}
	lp := r.Choices[0].Logprobs
	if lp == nil || len(lp.Content) != 5 {
		t.Fatalf("logprobs = %+v, want 5 tokens", lp)
	}
	for _, tok := range lp.Content {
		if len(tok.TopLogprobs) != 3 || tok.TopLogprobs[0].Token != tok.Token || tok.Logprob > 0 {
			t.Errorf("token logprob %+v", tok)
		}
	}
	wantUsage := struct{ P, C, T int }{8, 5, 13}
	gotUsage := struct{ P, C, T int }{r.Usage.PromptTokens, r.Usage.CompletionTokens, r.Usage.TotalTokens}
	if diff := cmp.Diff(wantUsage, gotUsage); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

func TestCompletionsNonStreaming(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	code, _, body := mustPost(ctx, t, srv.URL()+"/v1/completions",
		map[string]any{"model": "m", "prompt": "a b c", "max_tokens": 4, "logprobs": 2})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	r := decode(t, body)
	if r.Object != "text_completion" || r.Choices[0].Text != "a b c a" || r.SystemFingerprint != "fp_echo" {
		t.Errorf("got %+v", r)
	}
	lp := r.Choices[0].Logprobs
	if diff := cmp.Diff([]string{"a", " b", " c", " a"}, lp.Tokens); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	if len(lp.TokenLogprobs) != 4 || len(lp.TopLogprobs) != 4 || len(lp.TopLogprobs[0]) != 2 {
		t.Errorf("logprobs %+v", lp)
	}
}

// readSSE reads a streamed response into its data payloads.
func readSSE(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStreamingMatchesNonStreaming(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{TokenTime: time.Millisecond}})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name, path string
		body       map[string]any
	}{
		{"chat", "/v1/chat/completions", chatBody(map[string]any{"logprobs": true})},
		{"completions", "/v1/completions", map[string]any{"prompt": "x y", "max_tokens": 5, "logprobs": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, body := mustPost(ctx, t, srv.URL()+tc.path, tc.body)
			plain := decode(t, body)
			tc.body["stream"] = true
			tc.body["stream_options"] = map[string]any{"include_usage": true}
			code, h, sse := mustPost(ctx, t, srv.URL()+tc.path, tc.body)
			if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d content-type %q", code, h.Get("Content-Type"))
			}
			events := readSSE(t, bytes.NewReader(sse))
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", events[len(events)-1])
			}
			var text strings.Builder
			var tokens, usageTokens int
			for _, e := range events[:len(events)-1] {
				c := decode(t, []byte(e))
				if c.Usage != nil {
					usageTokens = c.Usage.CompletionTokens
				}
				for _, ch := range c.Choices {
					text.WriteString(ch.Delta.Content + ch.Text)
					if ch.Logprobs != nil {
						tokens += len(ch.Logprobs.Content) + len(ch.Logprobs.Tokens)
					}
				}
			}
			wantText := plain.Choices[0].Message.Content + plain.Choices[0].Text
			if text.String() != wantText {
				t.Errorf("streamed %q, want %q", text.String(), wantText)
			}
			if tokens != 5 || usageTokens != 5 {
				t.Errorf("streamed %d logprob tokens and usage %d, want 5 and 5", tokens, usageTokens)
			}
		})
	}
}

func TestEmbeddingsModelsVersionHealth(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{Model: "emb"}})
	ctx := testCtx(t)
	var vecs [2][]float64
	for i := range vecs {
		_, _, body := mustPost(ctx, t, srv.URL()+"/v1/embeddings",
			map[string]any{"model": "emb", "input": []string{"hello", "world"}, "dimensions": 8})
		var r embeddingResponse
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Data) != 2 || len(r.Data[0].Embedding) != 8 || r.Usage.PromptTokens != 2 {
			t.Fatalf("embeddings %+v", r)
		}
		vecs[i] = r.Data[0].Embedding
	}
	if diff := cmp.Diff(vecs[0], vecs[1]); diff != "" {
		t.Errorf("embedding not deterministic (-first +second):\n%s", diff)
	}
	for _, path := range []string{"/v1/models", "/version", "/health"} {
		resp, err := http.Get(srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d", path, resp.StatusCode)
		}
		if path == "/v1/models" && !strings.Contains(string(b), `"id":"emb"`) {
			t.Errorf("/v1/models = %s", b)
		}
	}
}

// TestTTFTAndTokenTime checks lower bounds only: a timer never fires early,
// so these cannot flake.
func TestTTFTAndTokenTime(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{TTFT: 80 * time.Millisecond,
		TTFTPerPromptToken: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond}})
	ctx := testCtx(t)
	body := map[string]any{"prompt": "one two", "max_tokens": 3, "stream": true} // 2 prompt tokens
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/completions", bytes.NewReader(b))
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var stamps []time.Duration
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			stamps = append(stamps, time.Since(t0))
		}
	}
	if len(stamps) < 3 {
		t.Fatalf("got %d chunks", len(stamps))
	}
	if stamps[0] < 100*time.Millisecond {
		t.Errorf("first token after %v, want >= 100ms (80 + 2x10)", stamps[0])
	}
	if gap := stamps[2] - stamps[0]; gap < 40*time.Millisecond {
		t.Errorf("tokens 1..3 spanned %v, want >= 40ms", gap)
	}
}

func TestFailureKnobs(t *testing.T) {
	tests := []struct {
		name       string
		b          Behavior
		wantStatus int
		wantStats  Stats
	}{
		{"error rate 1", Behavior{ErrorRate: 1}, 500, Stats{Requests: 1, Errors: 1, MaxInFlight: 1}},
		// TTFT of an hour: the test would time out if the 500 waited for it.
		{"instant error", Behavior{InstantError: true, TTFT: time.Hour}, 500, Stats{Requests: 1, Errors: 1, MaxInFlight: 1}},
		{"throttle", Behavior{ThrottleRate: 1, TTFT: time.Hour}, 429, Stats{Requests: 1, Throttled: 1, MaxInFlight: 1}},
		{"healthy", Behavior{}, 200, Stats{Requests: 1, OK: 1, MaxInFlight: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, Settings{Behavior: tc.b})
			code, _, body := mustPost(testCtx(t), t, srv.URL()+"/v1/chat/completions", chatBody(nil))
			if code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", code, tc.wantStatus, body)
			}
			if code != 200 {
				var e errorBody
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
					t.Errorf("error body %s: %v", body, err)
				}
			}
			eventually(t, "in-flight 0", func() bool { return srv.Stats().InFlight == 0 })
			if diff := cmp.Diff(tc.wantStats, srv.Stats()); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

func TestErrorRateIsAFraction(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{ErrorRate: 0.5}, Seed: 7})
	ctx := testCtx(t)
	codes := map[int]int{}
	for range 200 {
		code, _, _ := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"})
		codes[code]++
	}
	if codes[200] < 50 || codes[500] < 50 || codes[200]+codes[500] != 200 {
		t.Errorf("codes %v, want about half 200 and half 500", codes)
	}
	st := srv.Stats()
	if st.OK != int64(codes[200]) || st.Errors != int64(codes[500]) {
		t.Errorf("stats %+v disagree with codes %v", st, codes)
	}
}

func TestRetryAfter(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{ThrottleRate: 1, RetryAfter: 1500 * time.Millisecond}})
	code, h, _ := mustPost(testCtx(t), t, srv.URL()+"/v1/embeddings", map[string]any{"input": "x"})
	got := []string{h.Get("Retry-After"), h.Get("retry-after-ms")}
	if diff := cmp.Diff([]string{"2", "1500"}, got); code != 429 || diff != "" {
		t.Errorf("status %d, Retry-After (-want +got):\n%s", code, diff)
	}
}

// A bare throttle is a 429 without any retry hint, as a full queue's.
func TestBareThrottle(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{ThrottleRate: 1, BareThrottle: true}})
	code, h, _ := mustPost(testCtx(t), t, srv.URL()+"/v1/embeddings", map[string]any{"input": "x"})
	if code != 429 || h.Get("Retry-After") != "" || h.Get("retry-after-ms") != "" {
		t.Errorf("status %d, Retry-After %q, retry-after-ms %q: want a 429 without either", code, h.Get("Retry-After"), h.Get("retry-after-ms"))
	}
}

func TestHangHonoursCancellation(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{Hang: true}})
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := post(ctx, t, srv.URL()+"/v1/chat/completions", chatBody(nil))
		errc <- err
	}()
	eventually(t, "request in flight", func() bool { return srv.Stats().InFlight == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v, want context.Canceled", err)
	}
	eventually(t, "canceled counted", func() bool { return srv.Stats().Canceled == 1 })
}

func TestRefuseAndResume(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	url := srv.URL()
	if code, _, _ := mustPost(ctx, t, url+"/v1/completions", map[string]any{"prompt": "p"}); code != 200 {
		t.Fatalf("status %d before refusing", code)
	}
	srv.SetBehavior(Behavior{Refuse: true})
	// A pooled keep-alive connection sees EOF (the server dropped it); a new
	// connection is refused.
	http.DefaultClient.CloseIdleConnections()
	_, _, _, err := post(ctx, t, url+"/v1/completions", map[string]any{"prompt": "p"})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v, want connection refused", err)
	}
	srv.SetBehavior(Behavior{})
	if code, _, _ := mustPost(ctx, t, url+"/v1/completions", map[string]any{"prompt": "p"}); code != 200 {
		t.Fatalf("status %d after resuming", code)
	}
	if srv.URL() != url {
		t.Errorf("URL changed from %s to %s", url, srv.URL())
	}
}

func TestColdStart(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{ColdStart: 50 * time.Millisecond, IdleGap: time.Hour}})
	ctx := testCtx(t)
	cold := func() string {
		_, h, _ := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"})
		return h.Get("X-Fakeai-Cold")
	}
	got := []string{cold(), cold()}
	srv.UpdateBehavior(func(b Behavior) (Behavior, error) { b.IdleGap = time.Millisecond; return b, nil })
	time.Sleep(5 * time.Millisecond) // longer than the idle gap
	got = append(got, cold())
	if diff := cmp.Diff([]string{"true", "", "true"}, got); diff != "" {
		t.Errorf("cold headers (-want +got):\n%s", diff)
	}
	if srv.Stats().Cold != 2 {
		t.Errorf("cold count %d, want 2", srv.Stats().Cold)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{MaxConcurrent: 1, TTFT: time.Hour}})
	ctx := testCtx(t)
	blockCtx, unblock := context.WithCancel(ctx)
	go post(blockCtx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"})
	// Busy, not InFlight: a request is in flight before its admission reads
	// the behavior, and the TTFT of an hour must be the one it read.
	eventually(t, "first request holds the slot", func() bool { return srv.Stats().Busy == 1 })

	// Over the limit with RejectOverLimit: 429 at once.
	srv.UpdateBehavior(func(b Behavior) (Behavior, error) { b.RejectOverLimit = true; b.TTFT = 0; return b, nil })
	if code, _, _ := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"}); code != 429 {
		t.Errorf("over-limit status %d, want 429", code)
	}
	// Queueing: the second request waits until the first leaves.
	srv.UpdateBehavior(func(b Behavior) (Behavior, error) { b.RejectOverLimit = false; return b, nil })
	done := make(chan int, 1)
	go func() {
		code, _, _, _ := post(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"})
		done <- code
	}()
	eventually(t, "second request queued", func() bool { return srv.Stats().Waiting == 1 })
	unblock()
	if code := <-done; code != 200 {
		t.Errorf("queued request status %d, want 200", code)
	}
}

func TestPrefixCacheHit(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	var cached []int
	for range 2 {
		_, _, body := mustPost(ctx, t, srv.URL()+"/v1/chat/completions", chatBody(nil))
		cached = append(cached, decode(t, body).Usage.PromptTokensDetails.CachedTokens)
	}
	if diff := cmp.Diff([]int{0, 3}, cached); diff != "" {
		t.Errorf("cached tokens (-want +got):\n%s", diff)
	}
}

type constCompleter struct{}

func (constCompleter) Complete(req CompletionRequest) Completion {
	return Completion{Text: "fixed", Tokens: []TokenLogprob{{Token: "fixed", Logprob: -0.1}},
		FinishReason: "stop", PromptTokens: 1, CompletionTokens: 1, Fingerprint: "fp_const", NoLogprobs: true}
}

func TestPluggableCompleterAndIdentityKnobs(t *testing.T) {
	srv := start(t, Settings{Completer: constCompleter{}})
	ctx := testCtx(t)
	_, _, body := mustPost(ctx, t, srv.URL()+"/v1/chat/completions", chatBody(map[string]any{"logprobs": true}))
	r := decode(t, body)
	if r.Choices[0].Message.Content != "fixed" || r.Choices[0].Logprobs != nil || r.SystemFingerprint != "fp_const" {
		t.Errorf("got %s", body)
	}
	srv.SetBehavior(Behavior{Model: "other", Fingerprint: "fp_new"})
	_, _, body = mustPost(ctx, t, srv.URL()+"/v1/chat/completions", chatBody(nil))
	if r := decode(t, body); r.Model != "other" || r.SystemFingerprint != "fp_new" {
		t.Errorf("model/fingerprint %q %q, want other fp_new", r.Model, r.SystemFingerprint)
	}
}

func TestAdminEndpoint(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	code, _, body := mustPost(ctx, t, srv.URL()+"/admin/behavior",
		map[string]any{"instant_error": true, "ttft_ms": 250, "model": "x"})
	if code != 200 {
		t.Fatalf("admin status %d: %s", code, body)
	}
	want := Behavior{InstantError: true, TTFT: 250 * time.Millisecond, Model: "x"}
	if diff := cmp.Diff(want, srv.Behavior()); diff != "" {
		t.Errorf("behavior (-want +got):\n%s", diff)
	}
	if code, _, _ := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{"prompt": "p"}); code != 500 {
		t.Errorf("status %d after instant_error, want 500", code)
	}
	for _, bad := range []map[string]any{{"error_rate": 2}, {"ttft_ms": -1}, {"no_such_knob": 1}} {
		if code, _, _ := mustPost(ctx, t, srv.URL()+"/admin/behavior", bad); code != 400 {
			t.Errorf("patch %v: status %d, want 400", bad, code)
		}
	}
	resp, err := http.Get(srv.URL() + "/admin/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Errors != 1 {
		t.Errorf("stats %+v, want 1 error", st)
	}
}

func TestBehaviorPatchRoundTrip(t *testing.T) {
	b := Behavior{TTFT: 3 * time.Millisecond, ErrorRate: 0.25, ThrottleRate: 1, RetryAfter: 2 * time.Second, BareThrottle: true,
		Hang: true, ColdStart: time.Second, IdleGap: time.Minute, MaxConcurrent: 4, RejectOverLimit: true,
		Model: "m", Fingerprint: "fp", TokenTime: time.Millisecond, TTFTPerPromptToken: time.Microsecond,
		BreakAfterTokens: 3}
	got, err := PatchOf(b).Apply(Behavior{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(b, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, err := (BehaviorPatch{ErrorRate: new(float64(-1))}).Apply(b); !errors.Is(err, ErrBadBehavior) {
		t.Errorf("error %v, want ErrBadBehavior", err)
	}
}

func TestBadRequest(t *testing.T) {
	srv := start(t, Settings{})
	ctx := testCtx(t)
	for _, body := range []any{map[string]any{"messages": []any{}}, "not an object"} {
		if code, _, _ := mustPost(ctx, t, srv.URL()+"/v1/chat/completions", body); code != 400 {
			t.Errorf("body %v: status %d, want 400", body, code)
		}
	}
	if st := srv.Stats(); st.BadRequests != 2 {
		t.Errorf("bad requests %d, want 2", st.BadRequests)
	}
}

func TestBreakAfterTokens(t *testing.T) {
	srv := start(t, Settings{Behavior: Behavior{BreakAfterTokens: 2}})
	ctx := testCtx(t)
	for _, stream := range []bool{true, false} {
		b, _ := json.Marshal(map[string]any{"prompt": "a b c d", "max_tokens": 8, "stream": stream})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/completions", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) && !(stream && err == nil) {
			t.Errorf("stream=%v: read error %v, want the body cut off", stream, err)
		}
		if stream {
			events := readSSE(t, bytes.NewReader(body))
			if len(events) != 2 || strings.Contains(string(body), "[DONE]") {
				t.Errorf("stream cut after %d events (%q), want 2 tokens and no [DONE]", len(events), body)
			}
		}
	}
	eventually(t, "both counted as errors", func() bool { st := srv.Stats(); return st.Errors == 2 && st.InFlight == 0 })
	if st := srv.Stats(); st.OK != 0 {
		t.Errorf("stats %+v: a broken answer counted ok", st)
	}
}

// TestStreamMisbehaviours: a stream ended by an error event then [DONE],
// one cut after its tokens without a finish or [DONE], and a buffered one
// that arrives in one read; the first two count as errors.
func TestStreamMisbehaviours(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		name      string
		b         Behavior
		wantLast  string // the last data line
		wantError bool
	}{
		{"error event", Behavior{StreamErrorAfterTokens: 2}, "[DONE]", true},
		{"cut", Behavior{StreamCutAfterTokens: 2}, "", true},
		{"buffered", Behavior{BufferStream: true}, "[DONE]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, Settings{Behavior: tc.b})
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "a b c d e f"}},
				"max_tokens": 8, "stream": true})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/chat/completions", bytes.NewReader(b))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read: %v, want a clean end", err)
			}
			events := readSSE(t, bytes.NewReader(body))
			if last := events[len(events)-1]; tc.wantLast != "" && last != tc.wantLast {
				t.Errorf("last event %q, want %q", last, tc.wantLast)
			}
			s := string(body)
			switch tc.name {
			case "error event":
				if !strings.Contains(s, `data: {"error":`) || strings.Contains(s, `"finish_reason":"`) {
					t.Errorf("stream %q: want an error event and no finish reason", s)
				}
			case "cut":
				if strings.Contains(s, "[DONE]") || strings.Contains(s, `"finish_reason":"`) || len(events) != 3 {
					t.Errorf("stream %q: want the role chunk, 2 tokens, no finish and no [DONE]", s)
				}
			}
			want := Stats{Requests: 1, OK: 1}
			if tc.wantError {
				want = Stats{Requests: 1, Errors: 1}
			}
			eventually(t, "counted", func() bool {
				st := srv.Stats()
				return st.Errors == want.Errors && st.OK == want.OK && st.InFlight == 0
			})
		})
	}
}
