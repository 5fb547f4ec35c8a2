package probes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Endpoints a probe can use.
const (
	EndpointChat        = "chat"        // POST /v1/chat/completions
	EndpointCompletions = "completions" // POST /v1/completions
)

// Target is one backend to probe.
type Target struct {
	Pool, Backend string
	// URL is the OpenAI-compatible base URL, with or without /v1.
	URL string
	// APIKey is sent as a bearer token when not empty (the wiring reads it
	// from the backend's api_key_env).
	APIKey string
	// Model is the request's model. If empty, the first of PreferModels
	// that GET /v1/models lists is used, else its first id.
	Model        string
	PreferModels []string
	// Endpoint is EndpointChat (default) or EndpointCompletions.
	Endpoint string
	// BudgetTokensPerDay is the most tokens the probes of this backend may
	// spend in any 24 hours (budget.go): the wiring resolves the backend's
	// probe_budget_tokens_per_day, else its pool's, else
	// probes.budget_tokens_per_day. If zero, unlimited.
	BudgetTokensPerDay int64
	// CostPerMTok is the backend's price per million tokens (its
	// cost_per_mtok), for the spend in money. If nil, unknown: the spend is
	// shown in tokens only.
	CostPerMTok *float64
}

// Capabilities is what a backend was seen to support.
type Capabilities struct {
	Logprobs       bool `json:"logprobs"`
	TopLogprobsCap int  `json:"top_logprobs_cap"` // most alternatives seen at a position
	Seed           bool `json:"seed"`             // identical greedy answers to identical requests
	Fingerprint    bool `json:"fingerprint"`      // system_fingerprint present
	Version        bool `json:"version"`          // GET /version answered
	// PromptLogprobs: the suite's fixed texts were scored teacher-forced
	// (echo with logprobs) this cycle.
	PromptLogprobs bool `json:"prompt_logprobs"`
}

// Client speaks the OpenAI-compatible API to one backend.
type Client struct {
	t    Target
	http *http.Client
	base string // URL without a trailing /v1 or /
}

// NewClient returns a client for t. hc nil uses a client without timeout:
// every call takes its deadline from ctx.
func NewClient(t Target, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{}
	}
	base := strings.TrimRight(t.URL, "/")
	base = strings.TrimSuffix(base, "/v1")
	return &Client{t: t, http: hc, base: base}
}

// canonicalChat is the probe request body for chat; fields in a fixed order
// so that the same prompt always gives the same bytes.
type canonicalChat struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature float64       `json:"temperature"`
	TopP        float64       `json:"top_p"`
	MaxTokens   int           `json:"max_tokens"`
	Logprobs    bool          `json:"logprobs"`
	TopLogprobs int           `json:"top_logprobs"`
	Seed        int           `json:"seed"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type canonicalCompletion struct {
	Model       string  `json:"model"`
	Prompt      string  `json:"prompt"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	MaxTokens   int     `json:"max_tokens"`
	Logprobs    int     `json:"logprobs"`
	Seed        int     `json:"seed"`
}

// RequestBody is the canonical request of a prompt: temperature 0, top_p 1,
// max_tokens <= 20, logprobs with 5 alternatives, seed 1.
func RequestBody(endpoint, model string, p drift.Prompt) []byte {
	maxTokens := min(max(p.MaxTokens, 1), drift.MaxProbeTokens)
	var v any
	if endpoint == EndpointCompletions {
		v = canonicalCompletion{Model: model, Prompt: p.Text, TopP: 1, MaxTokens: maxTokens, Logprobs: 5, Seed: 1}
	} else {
		v = canonicalChat{Model: model, Messages: []chatMessage{{Role: "user", Content: p.Text}},
			TopP: 1, MaxTokens: maxTokens, Logprobs: true, TopLogprobs: 5, Seed: 1}
	}
	b, _ := json.Marshal(v) // plain structs of strings and numbers
	return b
}

