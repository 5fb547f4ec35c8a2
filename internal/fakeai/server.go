// Package fakeai is a fake OpenAI-compatible inference backend over real
// HTTP, for tests, the demo and docker-compose. It serves
// POST /v1/chat/completions and /v1/completions (streaming SSE and not, with
// usage, system_fingerprint and logprobs in the OpenAI shapes, and the
// prompt's own logprobs on "echo" or "prompt_logprobs" where the Completer
// is a PromptScorer, as vLLM does: teacher.go),
// POST /v1/embeddings, GET /v1/models, GET /version, GET /health and
// GET /metrics (vLLM's load gauges and configuration info gauges, see
// Identity), and vLLM's ORCA load report header on non-streaming answers
// when asked for it (metrics.go).
//
// Its Behavior (latency, 500s, instant 500s, 429s with Retry-After, hangs,
// refused connections, cold starts, a concurrency limit, streams that end
// in an error event, are cut or arrive all at once, model id and
// fingerprint) can be changed while it runs, from Go or through
// POST /admin/behavior, so that tests and the demo can script incidents.
// Content comes from a pluggable Completer (default Echo). Every request is
// counted by outcome (Stats).
package fakeai

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Settings configures a Server. The zero value is a healthy, instant echo
// backend.
type Settings struct {
	// Name identifies the backend in the X-Fakeai-Name response header.
	// If empty, "fakeai" is used.
	Name string
	// Behavior is the initial behavior. The zero value is healthy and
	// instant.
	Behavior Behavior
	// Completer produces the content. If nil, Echo{} is used.
	Completer Completer
	// Seed seeds the draws of ErrorRate and ThrottleRate. If zero, 1 is used.
	Seed uint64
	// EmbeddingDim is the length of embedding vectors when the request names
	// no dimensions. If zero, 16 is used.
	EmbeddingDim int
	// PrefixCacheSize bounds the system prompts remembered for prefix-cache
	// hits. If zero, 1024 is used.
	PrefixCacheSize int
	// KVCacheRequests is how many running requests fill the fake KV cache
	// that /metrics and the ORCA header report (metrics.go). If zero, 32
	// is used.
	KVCacheRequests int
	// Identity is what the backend says about its artefact (/v1/models
	// root and max_model_len, /version, the info gauges of /metrics). The
	// zero value is an unquantized bfloat16 model.
	Identity Identity
}

// Stats counts requests to the generation and embedding endpoints by
// outcome. Requests = OK + Errors + Throttled + Canceled + BadRequests +
// InFlight.
type Stats struct {
	Requests    int64 `json:"requests"`
	OK          int64 `json:"ok"`
	Errors      int64 `json:"errors"`    // answered 500
	Throttled   int64 `json:"throttled"` // answered 429
	Canceled    int64 `json:"canceled"`  // the client went away first
	BadRequests int64 `json:"bad_requests"`
	Cold        int64 `json:"cold"` // requests that paid a cold start
	CacheHits   int64 `json:"cache_hits"`
	InFlight    int64 `json:"in_flight"`
	Waiting     int64 `json:"waiting"` // queued for a MaxConcurrent slot
	Busy        int64 `json:"busy"`    // holding a MaxConcurrent slot (admitted: their behavior is fixed)
	MaxInFlight int64 `json:"max_in_flight"`
}

// Server is a fake backend. It is an http.Handler; Listen and Start also
// run it on a listener of its own so that Behavior.Refuse can close it.
type Server struct {
	name         string
	embeddingDim int
	cacheSize    int
	kvRequests   int
	mux          *http.ServeMux

	// mu guards the fields below it.
	mu         sync.Mutex
	behavior   Behavior
	completer  Completer
	rng        *rand.Rand
	lastActive time.Time // zero until the first request: the backend starts cold
	prefixes   map[uint64]struct{}
	slotsUsed  int
	slotFreed  chan struct{} // closed and replaced whenever a slot is released

	requests, ok, errs, throttled, canceled, badRequests atomic.Int64
	cold, cacheHits, inFlight, maxInFlight, waiting      atomic.Int64

	lis listener // the owned listener, when Listen or Start was used

	toolMu sync.Mutex // guards tools
	tools  *ToolModel // answers requests with tools (tool.go); nil: the zero ToolModel

	idMu     sync.Mutex // guards identity
	identity Identity
}

