package probes_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// vLLM's answer to {"prompt":"Hello big world","echo":true,"logprobs":1,
// "max_tokens":1}, trimmed: the first prompt token has no logprob.
const vllmEcho = `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"Hello big world!",
"logprobs":{"text_offset":[0,5,9,15],"token_logprobs":[null,-7.25,-2.5,-0.75],"tokens":["Hello"," big"," world","!"],
"top_logprobs":[null,{" big":-7.25,",":-1.5},{" world":-2.5},{"!":-0.75}]},"finish_reason":"length","prompt_logprobs":null}],
"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`

func TestDecodeTeacherResponse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want probes.TeacherScore
		err  error
	}{
		{"vLLM echo", vllmEcho, probes.TeacherScore{PromptTokens: 3, Model: "m",
			Tokens: []drift.Token{{Token: " big", Logprob: -7.25}, {Token: " world", Logprob: -2.5}}}, nil},
		{"vLLM prompt_logprobs 0", `{"model":"m","choices":[{"text":"!","logprobs":null,"prompt_logprobs":[null,
			{"1234":{"logprob":-7.25,"rank":9,"decoded_token":" big"}},{"99":{"logprob":-2.5,"rank":1,"decoded_token":" world"}}]}],
			"usage":{"prompt_tokens":3}}`, probes.TeacherScore{PromptTokens: 3, Model: "m",
			Tokens: []drift.Token{{Token: " big", Logprob: -7.25}, {Token: " world", Logprob: -2.5}}}, nil},
		{"echo ignored", `{"choices":[{"text":"!","logprobs":{"tokens":["!"],"token_logprobs":[-0.75]}}],"usage":{"prompt_tokens":3}}`,
			probes.TeacherScore{}, drift.ErrNoPromptLogprobs},
		{"no logprobs", `{"choices":[{"text":"Hello big world!"}],"usage":{"prompt_tokens":3}}`, probes.TeacherScore{}, drift.ErrNoPromptLogprobs},
		{"no usage", `{"choices":[{"logprobs":{"tokens":["a","b"],"token_logprobs":[null,-1]}}]}`, probes.TeacherScore{}, drift.ErrNoPromptLogprobs},
		{"too few logprobs", `{"choices":[{"logprobs":{"tokens":["a","b"],"token_logprobs":[null,-1]}}],"usage":{"prompt_tokens":3}}`,
			probes.TeacherScore{}, drift.ErrNoPromptLogprobs},
		{"prompt_logprobs with alternatives", `{"choices":[{"prompt_logprobs":[null,{"1":{"logprob":-1},"2":{"logprob":-0.5}}]}],"usage":{"prompt_tokens":2}}`,
			probes.TeacherScore{}, drift.ErrNoPromptLogprobs},
		{"null inside", `{"choices":[{"logprobs":{"tokens":["a","b","c"],"token_logprobs":[null,null,-1]}}],"usage":{"prompt_tokens":3}}`,
			probes.TeacherScore{}, drift.ErrBadResponse},
		{"positive logprob", `{"choices":[{"logprobs":{"tokens":["a","b"],"token_logprobs":[null,0.5]}}],"usage":{"prompt_tokens":2}}`,
			probes.TeacherScore{}, drift.ErrBadResponse},
		{"arrays differ", `{"choices":[{"logprobs":{"tokens":["a"],"token_logprobs":[null,-1]}}],"usage":{"prompt_tokens":2}}`,
			probes.TeacherScore{}, drift.ErrBadResponse},
		{"no choices", `{"choices":[],"usage":{"prompt_tokens":2}}`, probes.TeacherScore{}, drift.ErrBadResponse},
		{"not JSON", `<html>`, probes.TeacherScore{}, drift.ErrBadResponse},
	}
	for _, tt := range tests {
		got, err := probes.DecodeTeacherResponse([]byte(tt.body))
		if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

// echoBody encodes a teacher score the way vLLM answers an echo request:
// the prompt's tokens (the first without a logprob), then one generated
// token.
func echoBody(first string, sc probes.TeacherScore) []byte {
	type lp struct {
		Tokens        []string   `json:"tokens"`
		TokenLogprobs []*float64 `json:"token_logprobs"`
	}
	l := lp{Tokens: []string{first}, TokenLogprobs: []*float64{nil}}
	for _, t := range sc.Tokens {
		v := t.Logprob
		l.Tokens = append(l.Tokens, t.Token)
		l.TokenLogprobs = append(l.TokenLogprobs, &v)
	}
	gen := -0.5
	l.Tokens = append(l.Tokens, "!")
	l.TokenLogprobs = append(l.TokenLogprobs, &gen)
	b, _ := json.Marshal(map[string]any{
		"model": sc.Model, "system_fingerprint": sc.Fingerprint,
		"choices": []any{map[string]any{"text": "", "logprobs": l}},
		"usage":   map[string]int{"prompt_tokens": sc.PromptTokens, "completion_tokens": 1},
	})
	return b
}

// FuzzDecodeTeacherResponse: arbitrary bytes never panic, what decodes is
// well formed, and decode(encode(x)) == x.
func FuzzDecodeTeacherResponse(f *testing.F) {
	f.Add([]byte(vllmEcho), "Hello", " big", -7.25, " world", -2.5)
	f.Add([]byte(`{"choices":[{"prompt_logprobs":[null,{"7":{"logprob":-1,"decoded_token":"x"}}]}],"usage":{"prompt_tokens":2}}`), "a", "b", -1.0, "c", 0.0)
	f.Add([]byte(`{"choices":[{"logprobs":{"tokens":["a","b"],"token_logprobs":[null,-1e308]}}],"usage":{"prompt_tokens":2}}`), "", "", -0.0, "", -1e-9)
	f.Fuzz(func(t *testing.T, data []byte, first, tok1 string, lp1 float64, tok2 string, lp2 float64) {
		sc, err := probes.DecodeTeacherResponse(data)
		if err == nil {
			if len(sc.Tokens) != sc.PromptTokens-1 {
				t.Fatalf("%d tokens for %d prompt tokens", len(sc.Tokens), sc.PromptTokens)
			}
			for _, tk := range sc.Tokens {
				if math.IsNaN(tk.Logprob) || math.IsInf(tk.Logprob, 0) || tk.Logprob > 0 {
					t.Fatalf("logprob %v decoded", tk.Logprob)
				}
			}
		} else if !errors.Is(err, drift.ErrBadResponse) && !errors.Is(err, drift.ErrNoPromptLogprobs) {
			t.Fatalf("error %v is neither ErrBadResponse nor ErrNoPromptLogprobs", err)
		}
		// round trip of a well-formed score
		clamp := func(v float64) float64 {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return -1
			}
			return -math.Abs(v)
		}
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") } // what JSON can carry
		want := probes.TeacherScore{PromptTokens: 3, Model: "m", Fingerprint: "fp",
			Tokens: []drift.Token{{Token: valid(tok1), Logprob: clamp(lp1)}, {Token: valid(tok2), Logprob: clamp(lp2)}}}
		got, err := probes.DecodeTeacherResponse(echoBody(first, want))
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", want, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("decode(encode(x)) (-want +got):\n%s", diff)
		}
	})
}
