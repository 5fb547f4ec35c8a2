package fakeai

import (
	"hash/fnv"
	"math"
	"strconv"
	"strings"
)

// DefaultMaxTokens is the completion length when a request names none.
const DefaultMaxTokens = 16

// Echo is the default Completer: it repeats the words of the prompt, one
// word per token, until MaxTokens tokens, with logprobs derived from a hash
// of (prompt, position). The output depends on the prompt and MaxTokens only
// (temperature and seed are ignored), so two Echo backends always agree; a
// drift scenario swaps in another Completer or changes Fingerprint.
type Echo struct {
	// Fingerprint is the system_fingerprint reported. If empty, "fp_echo" is
	// used.
	Fingerprint string
}

// Complete implements Completer.
func (e Echo) Complete(req CompletionRequest) Completion {
	words := strings.Fields(req.Prompt)
	if len(words) == 0 {
		words = []string{"fake"}
	}
	n := req.MaxTokens
	if n <= 0 {
		n = DefaultMaxTokens
	}
	fp := e.Fingerprint
	if fp == "" {
		fp = "fp_echo"
	}
	c := Completion{
		FinishReason:     "length",
		PromptTokens:     CountTokens(req.Prompt),
		Fingerprint:      fp,
		CompletionTokens: 0,
	}
	var text strings.Builder
	for i := 0; i < n; i++ {
		tok := words[i%len(words)]
		if i > 0 {
			tok = " " + tok
		}
		text.WriteString(tok)
		if stopAt(text.String(), req.Stop) >= 0 {
			c.FinishReason = "stop"
			break
		}
		c.Tokens = append(c.Tokens, fakeLogprob(req.Prompt, i, tok, req.TopLogprobs))
	}
	var out strings.Builder
	for _, t := range c.Tokens {
		out.WriteString(t.Token)
	}
	c.Text = out.String()
	c.CompletionTokens = len(c.Tokens)
	return c
}

// stopAt returns the index of the first stop sequence in s, or -1.
func stopAt(s string, stop []string) int {
	first := -1
	for _, st := range stop {
		if st == "" {
			continue
		}
		if i := strings.Index(s, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// fakeLogprob gives token tok at position i a logprob in (-2, 0] and top
// alternatives below it, all derived from a hash so they are reproducible.
func fakeLogprob(prompt string, i int, tok string, top int) TokenLogprob {
	h := fnv.New64a()
	h.Write([]byte(prompt))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(i)))
	sum := h.Sum64()
	lp := -float64(sum%2000) / 1000
	tl := TokenLogprob{Token: tok, Logprob: lp}
	if top > 20 {
		top = 20
	}
	if top > 0 {
		tl.Top = append(tl.Top, TopLogprob{Token: tok, Logprob: lp})
		for k := 1; k < top; k++ {
			tl.Top = append(tl.Top, TopLogprob{Token: " alt" + strconv.Itoa(k), Logprob: lp - 0.5*float64(k)})
		}
	}
	return tl
}

// CountTokens is the fake tokenizer: one token per whitespace-separated word,
// and at least one.
func CountTokens(s string) int {
	n := len(strings.Fields(s))
	if n == 0 {
		return 1
	}
	return n
}

// embed returns a deterministic unit vector of dim dimensions for s.
func embed(s string, dim int) []float64 {
	v := make([]float64, dim)
	var norm float64
	for i := range v {
		h := fnv.New64a()
		h.Write([]byte(s))
		h.Write([]byte{byte(i), byte(i >> 8)})
		x := float64(h.Sum64()%20001)/10000 - 1
		v[i] = x
		norm += x * x
	}
	if norm > 0 {
		norm = math.Sqrt(norm)
		for i := range v {
			v[i] /= norm
		}
	}
	return v
}