// New returns a Server with settings s.
func New(s Settings) *Server {
	srv := &Server{
		name:         s.Name,
		embeddingDim: s.EmbeddingDim,
		cacheSize:    s.PrefixCacheSize,
		kvRequests:   max(s.KVCacheRequests, 0),
		behavior:     s.Behavior,
		completer:    s.Completer,
		prefixes:     make(map[uint64]struct{}),
		slotFreed:    make(chan struct{}),
		identity:     s.Identity,
	}
	if srv.name == "" {
		srv.name = "fakeai"
	}
	if srv.embeddingDim <= 0 {
		srv.embeddingDim = 16
	}
	if srv.cacheSize <= 0 {
		srv.cacheSize = 1024
	}
	if srv.kvRequests == 0 {
		srv.kvRequests = 32
	}
	if srv.completer == nil {
		srv.completer = Echo{}
	}
	seed := s.Seed
	if seed == 0 {
		seed = 1
	}
	srv.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { srv.generate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { srv.generate(w, r, false) })
	mux.HandleFunc("POST /v1/embeddings", srv.embeddings)
	srv.identityRoutes(mux) // GET /v1/models, /version; /admin/identity
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /metrics", srv.serveMetrics)
	mux.Handle("/admin/", srv.AdminHandler())
	srv.mux = mux
	return srv
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Fakeai-Name", s.name)
	s.mux.ServeHTTP(w, r)
}

// Name returns the backend's name.
func (s *Server) Name() string { return s.name }

// Behavior returns the current behavior.
func (s *Server) Behavior() Behavior {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.behavior
}

// SetBehavior replaces the behavior. Requests already past their admission
// keep the behavior they started with.
func (s *Server) SetBehavior(b Behavior) {
	s.UpdateBehavior(func(Behavior) (Behavior, error) { return b, nil })
}

// UpdateBehavior applies change to the current behavior atomically and
// returns the result; when change fails nothing changes. A change of Refuse
// closes or reopens the owned listener.
func (s *Server) UpdateBehavior(change func(Behavior) (Behavior, error)) (Behavior, error) {
	s.mu.Lock()
	b, err := change(s.behavior)
	if err != nil {
		s.mu.Unlock()
		return s.behavior, err
	}
	s.behavior = b
	s.wakeWaitersLocked() // MaxConcurrent may have grown
	s.mu.Unlock()
	// Outside mu: closing the listener waits for nothing of ours, but keeps
	// the rule that no I/O happens under the lock.
	if err := s.lis.setRefusing(b.Refuse, s); err != nil {
		return b, err
	}
	return b, nil
}

// SetCompleter replaces the Completer (nil restores Echo{}).
func (s *Server) SetCompleter(c Completer) {
	if c == nil {
		c = Echo{}
	}
	s.mu.Lock()
	s.completer = c
	s.mu.Unlock()
}

// Stats returns the request counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	busy := int64(s.slotsUsed)
	s.mu.Unlock()
	return Stats{Busy: busy,
		Requests: s.requests.Load(), OK: s.ok.Load(), Errors: s.errs.Load(),
		Throttled: s.throttled.Load(), Canceled: s.canceled.Load(), BadRequests: s.badRequests.Load(),
		Cold: s.cold.Load(), CacheHits: s.cacheHits.Load(),
		InFlight: s.inFlight.Load(), MaxInFlight: s.maxInFlight.Load(), Waiting: s.waiting.Load(),
	}
}

// ResetStats zeroes the counters (InFlight excepted).
func (s *Server) ResetStats() {
	for _, c := range []*atomic.Int64{&s.requests, &s.ok, &s.errs, &s.throttled, &s.canceled,
		&s.badRequests, &s.cold, &s.cacheHits} {
		c.Store(0)
	}
	s.requests.Add(s.inFlight.Load())
	s.maxInFlight.Store(s.inFlight.Load())
}

// admission is what one request drew at its start.
type admission struct {
	b         Behavior
	completer Completer
	fail      bool // answer 500 after TTFT
	throttle  bool // answer 429 at once
	cold      bool // pay ColdStart
}

func (s *Server) admit() admission {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	a := admission{b: s.behavior, completer: s.completer}
	a.throttle = a.b.ThrottleRate > 0 && s.rng.Float64() < a.b.ThrottleRate
	a.fail = a.b.ErrorRate > 0 && s.rng.Float64() < a.b.ErrorRate
	a.cold = a.b.ColdStart > 0 && (s.lastActive.IsZero() || now.Sub(s.lastActive) >= a.b.idleGap())
	s.lastActive = now
	return a
}

