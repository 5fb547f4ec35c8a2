package probes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Teacher-forced probes (docs/DRIFT.md "Teacher-forced probes"): where the
// backend returns the logprobs of the prompt's own tokens (vLLM's
// /v1/completions with "echo": true and "logprobs", the legacy OpenAI
// completions shape), the suite's fixed texts are scored as they stand
// instead of sampling continuations. Every cycle then measures the model at
// the same positions in the same contexts: no greedy path can diverge, so
// the statistic follows the model and not the path.

// canonicalTeacher is the request that scores a fixed text: the text is
// the prompt, echoed with its logprobs; one token is generated (and
// ignored) because not every server accepts max_tokens 0.
type canonicalTeacher struct {
	Model       string  `json:"model"`
	Prompt      string  `json:"prompt"`
	Temperature float64 `json:"temperature"`
	MaxTokens   int     `json:"max_tokens"`
	Echo        bool    `json:"echo"`
	Logprobs    int     `json:"logprobs"`
	Seed        int     `json:"seed"`
}

// TeacherRequestBody is the canonical scoring request of a fixed text on
// POST /v1/completions:
//
//	{"model":"…","prompt":"…","temperature":0,"max_tokens":1,"echo":true,"logprobs":1,"seed":1}
func TeacherRequestBody(model, text string) []byte {
	b, _ := json.Marshal(canonicalTeacher{Model: model, Prompt: text, MaxTokens: 1, Echo: true, Logprobs: 1, Seed: 1})
	return b
}