func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	op := method + " " + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, &drift.ProbeError{Kind: drift.ErrKindOther, Op: op, Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.t.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		kind := drift.ErrKindTransport
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			kind = drift.ErrKindTimeout
		}
		return nil, &drift.ProbeError{Kind: kind, Op: op, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		kind := drift.ErrKindTransport
		if errors.Is(err, context.DeadlineExceeded) {
			kind = drift.ErrKindTimeout
		}
		return nil, &drift.ProbeError{Kind: kind, Op: op, Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return data, &drift.ProbeError{Kind: drift.ErrKindStatus, Status: resp.StatusCode, Op: op, Err: errors.New(snippet(data))}
	}
	if m, ok := ctx.Value(meterKey{}).(*usageMeter); ok && method == http.MethodPost {
		m.add(data)
	}
	return data, nil
}

// meterKey is the context key of the usageMeter that do adds the usage of
// every answered POST to (withMeter).
type meterKey struct{}

// usageMeter adds up the usage the answers of a tier's requests report.
// It is not safe for concurrent use: a cycle's requests are sequential.
type usageMeter struct {
	Requests   int // POSTs answered 200
	Unmetered  int // of those, the ones without a usage object
	Prompt     int64
	Completion int64
}

// withMeter returns ctx carrying m: every POST answered 200 through it is
// counted in m.
func withMeter(ctx context.Context, m *usageMeter) context.Context {
	if m == nil {
		return ctx
	}
	return context.WithValue(ctx, meterKey{}, m)
}

// add counts one answer's usage (OpenAI's usage.prompt_tokens and
// usage.completion_tokens, in every endpoint's answer).
func (m *usageMeter) add(body []byte) {
	m.Requests++
	var r struct {
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		m.Unmetered++
		return
	}
	m.Prompt += max(r.Usage.PromptTokens, 0)
	m.Completion += max(r.Usage.CompletionTokens, 0)
}

// Tokens is the metered total.
func (m *usageMeter) Tokens() int64 { return m.Prompt + m.Completion }

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// ModelsInfo is what GET /v1/models says.
type ModelsInfo struct {
	IDs         []string
	Root        string
	MaxModelLen int
}

// Models calls GET /v1/models.
func (c *Client) Models(ctx context.Context) (ModelsInfo, error) {
	data, err := c.do(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return ModelsInfo{}, err
	}
	var body struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		return ModelsInfo{}, &drift.ProbeError{Kind: drift.ErrKindMalformed, Op: "GET /v1/models", Err: fmt.Errorf("%w: %w", drift.ErrBadResponse, err)}
	}
	var mi ModelsInfo
	for _, d := range body.Data {
		mi.IDs = append(mi.IDs, d.ID)
		if mi.Root == "" {
			mi.Root, mi.MaxModelLen = d.Root, d.MaxModelLen
		}
	}
	slices.Sort(mi.IDs)
	return mi, nil
}