// touch records activity at the end of a request, so that the idle gap
// counts from the last byte rather than from the last arrival.
func (s *Server) touch() {
	now := time.Now()
	s.mu.Lock()
	s.lastActive = now
	s.mu.Unlock()
}

// cachedPrefix reports whether the system prompt was seen before, and
// remembers it.
func (s *Server) cachedPrefix(system string) bool {
	if system == "" {
		return false
	}
	h := fnv.New64a()
	h.Write([]byte(system))
	key := h.Sum64()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.prefixes[key]; ok {
		return true
	}
	if len(s.prefixes) >= s.cacheSize {
		clear(s.prefixes) // a crude eviction is enough for a fake
	}
	s.prefixes[key] = struct{}{}
	return false
}

var errOverLimit = errors.New("fakeai: over the concurrency limit")

// acquire takes a concurrency slot, waiting for one unless the behavior
// rejects over-limit requests. It returns a release function.
func (s *Server) acquire(ctx context.Context) (func(), error) {
	for {
		s.mu.Lock()
		limit := s.behavior.MaxConcurrent
		if limit <= 0 || s.slotsUsed < limit {
			s.slotsUsed++
			s.mu.Unlock()
			return s.release, nil
		}
		if s.behavior.RejectOverLimit {
			s.mu.Unlock()
			return nil, errOverLimit
		}
		freed := s.slotFreed
		s.mu.Unlock()
		s.waiting.Add(1)
		select {
		case <-freed:
			s.waiting.Add(-1)
		case <-ctx.Done():
			s.waiting.Add(-1)
			return nil, ctx.Err()
		}
	}
}

func (s *Server) release() {
	s.mu.Lock()
	s.slotsUsed--
	s.wakeWaitersLocked()
	s.mu.Unlock()
}

func (s *Server) wakeWaitersLocked() {
	close(s.slotFreed)
	s.slotFreed = make(chan struct{})
}

