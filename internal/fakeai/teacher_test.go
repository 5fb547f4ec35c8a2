package fakeai

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// wordScorer scores a prompt word by word: word i (i >= 1) gets logprob
// -i/10, and its top alternative is "alt" at -0.05.
type wordScorer struct{ Echo }

func (wordScorer) ScorePrompt(req CompletionRequest) ([]TokenLogprob, bool) {
	var out []TokenLogprob
	for i, w := range strings.Fields(req.Prompt) {
		if i > 0 {
			w = " " + w
		}
		t := TokenLogprob{Token: w, Logprob: -float64(i) / 10}
		if i > 0 && req.TopLogprobs > 0 {
			t.Top = []TopLogprob{{Token: "alt", Logprob: -0.05}}
		}
		out = append(out, t)
	}
	return out, true
}

// echoAnswer decodes the fields of an echo answer the tests check.
type echoAnswer struct {
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []*float64           `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func TestEchoReturnsPromptLogprobs(t *testing.T) {
	srv := start(t, Settings{Completer: wordScorer{}})
	ctx := testCtx(t)
	code, _, body := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{
		"model": "m", "prompt": "the cat sat", "max_tokens": 1, "echo": true, "logprobs": 1, "temperature": 0})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var a echoAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	ch := a.Choices[0]
	if !strings.HasPrefix(ch.Text, "the cat sat") || ch.Logprobs == nil {
		t.Fatalf("choice %+v: want the prompt echoed with logprobs", ch)
	}
	// three prompt tokens (the first without a logprob), then the one
	// generated token
	wantTokens := []string{"the", " cat", " sat"}
	if diff := cmp.Diff(wantTokens, ch.Logprobs.Tokens[:3]); diff != "" || len(ch.Logprobs.Tokens) != 4 {
		t.Errorf("tokens %q (-want +got):\n%s", ch.Logprobs.Tokens, diff)
	}
	lps := ch.Logprobs.TokenLogprobs
	if lps[0] != nil || lps[1] == nil || *lps[1] != -0.1 || lps[2] == nil || *lps[2] != -0.2 || lps[3] == nil {
		t.Errorf("token_logprobs %v, want [null -0.1 -0.2 x]", lps)
	}
	if ch.Logprobs.TopLogprobs[0] != nil || ch.Logprobs.TopLogprobs[1]["alt"] != -0.05 {
		t.Errorf("top_logprobs %v", ch.Logprobs.TopLogprobs)
	}
	if a.Usage.PromptTokens != 3 || a.Usage.CompletionTokens != 1 {
		t.Errorf("usage %+v, want 3 prompt tokens and 1 completion token", a.Usage)
	}
	if ch.PromptLogprobs != nil {
		t.Errorf("prompt_logprobs %v without asking", ch.PromptLogprobs)
	}
}

func TestPromptLogprobsWithoutGeneration(t *testing.T) {
	srv := start(t, Settings{Completer: wordScorer{}})
	ctx := testCtx(t)
	code, _, body := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{
		"model": "m", "prompt": "one two three", "max_tokens": 0, "echo": true, "prompt_logprobs": 0})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var a echoAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	ch := a.Choices[0]
	if ch.Text != "one two three" || ch.Logprobs != nil || a.Usage.CompletionTokens != 0 {
		t.Errorf("choice %+v usage %+v: want the prompt alone, no logprobs (none asked), nothing generated", ch, a.Usage)
	}
	want := []map[string]promptLogprob{nil,
		{tokenID(" two"): {Logprob: -0.1, Rank: 2, DecodedToken: " two"}},
		{tokenID(" three"): {Logprob: -0.2, Rank: 2, DecodedToken: " three"}}}
	if diff := cmp.Diff(want, ch.PromptLogprobs); diff != "" {
		t.Errorf("prompt_logprobs (-want +got):\n%s", diff)
	}
}

func TestEchoRefusedWithoutAScorer(t *testing.T) {
	srv := start(t, Settings{}) // Echo{} does not score prompts
	ctx := testCtx(t)
	for _, body := range []map[string]any{
		{"model": "m", "prompt": "a b c", "max_tokens": 1, "echo": true, "logprobs": 1},
		{"model": "m", "prompt": "a b c", "max_tokens": 1, "prompt_logprobs": 1},
		{"model": "m", "prompt": "a b c", "max_tokens": 1, "echo": true, "logprobs": 1, "stream": true},
	} {
		if code, _, b := mustPost(ctx, t, srv.URL()+"/v1/completions", body); code != http.StatusBadRequest {
			t.Errorf("%v: status %d (%s), want 400", body, code, b)
		}
	}
	srv2 := start(t, Settings{Completer: wordScorer{}})
	if code, _, b := mustPost(ctx, t, srv2.URL()+"/v1/completions", map[string]any{
		"model": "m", "prompt": "a b c", "echo": true, "logprobs": 1, "stream": true}); code != http.StatusBadRequest {
		t.Errorf("streamed prompt logprobs: status %d (%s), want 400", code, b)
	}
	// echo without logprobs needs no scorer: the text is echoed
	code, _, b := mustPost(ctx, t, srv.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": "a b c", "max_tokens": 1, "echo": true})
	var a echoAnswer
	if code != http.StatusOK || json.Unmarshal(b, &a) != nil || !strings.HasPrefix(a.Choices[0].Text, "a b c") {
		t.Errorf("plain echo: status %d: %s", code, b)
	}
	if st := srv.Stats(); st.BadRequests != 3 {
		t.Errorf("stats %+v, want 3 bad requests", st)
	}
}
