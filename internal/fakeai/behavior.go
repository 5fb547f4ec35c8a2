package fakeai

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"
)

// Behavior is how a fake backend answers: its latency, its failures and its
// identity. The zero value is a healthy, instant backend. Every field can be
// changed while the server runs (Server.SetBehavior, Server.UpdateBehavior,
// or POST /admin/behavior).
type Behavior struct {
	// TTFT is the base time to the first token. If zero, tokens start at once.
	TTFT time.Duration
	// TTFTPerPromptToken is added to TTFT for every prompt token that is not
	// a prefix-cache hit (prefill cost).
	TTFTPerPromptToken time.Duration
	// TokenTime is the time between generated tokens. If zero, all tokens
	// follow the first at once.
	TokenTime time.Duration

	// ErrorRate is the fraction of generation requests answered 500 after
	// TTFT (a slow failure). 0: none; 1: all.
	ErrorRate float64
	// InstantError answers every generation request 500 at once, before any
	// latency is simulated: the "fast failure trap" of the seed article.
	InstantError bool

	// ThrottleRate is the fraction of generation requests answered 429 at
	// once with a Retry-After header. 1 throttles every request.
	ThrottleRate float64
	// RetryAfter is the Retry-After a 429 carries (whole seconds in
	// Retry-After, milliseconds in retry-after-ms). If zero, 1s is used.
	RetryAfter time.Duration
	// BareThrottle sends the 429s without any retry hint, as a full queue
	// answers (text-generation-inference's overload), not a quota.
	BareThrottle bool

	// Hang makes generation requests never answer until the client cancels
	// or the server closes.
	Hang bool

	// BreakAfterTokens, when > 0, drops the connection after that many
	// generated tokens have been sent (streaming) or after half the body
	// (non-streaming): a backend dying mid-answer. Counted as an error.
	BreakAfterTokens int

	// StreamErrorAfterTokens, when > 0, ends a stream after that many
	// tokens with an OpenAI-style error event (`data: {"error": {...}}`)
	// and then `data: [DONE]`, with no finish chunk: a backend failing
	// mid-stream behind a 200 (vLLM and OpenAI do this). Counted as an
	// error. Non-streaming answers are not affected.
	StreamErrorAfterTokens int
	// StreamCutAfterTokens, when > 0, ends a stream after that many tokens
	// cleanly at the HTTP level but with no finish chunk and no
	// `data: [DONE]`: a stream cut short by something in between. Counted
	// as an error. Non-streaming answers are not affected.
	StreamCutAfterTokens int
	// BufferStream holds a stream's chunks back and flushes them all at
	// once with the last one, like a buffering proxy in front of the
	// backend: a stream in form only ("fake streaming").
	BufferStream bool

	// Refuse stops accepting connections: the listener is closed and open
	// connections are dropped, so clients see "connection refused". Setting
	// it back to false listens again on the same address. It only has an
	// effect on a server started with Listen or Start.
	Refuse bool

	// ColdStart is extra time taken by the first request after an idle gap
	// (and by the very first request), like a backend scaled to zero.
	// If zero, there are no cold starts.
	ColdStart time.Duration
	// IdleGap is how long without requests makes the backend cold again.
	// If zero, 5m is used.
	IdleGap time.Duration

	// MaxConcurrent limits generation requests in progress; the excess waits
	// for a slot (the wait is part of its TTFT), or is answered 429 when
	// RejectOverLimit is set. If zero, there is no limit.
	MaxConcurrent int
	// RejectOverLimit answers requests over MaxConcurrent with 429 instead
	// of queueing them.
	RejectOverLimit bool

	// Model is the model id reported in responses and /v1/models. If empty,
	// "fake-model" is used.
	Model string
	// Fingerprint, when not empty, is reported as system_fingerprint instead
	// of the Completer's.
	Fingerprint string
}

const (
	defaultRetryAfter = time.Second
	defaultIdleGap    = 5 * time.Minute
	defaultModel      = "fake-model"
)

func (b Behavior) retryAfter() time.Duration {
	if b.RetryAfter <= 0 {
		return defaultRetryAfter
	}
	return b.RetryAfter
}

func (b Behavior) idleGap() time.Duration {
	if b.IdleGap <= 0 {
		return defaultIdleGap
	}
	return b.IdleGap
}