// sleep waits d or until ctx is done, and reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) begin() {
	s.requests.Add(1)
	n := s.inFlight.Add(1)
	for {
		m := s.maxInFlight.Load()
		if n <= m || s.maxInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

func (s *Server) throttle(w http.ResponseWriter, b Behavior) {
	if b.BareThrottle {
		s.throttled.Add(1)
		writeError(w, http.StatusTooManyRequests, "overloaded", "fakeai: the queue is full")
		return
	}
	ra := b.retryAfter()
	secs := int64((ra + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	w.Header().Set("retry-after-ms", strconv.FormatInt(ra.Milliseconds(), 10))
	s.throttled.Add(1)
	writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "fakeai: rate limited")
}

func (s *Server) fail(w http.ResponseWriter) {
	s.errs.Add(1)
	writeError(w, http.StatusInternalServerError, "server_error", "fakeai: injected server error")
}

// gate runs the failure knobs shared by every POST endpoint. It reports
// whether the request may proceed; if not, it has answered (or the client
// has gone) and counted the outcome. release must be called when ok.
func (s *Server) gate(w http.ResponseWriter, r *http.Request) (a admission, release func(), ok bool) {
	a = s.admit()
	ctx := r.Context()
	switch {
	case a.b.InstantError:
		s.fail(w)
		return a, nil, false
	case a.throttle:
		s.throttle(w, a.b)
		return a, nil, false
	case a.b.Hang:
		<-ctx.Done()
		s.canceled.Add(1)
		return a, nil, false
	}
	release, err := s.acquire(ctx)
	switch {
	case errors.Is(err, errOverLimit):
		s.throttle(w, a.b)
		return a, nil, false
	case err != nil:
		s.canceled.Add(1)
		return a, nil, false
	}
	if a.cold {
		s.cold.Add(1)
		w.Header().Set("X-Fakeai-Cold", "true")
	}
	return a, release, true
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	s.begin()
	defer s.inFlight.Add(-1)
	defer s.touch()
	req, raw, system, err := parseGeneration(r, chat)
	if err != nil {
		s.badRequests.Add(1)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	a, release, ok := s.gate(w, r)
	if !ok {
		return
	}
	defer release()
	ctx := r.Context()
	echo, err := promptEchoOf(a.completer, req, raw, chat)
	if err != nil {
		s.badRequests.Add(1)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}

	c := echo.complete(a.completer, req)
	var calls []ToolCall
	if chat && !raw.Stream {
		if calls, err = s.answerTools(raw, req, &c); err != nil {
			s.badRequests.Add(1)
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
	}
	if a.b.Fingerprint != "" {
		c.Fingerprint = a.b.Fingerprint
	}
	cached := 0
	if chat && s.cachedPrefix(system) {
		cached = min(CountTokens(system), c.PromptTokens)
		s.cacheHits.Add(1)
	}
	ttft := a.b.TTFT + time.Duration(c.PromptTokens-cached)*a.b.TTFTPerPromptToken
	if a.cold {
		ttft += a.b.ColdStart
	}
	if a.fail {
		if !sleep(ctx, ttft) {
			s.canceled.Add(1)
			return
		}
		s.fail(w)
		return
	}
	logprobs := req.Logprobs && !c.NoLogprobs
	u := &usage{PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens,
		TotalTokens: c.PromptTokens + c.CompletionTokens}
	if chat {
		u.PromptTokensDetails = &promptTokenDetails{CachedTokens: cached}
	}
	base := response{
		ID:                fmt.Sprintf("%s-%d", idPrefix(chat), s.requests.Load()),
		Created:           time.Now().Unix(),
		Model:             a.b.model(),
		SystemFingerprint: c.Fingerprint,
	}
	var done bool
	if raw.Stream {
		switch s.stream(ctx, w, base, c, u, a.b, ttft, chat, logprobs,
			raw.StreamOptions != nil && raw.StreamOptions.IncludeUsage) {
		case streamDone:
			done = true
		case streamFailed:
			s.errs.Add(1)
			return
		}
	} else {
		done = sleep(ctx, ttft+time.Duration(max(len(c.Tokens)-1, 0))*a.b.TokenTime)
		if done {
			s.answer(w, r, answerParts{base: base, c: c, u: u, calls: calls, echo: echo, prompt: req.Prompt,
				chat: chat, logprobs: logprobs, breakOff: a.b.BreakAfterTokens > 0})
		}
	}
	if !done {
		s.canceled.Add(1)
		return
	}
	s.ok.Add(1)
}

// answerParts are what a non-streaming answer is made of.
type answerParts struct {
	base     response
	c        Completion
	u        *usage
	calls    []ToolCall
	echo     *promptEcho
	prompt   string
	chat     bool
	logprobs bool
	breakOff bool
}

// answer writes a non-streaming chat or text completion.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, p answerParts) {
	base, c := p.base, p.c
	finish := c.FinishReason
	if p.chat {
		base.Object = "chat.completion"
		ch := chatChoice{Message: &chatDelta{Role: "assistant", Content: &c.Text}, FinishReason: &finish}
		if p.logprobs {
			ch.Logprobs = chatLogprobsOf(c.Tokens)
		}
		withToolCalls(&ch, p.calls, base.ID, p.u)
		base.Choices = []chatChoice{ch}
	} else {
		base.Object = "text_completion"
		ch := completionChoice{Text: c.Text, FinishReason: &finish}
		if p.logprobs {
			ch.Logprobs = completionLogprobsOf(c.Tokens, 0)
		}
		base.Choices = []completionChoice{ch}
		if p.echo != nil {
			base.Choices = []echoChoice{p.echo.choice(p.prompt, c, finish, p.logprobs)}
		}
	}
	base.Usage = p.u
	if p.breakOff {
		s.breakOff(w, base)
	}
	s.orcaHeader(w, r)
	writeJSON(w, http.StatusOK, base)
}

// breakOff sends the first half of a non-streaming answer and drops the
// connection.
func (s *Server) breakOff(w http.ResponseWriter, v response) {
	b, _ := jsonMarshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b[:len(b)/2])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	s.errs.Add(1)
	panic(http.ErrAbortHandler) // net/http drops the connection
}

func idPrefix(chat bool) string {
	if chat {
		return "chatcmpl-fake"
	}
	return "cmpl-fake"
}

// stream writes the SSE response: a role chunk at once (chat), the first
// token after ttft, one chunk per token every TokenTime, a finish chunk, an
// optional usage chunk and [DONE], and reports how it ended.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, base response, c Completion, u *usage,
	b Behavior, ttft time.Duration, chat, logprobs, includeUsage bool) streamEnd {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := io.Writer(w)
	if b.BufferStream {
		var held bytes.Buffer
		out, flusher = &held, nil
		defer func() { w.Write(held.Bytes()) }() // all at once, as the handler returns
	}
	send := func(v response) bool {
		b, err := jsonMarshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(out, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	if chat {
		base.Object = "chat.completion.chunk"
		empty := ""
		role := base
		role.Choices = []chatChoice{{Delta: &chatDelta{Role: "assistant", Content: &empty}}}
		if !send(role) {
			return streamLeft
		}
	} else {
		base.Object = "text_completion"
	}
	if !sleep(ctx, ttft) {
		return streamLeft
	}
	offset := 0
	for i, t := range c.Tokens {
		if i > 0 && !sleep(ctx, b.TokenTime) {
			return streamLeft
		}
		chunk := tokenChunk(base, c.Tokens[i:i+1], offset, chat, logprobs)
		offset += len(t.Token)
		if !send(chunk) {
			return streamLeft
		}
		if i+1 == b.BreakAfterTokens {
			s.errs.Add(1)
			panic(http.ErrAbortHandler) // net/http drops the connection
		}
		if i+1 == b.StreamErrorAfterTokens {
			fmt.Fprint(out, `data: {"error":{"message":"fakeai: generation failed mid-stream","type":"server_error","code":500}}`+
				"\n\ndata: [DONE]\n\n")
			return streamFailed
		}
		if i+1 == b.StreamCutAfterTokens {
			return streamFailed
		}
	}
	finish := c.FinishReason
	last := base
	if chat {
		last.Choices = []chatChoice{{Delta: &chatDelta{}, FinishReason: &finish}}
	} else {
		last.Choices = []completionChoice{{FinishReason: &finish}}
	}
	if !send(last) {
		return streamLeft
	}
	if includeUsage {
		tail := base
		tail.Choices = []struct{}{}
		tail.Usage = u
		if !send(tail) {
			return streamLeft
		}
	}
	if _, err := fmt.Fprint(out, "data: [DONE]\n\n"); err != nil {
		return streamLeft
	}
	if flusher != nil {
		flusher.Flush()
	}
	if ctx.Err() != nil {
		return streamLeft
	}
	return streamDone
}

// tokenChunk is the stream chunk of one token (toks holds it) at byte
// offset of the text.
func tokenChunk(base response, toks []TokenLogprob, offset int, chat, logprobs bool) response {
	chunk := base
	if chat {
		tok := toks[0].Token
		ch := chatChoice{Delta: &chatDelta{Content: &tok}}
		if logprobs {
			ch.Logprobs = chatLogprobsOf(toks)
		}
		chunk.Choices = []chatChoice{ch}
		return chunk
	}
	ch := completionChoice{Text: toks[0].Token}
	if logprobs {
		ch.Logprobs = completionLogprobsOf(toks, offset)
	}
	chunk.Choices = []completionChoice{ch}
	return chunk
}

// streamEnd is how a stream ended.
type streamEnd uint8

const (
	streamDone   streamEnd = iota // sent in full
	streamLeft                    // the client left
	streamFailed                  // ended early on purpose (StreamErrorAfterTokens, StreamCutAfterTokens)
)

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	s.begin()
	defer s.inFlight.Add(-1)
	defer s.touch()
	var req embeddingRequest
	if err := decodeBody(r, &req); err != nil {
		s.badRequests.Add(1)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	inputs, err := embeddingInputs(req.Input)
	if err != nil {
		s.badRequests.Add(1)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	a, release, ok := s.gate(w, r)
	if !ok {
		return
	}
	defer release()
	dim := req.Dimensions
	if dim <= 0 {
		dim = s.embeddingDim
	}
	resp := embeddingResponse{Object: "list", Model: a.b.model()}
	tokens := 0
	for i, in := range inputs {
		tokens += CountTokens(in)
		resp.Data = append(resp.Data, embeddingData{Object: "embedding", Index: i, Embedding: embed(in, dim)})
	}
	resp.Usage = usage{PromptTokens: tokens, TotalTokens: tokens}
	ttft := a.b.TTFT + time.Duration(tokens)*a.b.TTFTPerPromptToken
	if a.cold {
		ttft += a.b.ColdStart
	}
	if !sleep(r.Context(), ttft) {
		s.canceled.Add(1)
		return
	}
	if a.fail {
		s.fail(w)
		return
	}
	writeJSON(w, http.StatusOK, resp)
	s.ok.Add(1)
}
