package fakeai

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

// Prompt logprobs: /v1/completions with "echo": true and "logprobs" (or
// vLLM's "prompt_logprobs") returns the logprob of every prompt token given
// the tokens before it, the way vLLM does: the answer's text starts with the
// prompt, logprobs.tokens and token_logprobs start with the prompt's tokens
// (the first one's logprob and top_logprobs are null, it has no context),
// and usage.prompt_tokens counts them. With max_tokens 0 nothing is
// generated. Only a Completer that is a PromptScorer can answer; for any
// other (and for a PromptScorer that declines) the request is answered 400,
// like a server without the feature. Streaming is refused (vLLM refuses
// prompt_logprobs with stream too).

// PromptScorer is a Completer that can score its prompt teacher-forced.
type PromptScorer interface {
	// ScorePrompt returns the prompt's tokens in order, each but the first
	// with its logprob given the tokens before it and, when
	// req.TopLogprobs > 0, the most likely alternatives there; ok is false
	// when it does not score prompts (the server then answers 400).
	ScorePrompt(req CompletionRequest) (tokens []TokenLogprob, ok bool)
}

// promptEcho is an echo request's prompt, scored.
type promptEcho struct {
	tokens         []TokenLogprob
	scored         bool // logprobs were asked for
	promptLogprobs *int // vLLM's prompt_logprobs, when given
	noGeneration   bool // max_tokens 0
}

// promptEchoOf decides what an echo request gets: nil when the request
// does not ask for echo or prompt logprobs; an error (answered 400) when it
// asks for prompt logprobs the completer cannot give, or streams them.
func promptEchoOf(c Completer, req CompletionRequest, raw generationRequest, chat bool) (*promptEcho, error) {
	if chat || !raw.Echo && raw.PromptLogprobs == nil {
		return nil, nil
	}
	e := &promptEcho{scored: req.Logprobs || raw.PromptLogprobs != nil, promptLogprobs: raw.PromptLogprobs,
		noGeneration: raw.MaxTokens != nil && *raw.MaxTokens == 0 && raw.MaxCompletion == nil}
	if pl := raw.PromptLogprobs; pl != nil && (*pl < 0 || *pl > 20) {
		return nil, fmt.Errorf("%w: prompt_logprobs must be in [0, 20]", errBadRequest)
	}
	if !e.scored {
		return e, nil
	}
	if raw.Stream {
		return nil, fmt.Errorf("%w: prompt logprobs are not supported with stream", errBadRequest)
	}
	ps, ok := c.(PromptScorer)
	if !ok {
		return nil, fmt.Errorf("%w: prompt logprobs (echo with logprobs) are not supported by this backend", errBadRequest)
	}
	top := req.TopLogprobs
	if e.promptLogprobs != nil {
		top = max(top, *e.promptLogprobs, 1) // at least one alternative, for the rank
	}
	sreq := req
	sreq.TopLogprobs = top
	if e.tokens, ok = ps.ScorePrompt(sreq); !ok {
		return nil, fmt.Errorf("%w: prompt logprobs (echo with logprobs) are not supported by this backend", errBadRequest)
	}
	return e, nil
}

// complete generates the completion of an echo request (nothing with
// max_tokens 0) and counts the prompt's tokens as the scorer tokenized
// them.
func (e *promptEcho) complete(c Completer, req CompletionRequest) Completion {
	if e == nil {
		return c.Complete(req)
	}
	var out Completion
	if e.noGeneration {
		one := req
		one.MaxTokens = 1
		out = c.Complete(one) // for the fingerprint; its token is dropped
		out.Text, out.Tokens, out.CompletionTokens, out.FinishReason = "", nil, 0, "length"
	} else {
		out = c.Complete(req)
	}
	if e.scored {
		out.PromptTokens = len(e.tokens)
	}
	return out
}

// echoLogprobs is the completions logprobs shape with nulls: the first
// prompt token has no logprob.
type echoLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// promptLogprob is one entry of vLLM's prompt_logprobs.
type promptLogprob struct {
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

type echoChoice struct {
	Index          int                        `json:"index"`
	Text           string                     `json:"text"`
	Logprobs       *echoLogprobs              `json:"logprobs"`
	FinishReason   *string                    `json:"finish_reason"`
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

// choice is the answer's one choice: the prompt then the completion, with
// the logprobs of both when asked (logprobs false: the completer sends
// none).
func (e *promptEcho) choice(prompt string, c Completion, finish string, logprobs bool) echoChoice {
	ch := echoChoice{Text: prompt + c.Text, FinishReason: &finish}
	if !e.scored {
		return ch
	}
	if logprobs {
		lp := &echoLogprobs{}
		offset := 0
		add := func(t TokenLogprob, scored bool) {
			lp.Tokens = append(lp.Tokens, t.Token)
			lp.TextOffset = append(lp.TextOffset, offset)
			offset += len(t.Token)
			if !scored {
				lp.TokenLogprobs = append(lp.TokenLogprobs, nil)
				lp.TopLogprobs = append(lp.TopLogprobs, nil)
				return
			}
			v := t.Logprob
			lp.TokenLogprobs = append(lp.TokenLogprobs, &v)
			top := map[string]float64{t.Token: t.Logprob}
			for _, a := range t.Top {
				top[a.Token] = a.Logprob
			}
			lp.TopLogprobs = append(lp.TopLogprobs, top)
		}
		for i, t := range e.tokens {
			add(t, i > 0)
		}
		for _, t := range c.Tokens {
			add(t, true)
		}
		ch.Logprobs = lp
	}
	if e.promptLogprobs != nil {
		ch.PromptLogprobs = make([]map[string]promptLogprob, len(e.tokens))
		for i, t := range e.tokens {
			if i == 0 {
				continue
			}
			m := map[string]promptLogprob{tokenID(t.Token): {Logprob: t.Logprob, Rank: rankOf(t), DecodedToken: t.Token}}
			for k, a := range t.Top[:min(len(t.Top), *e.promptLogprobs)] {
				if _, dup := m[tokenID(a.Token)]; !dup {
					m[tokenID(a.Token)] = promptLogprob{Logprob: a.Logprob, Rank: k + 1, DecodedToken: a.Token}
				}
			}
			ch.PromptLogprobs[i] = m
		}
	}
	return ch
}

// tokenID is a stable fake token id for a token string (vLLM keys
// prompt_logprobs by token id).
func tokenID(tok string) string {
	h := fnv.New32a()
	h.Write([]byte(tok))
	return strconv.FormatUint(uint64(h.Sum32()%1_000_000), 10)
}

// rankOf is the rank of a token among its alternatives (1: most likely).
func rankOf(t TokenLogprob) int {
	r := 1
	for _, a := range t.Top {
		if a.Token != t.Token && a.Logprob > t.Logprob {
			r++
		}
	}
	return r
}