// teacherResponse decodes the parts of an echoed completion a teacher probe
// reads: the parallel token and token_logprobs arrays (the first prompt
// token's logprob is null), vLLM's prompt_logprobs as a fallback, and the
// usage that says how many of the tokens are the prompt's.
type teacherResponse struct {
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Logprobs *struct {
			Tokens        []string   `json:"tokens"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
		// PromptLogprobs is vLLM's extension: per prompt token null (the
		// first) or a map from token id to its logprob. Read only where
		// each map holds the prompt token alone (prompt_logprobs 0).
		PromptLogprobs []map[string]struct {
			Logprob      float64 `json:"logprob"`
			DecodedToken string  `json:"decoded_token"`
		} `json:"prompt_logprobs"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

// TeacherScore is what a backend said about one fixed text: the logprob of
// every prompt token but the first (which has none), in order.
type TeacherScore struct {
	Tokens       []drift.Token
	PromptTokens int
	Model        string
	Fingerprint  string
}

// DecodeTeacherResponse reads the prompt logprobs out of an echoed
// /v1/completions response. It fails with ErrNoPromptLogprobs when the
// answer has none (a server that ignored echo: no logprobs, a first
// token_logprob that is not null, fewer logprobs than prompt tokens) and
// with ErrBadResponse when it is not JSON of that shape or a logprob is
// not a finite number <= 0.
func DecodeTeacherResponse(data []byte) (TeacherScore, error) {
	var r teacherResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return TeacherScore{}, fmt.Errorf("%w: %v", drift.ErrBadResponse, err)
	}
	if len(r.Choices) == 0 {
		return TeacherScore{}, fmt.Errorf("%w: no choices", drift.ErrBadResponse)
	}
	if r.Usage == nil || r.Usage.PromptTokens < 2 {
		return TeacherScore{}, fmt.Errorf("%w: usage.prompt_tokens missing or < 2", drift.ErrNoPromptLogprobs)
	}
	n := r.Usage.PromptTokens
	sc := TeacherScore{PromptTokens: n, Model: r.Model, Fingerprint: r.SystemFingerprint}
	ch := r.Choices[0]
	check := func(j int, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v > 1e-6 {
			return fmt.Errorf("%w: prompt token %d has logprob %v", drift.ErrBadResponse, j, v)
		}
		return nil
	}
	if lp := ch.Logprobs; lp != nil && len(lp.TokenLogprobs) > 0 && lp.TokenLogprobs[0] == nil {
		if len(lp.Tokens) != len(lp.TokenLogprobs) {
			return TeacherScore{}, fmt.Errorf("%w: %d tokens but %d token_logprobs", drift.ErrBadResponse, len(lp.Tokens), len(lp.TokenLogprobs))
		}
		if len(lp.TokenLogprobs) < n {
			return TeacherScore{}, fmt.Errorf("%w: %d token_logprobs for %d prompt tokens", drift.ErrNoPromptLogprobs, len(lp.TokenLogprobs), n)
		}
		for j := 1; j < n; j++ {
			v := lp.TokenLogprobs[j]
			if v == nil {
				return TeacherScore{}, fmt.Errorf("%w: prompt token %d has no logprob", drift.ErrBadResponse, j)
			}
			if err := check(j, *v); err != nil {
				return TeacherScore{}, err
			}
			sc.Tokens = append(sc.Tokens, drift.Token{Token: lp.Tokens[j], Logprob: min(*v, 0)})
		}
		return sc, nil
	}
	if pl := ch.PromptLogprobs; len(pl) >= n && pl[0] == nil {
		for j := 1; j < n; j++ {
			if len(pl[j]) != 1 {
				return TeacherScore{}, fmt.Errorf("%w: prompt_logprobs[%d] holds %d tokens, want the prompt token alone", drift.ErrNoPromptLogprobs, j, len(pl[j]))
			}
			for id, e := range pl[j] {
				if err := check(j, e.Logprob); err != nil {
					return TeacherScore{}, err
				}
				tok := e.DecodedToken
				if tok == "" {
					tok = "id:" + id
				}
				sc.Tokens = append(sc.Tokens, drift.Token{Token: tok, Logprob: min(e.Logprob, 0)})
			}
		}
		return sc, nil
	}
	return TeacherScore{}, fmt.Errorf("%w: the answer carries no prompt logprobs (echo ignored?)", drift.ErrNoPromptLogprobs)
}

// Score sends a fixed text's scoring request to POST /v1/completions,
// whatever the target's endpoint (chat templates would add tokens the text
// does not have). A 400, 404, 422 or 501 answer, or an answer without
// prompt logprobs, is a ProbeError of kind ErrKindNoPromptLogprobs wrapping
// ErrNoPromptLogprobs.
func (c *Client) Score(ctx context.Context, model string, t drift.TeacherText) (drift.Observation, error) {
	const op = "POST /v1/completions (echo)"
	data, err := c.do(ctx, http.MethodPost, "/v1/completions", TeacherRequestBody(model, t.Text))
	var pe *drift.ProbeError
	if errors.As(err, &pe) && pe.Kind == drift.ErrKindStatus && slices.Contains([]int{http.StatusBadRequest,
		http.StatusNotFound, http.StatusUnprocessableEntity, http.StatusNotImplemented}, pe.Status) {
		return drift.Observation{}, &drift.ProbeError{Kind: drift.ErrKindNoPromptLogprobs, Status: pe.Status, Op: op, Err: fmt.Errorf("%w: %w", drift.ErrNoPromptLogprobs, pe.Err)}
	}
	if err != nil {
		return drift.Observation{}, err
	}
	sc, err := DecodeTeacherResponse(data)
	switch {
	case errors.Is(err, drift.ErrNoPromptLogprobs):
		return drift.Observation{}, &drift.ProbeError{Kind: drift.ErrKindNoPromptLogprobs, Op: op, Err: err}
	case err != nil:
		return drift.Observation{}, &drift.ProbeError{Kind: drift.ErrKindMalformed, Op: op, Err: err}
	}
	return sc.Observation(t.ID), nil
}

// Observation records a teacher score like a probe response: the scored
// tokens as its sequence (always the text's own), with logprobs.
func (sc TeacherScore) Observation(id string) drift.Observation {
	o := drift.Observation{Prompt: id, Tokens: sc.Tokens, HasLogprobs: true, Model: sc.Model,
		Fingerprint: sc.Fingerprint, PromptTokens: sc.PromptTokens}
	var b strings.Builder
	for _, t := range sc.Tokens {
		b.WriteString(t.Token)
	}
	o.Text = b.String()
	return o
}

// ScoreTexts scores every text of ts in order, each request bounded by
// timeout (0: only ctx). The first failure ends it.
func (c *Client) ScoreTexts(ctx context.Context, model string, ts []drift.TeacherText, timeout time.Duration) ([]drift.Observation, error) {
	out := make([]drift.Observation, 0, len(ts))
	for _, t := range ts {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, timeout)
		}
		o, err := c.Score(cctx, model, t)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// teacherModel is the model a cycle's scoring requests name: the target's,
// else the first of its preferred models that /v1/models listed, else the
// first listed (the choice RunCycle makes).
func teacherModel(t Target, ids []string) string {
	if t.Model != "" {
		return t.Model
	}
	for _, m := range t.PreferModels {
		if slices.Contains(ids, m) {
			return m
		}
	}
	if len(ids) > 0 {
		return ids[0]
	}
	return ""
}

// teach scores the suite's fixed texts into cy when the backend's monitor
// wants them (Monitor.WantsTeacher). A backend that cannot score prompts
// (ErrNoPromptLogprobs) is not an error here: the cycle goes on without
// scores, and the Monitor either enrols the backend on its sampled probes
// alone or, when its baseline has a teacher tier, fails the cycle with a
// probe error of kind ErrKindNoPromptLogprobs. Called with st.run held.
func (p *Prober) teach(ctx context.Context, st *backendState, cy *drift.Cycle, caps *Capabilities) error {
	if !st.mon.WantsTeacher() {
		return nil
	}
	obs, err := st.client.ScoreTexts(ctx, teacherModel(st.t, cy.Identity.ModelIDs), p.suite.Teacher, p.s.Timeout)
	if errors.Is(err, drift.ErrNoPromptLogprobs) {
		// enrolling: judged on the sampled probes from now on; enrolled
		// with scores: the monitor fails the cycle (after its own check
		// that the sampled probes still carry logprobs)
		if st.mon.Baseline() == nil {
			p.s.Logf("probes: %s/%s: no teacher-forced scores (%v): sampled probes only", st.t.Pool, st.t.Backend, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	cy.Teacher = obs
	caps.PromptLogprobs = true
	return nil
}