func (b Behavior) model() string {
	if b.Model == "" {
		return defaultModel
	}
	return b.Model
}

// ErrBadBehavior is returned for a behavior patch that cannot be applied.
var ErrBadBehavior = errors.New("fakeai: bad behavior")

// BehaviorPatch is the JSON body of POST /admin/behavior: every field is
// optional and only the fields present change. Durations are milliseconds.
//
//	{"ttft_ms": 200, "error_rate": 0.5, "refuse": true}
type BehaviorPatch struct {
	TTFTMs               *float64 `json:"ttft_ms,omitempty"`
	TTFTPerPromptTokenMs *float64 `json:"ttft_per_prompt_token_ms,omitempty"`
	TokenTimeMs          *float64 `json:"token_time_ms,omitempty"`
	ErrorRate            *float64 `json:"error_rate,omitempty"`
	InstantError         *bool    `json:"instant_error,omitempty"`
	ThrottleRate         *float64 `json:"throttle_rate,omitempty"`
	RetryAfterMs         *float64 `json:"retry_after_ms,omitempty"`
	BareThrottle         *bool    `json:"bare_throttle,omitempty"`
	Hang                 *bool    `json:"hang,omitempty"`
	BreakAfterTokens     *int     `json:"break_after_tokens,omitempty"`
	StreamErrorAfter     *int     `json:"stream_error_after_tokens,omitempty"`
	StreamCutAfter       *int     `json:"stream_cut_after_tokens,omitempty"`
	BufferStream         *bool    `json:"buffer_stream,omitempty"`
	Refuse               *bool    `json:"refuse,omitempty"`
	ColdStartMs          *float64 `json:"cold_start_ms,omitempty"`
	IdleGapMs            *float64 `json:"idle_gap_ms,omitempty"`
	MaxConcurrent        *int     `json:"max_concurrent,omitempty"`
	RejectOverLimit      *bool    `json:"reject_over_limit,omitempty"`
	Model                *string  `json:"model,omitempty"`
	Fingerprint          *string  `json:"fingerprint,omitempty"`
}

// Apply returns b changed by the fields present in p, or an error naming the
// first invalid field.
func (p BehaviorPatch) Apply(b Behavior) (Behavior, error) {
	dur := func(name string, ms *float64, dst *time.Duration) error {
		if ms == nil {
			return nil
		}
		if math.IsNaN(*ms) || *ms < 0 || *ms > float64(math.MaxInt64/int64(time.Millisecond)) {
			return fmt.Errorf("%w: %s = %v: must be >= 0", ErrBadBehavior, name, *ms)
		}
		*dst = time.Duration(*ms * float64(time.Millisecond))
		return nil
	}
	rate := func(name string, r *float64, dst *float64) error {
		if r == nil {
			return nil
		}
		if !(*r >= 0 && *r <= 1) {
			return fmt.Errorf("%w: %s = %v: must be in [0, 1]", ErrBadBehavior, name, *r)
		}
		*dst = *r
		return nil
	}
	flag := func(v *bool, dst *bool) {
		if v != nil {
			*dst = *v
		}
	}
	for _, err := range []error{
		dur("ttft_ms", p.TTFTMs, &b.TTFT),
		dur("ttft_per_prompt_token_ms", p.TTFTPerPromptTokenMs, &b.TTFTPerPromptToken),
		dur("token_time_ms", p.TokenTimeMs, &b.TokenTime),
		rate("error_rate", p.ErrorRate, &b.ErrorRate),
		rate("throttle_rate", p.ThrottleRate, &b.ThrottleRate),
		dur("retry_after_ms", p.RetryAfterMs, &b.RetryAfter),
		dur("cold_start_ms", p.ColdStartMs, &b.ColdStart),
		dur("idle_gap_ms", p.IdleGapMs, &b.IdleGap),
	} {
		if err != nil {
			return b, err
		}
	}
	if p.MaxConcurrent != nil {
		if *p.MaxConcurrent < 0 {
			return b, fmt.Errorf("%w: max_concurrent = %d: must be >= 0", ErrBadBehavior, *p.MaxConcurrent)
		}
		b.MaxConcurrent = *p.MaxConcurrent
	}
	if p.BreakAfterTokens != nil {
		if *p.BreakAfterTokens < 0 {
			return b, fmt.Errorf("%w: break_after_tokens = %d: must be >= 0", ErrBadBehavior, *p.BreakAfterTokens)
		}
		b.BreakAfterTokens = *p.BreakAfterTokens
	}
	for _, n := range []struct {
		name string
		v    *int
		dst  *int
	}{
		{"stream_error_after_tokens", p.StreamErrorAfter, &b.StreamErrorAfterTokens},
		{"stream_cut_after_tokens", p.StreamCutAfter, &b.StreamCutAfterTokens},
	} {
		if n.v == nil {
			continue
		}
		if *n.v < 0 {
			return b, fmt.Errorf("%w: %s = %d: must be >= 0", ErrBadBehavior, n.name, *n.v)
		}
		*n.dst = *n.v
	}
	flag(p.BufferStream, &b.BufferStream)
	flag(p.InstantError, &b.InstantError)
	flag(p.BareThrottle, &b.BareThrottle)
	flag(p.Hang, &b.Hang)
	flag(p.Refuse, &b.Refuse)
	flag(p.RejectOverLimit, &b.RejectOverLimit)
	if p.Model != nil {
		b.Model = *p.Model
	}
	if p.Fingerprint != nil {
		b.Fingerprint = *p.Fingerprint
	}
	return b, nil
}