// Version calls GET /version (vLLM). A backend without it returns "" and no
// error.
func (c *Client) Version(ctx context.Context) (string, error) {
	data, err := c.do(ctx, http.MethodGet, "/version", nil)
	var pe *drift.ProbeError
	if errors.As(err, &pe) && pe.Kind == drift.ErrKindStatus && pe.Status == http.StatusNotFound {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var body struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(data, &body) != nil {
		return "", nil // not vLLM's /version: nothing to learn
	}
	return body.Version, nil
}

// chatResponse and completionResponse decode the parts of a response the
// probe records.
type chatResponse struct {
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Message *struct {
			Content *string `json:"content"`
		} `json:"message"`
		Logprobs *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type completionResponse struct {
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Text     *string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// Probe sends prompt p's canonical request and records the response. A
// response without logprobs is recorded (HasLogprobs false), not an error;
// the Monitor decides what that means.
func (c *Client) Probe(ctx context.Context, model string, p drift.Prompt) (drift.Observation, error) {
	path := "/v1/chat/completions"
	if c.t.Endpoint == EndpointCompletions {
		path = "/v1/completions"
	}
	op := "POST " + path
	data, err := c.do(ctx, http.MethodPost, path, RequestBody(c.t.Endpoint, model, p))
	if err != nil {
		return drift.Observation{}, err
	}
	bad := func(format string, args ...any) error {
		return &drift.ProbeError{Kind: drift.ErrKindMalformed, Op: op, Err: fmt.Errorf("%w: "+format, append([]any{drift.ErrBadResponse}, args...)...)}
	}
	o := drift.Observation{Prompt: p.ID}
	if c.t.Endpoint == EndpointCompletions {
		var r completionResponse
		if err := json.Unmarshal(data, &r); err != nil {
			return o, bad("%v", err)
		}
		if len(r.Choices) == 0 || r.Choices[0].Text == nil {
			return o, bad("no choices[0].text")
		}
		ch := r.Choices[0]
		o.Text, o.FinishReason, o.Model, o.Fingerprint = *ch.Text, ch.FinishReason, r.Model, r.SystemFingerprint
		if r.Usage != nil {
			o.PromptTokens, o.CompletionTokens = r.Usage.PromptTokens, r.Usage.CompletionTokens
		}
		if lp := ch.Logprobs; lp != nil && len(lp.Tokens) > 0 {
			if len(lp.TokenLogprobs) != len(lp.Tokens) {
				return o, bad("%d tokens but %d token_logprobs", len(lp.Tokens), len(lp.TokenLogprobs))
			}
			o.HasLogprobs = true
			for i, tok := range lp.Tokens {
				t := drift.Token{Token: tok, Logprob: lp.TokenLogprobs[i]}
				if i < len(lp.TopLogprobs) {
					for alt, v := range lp.TopLogprobs[i] {
						t.Top = append(t.Top, drift.Alt{Token: alt, Logprob: v})
					}
					sortAlts(t.Top)
				}
				o.Tokens = append(o.Tokens, t)
			}
		}
		return o, nil
	}
	var r chatResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return o, bad("%v", err)
	}
	if len(r.Choices) == 0 || r.Choices[0].Message == nil || r.Choices[0].Message.Content == nil {
		return o, bad("no choices[0].message.content")
	}
	ch := r.Choices[0]
	o.Text, o.FinishReason, o.Model, o.Fingerprint = *ch.Message.Content, ch.FinishReason, r.Model, r.SystemFingerprint
	if r.Usage != nil {
		o.PromptTokens, o.CompletionTokens = r.Usage.PromptTokens, r.Usage.CompletionTokens
	}
	if ch.Logprobs != nil && len(ch.Logprobs.Content) > 0 {
		o.HasLogprobs = true
		for _, c := range ch.Logprobs.Content {
			t := drift.Token{Token: c.Token, Logprob: c.Logprob}
			for _, a := range c.TopLogprobs {
				t.Top = append(t.Top, drift.Alt{Token: a.Token, Logprob: a.Logprob})
			}
			sortAlts(t.Top)
			o.Tokens = append(o.Tokens, t)
		}
	} else {
		// without logprobs the tokens are unknown: one pseudo-token per
		// whitespace-separated word keeps exact match and the MMD test
		// meaningful
		for _, w := range strings.Fields(o.Text) {
			o.Tokens = append(o.Tokens, drift.Token{Token: w})
		}
	}
	return o, nil
}

func sortAlts(a []drift.Alt) {
	slices.SortFunc(a, func(x, y drift.Alt) int {
		switch {
		case x.Logprob > y.Logprob:
			return -1
		case x.Logprob < y.Logprob:
			return 1
		}
		return strings.Compare(x.Token, y.Token)
	})
}

// Identity reads the identity tier alone: GET /v1/models, GET /version and
// GET /metrics (vLLM's configuration info), each bounded by timeout (0:
// only ctx). It is what the Prober checks at start, before a backend's
// first cycle.
func (c *Client) Identity(ctx context.Context, timeout time.Duration) (drift.Identity, error) {
	id, _, err := c.identity(ctx, func() (context.Context, context.CancelFunc) {
		if timeout > 0 {
			return context.WithTimeout(ctx, timeout)
		}
		return context.WithCancel(ctx)
	})
	return id, err
}

// identity reads the identity tier and picks the model to probe.
func (c *Client) identity(ctx context.Context, call func() (context.Context, context.CancelFunc)) (drift.Identity, string, error) {
	var id drift.Identity
	cctx, cancel := call()
	mi, err := c.Models(cctx)
	cancel()
	if err != nil {
		return id, "", err
	}
	id.ModelIDs, id.ModelRoot, id.MaxModelLen = mi.IDs, mi.Root, mi.MaxModelLen
	model := c.t.Model
	for _, m := range c.t.PreferModels {
		if model == "" && slices.Contains(mi.IDs, m) {
			model = m
		}
	}
	if model == "" && len(mi.IDs) > 0 {
		model = mi.IDs[0]
	}
	cctx, cancel = call()
	id.Version, err = c.Version(cctx)
	cancel()
	if err != nil {
		return id, "", err
	}
	cctx, cancel = call()
	id.Info, id.InfoMeasured = c.InfoMetrics(cctx)
	cancel()
	return id, model, nil
}

// RunCycle probes every prompt of s once, in order, plus the identity tier
// (/v1/models, /version, /metrics) and the tool prompts, and returns the
// cycle and what the backend was seen to support. Any failed prompt fails
// the cycle: a partial cycle is never judged. Each request gets timeout (0:
// only ctx).
func (c *Client) RunCycle(ctx context.Context, s *drift.Suite, now time.Time, timeout time.Duration) (*drift.Cycle, Capabilities, error) {
	return c.RunTiers(ctx, s, now, timeout, Tiers{Sampled: true, Tools: true})
}

// Tiers selects what RunTiers probes besides the identity tier, which it
// always reads (GET requests only: no tokens).
type Tiers struct {
	Sampled bool // the suite's prompts
	Tools   bool // the suite's tool prompts (chat endpoint only)
	// SampledUsage and ToolsUsage, when not nil, receive the usage the
	// answers of each tier report (the probe budget's charge).
	SampledUsage, ToolsUsage *usageMeter
}

// RunTiers is RunCycle of the tiers t selects: a cycle without the sampled
// tier has no observations (and Capabilities says nothing of logprobs or
// fingerprints); without the tool tier, no tool answers.
func (c *Client) RunTiers(ctx context.Context, s *drift.Suite, now time.Time, timeout time.Duration, t Tiers) (*drift.Cycle, Capabilities, error) {
	call := func() (context.Context, context.CancelFunc) {
		if timeout > 0 {
			return context.WithTimeout(ctx, timeout)
		}
		return context.WithCancel(ctx)
	}
	cy := &drift.Cycle{At: now}
	var caps Capabilities
	id, model, err := c.identity(ctx, call)
	if err != nil {
		return nil, caps, err
	}
	cy.Identity = id
	caps.Version = id.Version != ""
	if t.Sampled {
		if err := c.runSampled(withMeter(ctx, t.SampledUsage), timeout, model, s, cy, &caps); err != nil {
			return nil, caps, err
		}
	}
	if t.Tools && s.Tools != nil && c.t.Endpoint != EndpointCompletions {
		tctx := withMeter(ctx, t.ToolsUsage)
		tcall := func() (context.Context, context.CancelFunc) {
			if timeout > 0 {
				return context.WithTimeout(tctx, timeout)
			}
			return context.WithCancel(tctx)
		}
		if cy.Tools, err = c.runTools(tctx, tcall, model, s.Tools); err != nil {
			return nil, caps, err
		}
	}
	return cy, caps, nil
}

// runSampled probes every prompt of s once, in order, into cy.
func (c *Client) runSampled(ctx context.Context, timeout time.Duration, model string, s *drift.Suite, cy *drift.Cycle, caps *Capabilities) error {
	fps := map[string]int{}
	caps.Logprobs = true
	for _, p := range s.Prompts {
		cctx, cancel := context.WithCancel(ctx)
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, timeout)
		}
		o, err := c.Probe(cctx, model, p)
		cancel()
		if err != nil {
			return err
		}
		caps.Logprobs = caps.Logprobs && o.HasLogprobs
		for _, t := range o.Tokens {
			caps.TopLogprobsCap = max(caps.TopLogprobsCap, len(t.Top))
		}
		if o.Fingerprint != "" {
			fps[o.Fingerprint]++
		}
		cy.Identity.PromptTokens = append(cy.Identity.PromptTokens, o.PromptTokens)
		cy.Obs = append(cy.Obs, o)
	}
	for fp, n := range fps {
		if n > fps[cy.Identity.Fingerprint] || n == fps[cy.Identity.Fingerprint] && fp < cy.Identity.Fingerprint {
			cy.Identity.Fingerprint = fp
		}
	}
	caps.Fingerprint = cy.Identity.Fingerprint != ""
	return nil
}
