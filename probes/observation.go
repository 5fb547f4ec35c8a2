package probes

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"
)

// Alt is one top-k alternative at a position.
type Alt struct {
	Token   string  `json:"t"`
	Logprob float64 `json:"l"`
}

// Token is one generated token. Logprob and Top are set only when the
// backend returned logprobs.
type Token struct {
	Token   string
	Logprob float64
	Top     []Alt // most likely first
}

// Observation is the record of one probe response.
type Observation struct {
	Prompt           string // prompt id
	Text             string
	Tokens           []Token
	HasLogprobs      bool
	Fingerprint      string
	Model            string
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
}

// TextHash is a short hash of the response text.
func (o *Observation) TextHash() string {
	sum := sha256.Sum256([]byte(o.Text))
	return hex.EncodeToString(sum[:6])
}

// Sequence is the generated token strings.
func (o *Observation) Sequence() []string {
	seq := make([]string, len(o.Tokens))
	for i, t := range o.Tokens {
		seq[i] = t.Token
	}
	return seq
}

// Identity is the metadata of a backend that is cheap to read and is not
// proof of anything: a change triggers an extra probe cycle, never a verdict.
type Identity struct {
	Fingerprint  string   `json:"fingerprint,omitempty"` // most common system_fingerprint
	ModelIDs     []string `json:"model_ids,omitempty"`   // /v1/models ids
	ModelRoot    string   `json:"model_root,omitempty"`  // /v1/models root (vLLM)
	MaxModelLen  int      `json:"max_model_len,omitempty"`
	Version      string   `json:"version,omitempty"`       // GET /version (vLLM)
	PromptTokens []int    `json:"prompt_tokens,omitempty"` // usage.prompt_tokens per prompt
}

// Changes lists what differs between i (before) and now, as short phrases.
func (i Identity) Changes(now Identity) []string {
	var out []string
	if i.Fingerprint != now.Fingerprint {
		out = append(out, "fingerprint "+quoteOrNone(i.Fingerprint)+" -> "+quoteOrNone(now.Fingerprint))
	}
	if !slices.Equal(i.ModelIDs, now.ModelIDs) {
		out = append(out, "model ids changed")
	}
	if i.ModelRoot != now.ModelRoot {
		out = append(out, "model root "+quoteOrNone(i.ModelRoot)+" -> "+quoteOrNone(now.ModelRoot))
	}
	if i.Version != now.Version {
		out = append(out, "version "+quoteOrNone(i.Version)+" -> "+quoteOrNone(now.Version))
	}
	if len(i.PromptTokens) > 0 && len(now.PromptTokens) > 0 && !slices.Equal(i.PromptTokens, now.PromptTokens) {
		out = append(out, "prompt token counts changed (tokenizer or chat template)")
	}
	return out
}

func quoteOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return `"` + s + `"`
}

// Cycle is one probe cycle of one backend: an observation per suite prompt,
// in suite order.
type Cycle struct {
	At       time.Time
	Obs      []Observation
	Identity Identity
}

// hasLogprobs reports whether every observation carried logprobs.
func (c *Cycle) hasLogprobs() bool {
	for i := range c.Obs {
		if !c.Obs[i].HasLogprobs {
			return false
		}
	}
	return len(c.Obs) > 0
}

// lookup is the logprob of token s at a position: the chosen token's, an
// alternative's, or, when s is not in the top-k, the lowest top-k logprob
// (an upper bound of the true value).
func lookup(t *Token, s string) float64 {
	if t.Token == s {
		return t.Logprob
	}
	floor := t.Logprob
	for _, a := range t.Top {
		if a.Token == s {
			return a.Logprob
		}
		floor = min(floor, a.Logprob)
	}
	return floor
}

// floorOf is the lowest logprob shown at a position.
func floorOf(t *Token) float64 {
	f := t.Logprob
	for _, a := range t.Top {
		f = min(f, a.Logprob)
	}
	return f
}