// PatchOf returns the patch that sets every field to b's value, which is
// also the JSON that GET /admin/behavior answers.
func PatchOf(b Behavior) BehaviorPatch {
	ms := func(d time.Duration) *float64 { v := float64(d) / float64(time.Millisecond); return &v }
	f := func(v float64) *float64 { return &v }
	t := func(v bool) *bool { return &v }
	mc, model, fp, brk := b.MaxConcurrent, b.Model, b.Fingerprint, b.BreakAfterTokens
	serr, cut := b.StreamErrorAfterTokens, b.StreamCutAfterTokens
	return BehaviorPatch{
		TTFTMs: ms(b.TTFT), TTFTPerPromptTokenMs: ms(b.TTFTPerPromptToken), TokenTimeMs: ms(b.TokenTime),
		ErrorRate: f(b.ErrorRate), InstantError: t(b.InstantError),
		ThrottleRate: f(b.ThrottleRate), RetryAfterMs: ms(b.RetryAfter), BareThrottle: t(b.BareThrottle),
		Hang: t(b.Hang), Refuse: t(b.Refuse), BreakAfterTokens: &brk,
		StreamErrorAfter: &serr, StreamCutAfter: &cut, BufferStream: t(b.BufferStream),
		ColdStartMs: ms(b.ColdStart), IdleGapMs: ms(b.IdleGap),
		MaxConcurrent: &mc, RejectOverLimit: t(b.RejectOverLimit),
		Model: &model, Fingerprint: &fp,
	}
}

// AdminHandler serves the control endpoints of s:
//
//	GET  /admin/behavior  the current behavior (BehaviorPatch JSON)
//	POST /admin/behavior  apply a BehaviorPatch; answers the new behavior
//	GET  /admin/stats     the request counters (Stats JSON)
//	POST /admin/reset     zero the counters
//	GET  /admin/identity  the identity (Identity JSON)
//	POST /admin/identity  change it: the fields present replace the current ones
//	GET  /admin/tools     how requests with tools are answered (ToolSettings JSON)
//	POST /admin/tools     replace it, e.g. {"break":0.4,"modes":["invalid_json"]}
//
// The same endpoints are served by s itself; AdminHandler lets a caller also
// mount them on a separate listener, so that a backend that refuses
// connections can still be told to accept them again.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/behavior", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, PatchOf(s.Behavior()))
	})
	mux.HandleFunc("POST /admin/behavior", func(w http.ResponseWriter, r *http.Request) {
		var p BehaviorPatch
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		b, err := s.UpdateBehavior(p.Apply)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		writeJSON(w, http.StatusOK, PatchOf(b))
	})
	mux.HandleFunc("GET /admin/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	})
	mux.HandleFunc("POST /admin/reset", func(w http.ResponseWriter, r *http.Request) {
		s.ResetStats()
		writeJSON(w, http.StatusOK, s.Stats())
	})
	s.identityAdmin(mux) // GET and POST /admin/identity
	s.toolAdmin(mux)     // GET and POST /admin/tools
	return mux
}
