package drift

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
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

// Identity is the metadata of a backend that is cheap to read. Its
// identity tier (the models list with root and max_model_len, the version,
// vLLM's configuration info) is part of the baseline: a change is an
// immediate suspect (TierChanges). The rest (fingerprint, prompt token
// counts) only triggers an extra cycle (Changes).
type Identity struct {
	Fingerprint  string   `json:"fingerprint,omitempty"` // most common system_fingerprint
	ModelIDs     []string `json:"model_ids,omitempty"`   // /v1/models ids
	ModelRoot    string   `json:"model_root,omitempty"`  // /v1/models root (vLLM)
	MaxModelLen  int      `json:"max_model_len,omitempty"`
	Version      string   `json:"version,omitempty"`       // GET /version (vLLM)
	PromptTokens []int    `json:"prompt_tokens,omitempty"` // usage.prompt_tokens per prompt
	// Info holds the identity labels of vLLM's configuration info gauges
	// on /metrics, keyed "<metric>.<label>" (probes' infoLabels lists them).
	Info map[string]string `json:"info,omitempty"`
	// InfoMeasured is false when /metrics could not be read this cycle:
	// Info is then unknown, not empty.
	InfoMeasured bool `json:"info_measured,omitempty"`
}

// IdentityChange is one field of the identity tier that differs from the
// baseline, with the values before (the baseline's) and after.
type IdentityChange struct {
	Field  string `json:"field"`
	Before string `json:"before"`
	After  string `json:"after"`
}

func (c IdentityChange) String() string {
	return c.Field + " " + quoteOrNone(c.Before) + " -> " + quoteOrNone(c.After)
}

// TierChanges lists the identity-tier fields of now that differ from i (the
// baseline's identity): the models list, root and max_model_len always;
// the version when the baseline has one; each configuration info label
// the baseline has, when /metrics was read now.
func (i Identity) TierChanges(now Identity) []IdentityChange {
	var out []IdentityChange
	if !slices.Equal(i.ModelIDs, now.ModelIDs) {
		out = append(out, IdentityChange{"model_ids", strings.Join(i.ModelIDs, ","), strings.Join(now.ModelIDs, ",")})
	}
	if i.ModelRoot != now.ModelRoot {
		out = append(out, IdentityChange{"model_root", i.ModelRoot, now.ModelRoot})
	}
	if i.MaxModelLen != now.MaxModelLen {
		out = append(out, IdentityChange{"max_model_len", itoaOrEmpty(i.MaxModelLen), itoaOrEmpty(now.MaxModelLen)})
	}
	if i.Version != "" && i.Version != now.Version {
		out = append(out, IdentityChange{"version", i.Version, now.Version})
	}
	if now.InfoMeasured {
		keys := slices.Sorted(maps.Keys(i.Info))
		for _, k := range keys {
			if now.Info[k] != i.Info[k] {
				out = append(out, IdentityChange{k, i.Info[k], now.Info[k]})
			}
		}
	}
	return out
}

func itoaOrEmpty(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

// Changes lists what differs between i (the previous cycle's) and now, as
// short phrases: any of them runs an extra cycle at once.
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
	if i.MaxModelLen != now.MaxModelLen {
		out = append(out, "max_model_len "+quoteOrNone(itoaOrEmpty(i.MaxModelLen))+" -> "+quoteOrNone(itoaOrEmpty(now.MaxModelLen)))
	}
	if i.Version != now.Version {
		out = append(out, "version "+quoteOrNone(i.Version)+" -> "+quoteOrNone(now.Version))
	}
	if i.InfoMeasured && now.InfoMeasured {
		for _, k := range slices.Sorted(maps.Keys(i.Info)) {
			if now.Info[k] != i.Info[k] {
				out = append(out, k+" "+quoteOrNone(i.Info[k])+" -> "+quoteOrNone(now.Info[k]))
			}
		}
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
	// TrafficFingerprint is the system_fingerprint the backend's outcome
	// events showed in their last fingerprint event ("" when none): with
	// the probe's own fingerprint also differing from the baseline's, the
	// identity tier counts it as a change.
	TrafficFingerprint string `json:",omitempty"`
	// Teacher holds the teacher-forced scores of the suite's fixed texts,
	// in suite order, when the cycle scored them (teacher.go).
	Teacher []Observation `json:",omitempty"`
	// Tools are the judged answers to the suite's tool prompts, in suite
	// order (none without tool probes).
	Tools []ToolObservation `json:",omitempty"`
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
