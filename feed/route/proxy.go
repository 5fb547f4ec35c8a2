package route

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
	"github.com/fleetwatch/fleetwatch/internal/shed"
)

// hopHeaders are the hop-by-hop headers a proxy must not forward (RFC 9110
// section 7.6.1), as net/http/httputil.ReverseProxy does.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// requestInfo is what the router reads from a request body.
type requestInfo struct {
	Model      string          `json:"model"`
	Stream     bool            `json:"stream"`
	Tools      json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
	Messages   []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// systemPrompt returns the raw JSON of the first system message's content,
// the shared prefix that a backend's prefix cache holds.
func (ri *requestInfo) systemPrompt() []byte {
	for _, m := range ri.Messages {
		if m.Role == "system" || m.Role == "developer" {
			return m.Content
		}
	}
	return nil
}

// prefixHash is the prefix key of a system prompt: FNV-1a 64 over the raw
// JSON bytes of its content. FNV-1a is in the standard library, has no
// setup cost and spreads short and long prompts well enough for rendezvous
// hashing; the raw JSON is hashed so that equal prompts hash equally
// without unescaping.
func prefixHash(b []byte) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, c := range b {
		h ^= uint64(c)
		h *= prime
	}
	return h
}

// attempt is one try of a request against one backend.
type attempt struct {
	pool       *pool
	backend    *backend
	choice     p2c.Choice // finished by finish
	cold       bool
	n          int // 0 for the first attempt
	sent       time.Time
	headersAt  time.Time  // when the response headers (or the error) came
	firstToken time.Time  // when a stream's first content event came, if read ahead (deadline.go)
	model      string     // the request's model
	tools      toolDemand // what the request asked of tool calls
}

func (rt *Router) proxy(w http.ResponseWriter, r *http.Request) {
	body, info, pool, ok := rt.readRequest(w, r)
	if !ok {
		return
	}
	var preq p2c.Request
	var prefix string
	if rt.prefixFrom == PrefixSystem {
		if sys := info.systemPrompt(); len(sys) > 0 {
			preq.Prefix, preq.HasPrefix = prefixHash(sys), true
			prefix = strconv.FormatUint(preq.Prefix, 16)
		}
	}

	rng := rt.rngs.Get().(*rand.Rand)
	defer rt.rngs.Put(rng)
	choice, err := rt.pick(pool, rng, preq)
	if err != nil {
		rt.shed(w, r, pool, err)
		return
	}
	ctx := r.Context()
	var tried []string
	tools := demandOf(info.Tools, info.ToolChoice)
	for n := 0; ; n++ {
		be := pool.backends[choice.Backend]
		if n > 0 {
			rt.metrics.retry(pool.id).Inc()
		}
		a := &attempt{pool: pool, backend: be, choice: choice, cold: be.markUsed(rt.now(), rt.idleGap), n: n,
			model: info.Model, tools: tools}
		stall := rt.watchStall(ctx, pool)
		resp, err := rt.send(stall, r, body, a)
		if err == nil {
			err = rt.awaitFirstToken(resp, a, stall)
		} else if stall.stalled() {
			err = ErrStalled
		}
		if errors.Is(err, ErrStalled) {
			if resp != nil {
				resp.Body.Close()
				resp = nil
			}
			a.headersAt = rt.now()
		}
		ev := rt.event(a, prefix)
		failed := rt.classify(ctx, resp, err, a, &ev)
		if failed && ctx.Err() == nil && n+1 < rt.maxAttempts && len(pool.backends) > 1 {
			// Report the failure first, so that the picker's in-flight count
			// is right for the retry's pick.
			rt.finish(a, &ev)
			tried = append(tried, be.id)
			preq.Exclude, preq.Retry = be.id, true
			next, perr := rt.repick(pool, rng, preq, tried)
			if perr == nil {
				if resp != nil {
					io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
					resp.Body.Close()
				}
				stall.end()
				choice = next
				continue
			}
			rt.answerFailure(w, r, a, resp, err)
			stall.end()
			return
		}
		if resp == nil || failed {
			rt.finish(a, &ev)
			rt.answerFailure(w, r, a, resp, err)
			stall.end()
			return
		}
		defer stall.end() // after the body: deliver may abort the handler
		rt.deliver(ctx, w, resp, a, &ev)
		return
	}
}

// readRequest reads the request's body and finds its pool by model (the
// only pool when there is one); ok is false when it answered the client
// itself.
func (rt *Router) readRequest(w http.ResponseWriter, r *http.Request) (body []byte, info requestInfo, p *pool, ok bool) {
	if rt.closed.Load() {
		rt.errorHandler(w, r, ErrClosed)
		return nil, info, nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rt.maxBody))
	if err != nil {
		openAIError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "route: reading the request body: "+err.Error())
		return nil, info, nil, false
	}
	if err := json.Unmarshal(body, &info); err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "route: the request body is not a JSON object: "+err.Error())
		return nil, info, nil, false
	}
	p = rt.core.lookup(info.Model)
	if p == nil {
		rt.errorHandler(w, r, fmt.Errorf("%w: model %q (GET /v1/models lists them)", ErrUnknownModel, info.Model))
		return nil, info, nil, false
	}
	return body, info, p, true
}

// repick is a retry's pick: a backend not tried yet (the picker's, or
// the first untried one when it offers a tried one again).
func (rt *Router) repick(p *pool, rng *rand.Rand, preq p2c.Request, tried []string) (p2c.Choice, error) {
	next, err := rt.pick(p, rng, preq)
	if err == nil && slices.Contains(tried, next.Backend) {
		next.Done(fleetwatch.OutcomeCanceled, 0, false) // never sent
		err = p2c.ErrNoBackends
		if id := p.untried(tried); id != "" {
			next, err = p.picker.Choose(id)
		}
	}
	return next, err
}

// pick asks the pool's picker for a backend, timing it and counting sheds
// and spent retry budgets. A backend the configuration does not know is
// ErrNoBackends (the pool's snapshot is filtered, so this is defensive).
func (rt *Router) pick(pool *pool, rng *rand.Rand, preq p2c.Request) (p2c.Choice, error) {
	t0 := time.Now() // the histogram measures real time, whatever the clock
	choice, err := pool.picker.Pick(rng, preq)
	rt.metrics.pickSeconds.UpdateDuration(t0)
	switch {
	case errors.Is(err, p2c.ErrShed):
		rt.metrics.shed(pool.id).Inc()
	case errors.Is(err, p2c.ErrRetryBudget):
		rt.metrics.budgetExhausted(pool.id).Inc()
	case err == nil && pool.backends[choice.Backend] == nil:
		choice.Done(fleetwatch.OutcomeCanceled, 0, false)
		err = p2c.ErrNoBackends
	}
	return choice, err
}

// shed answers a request for which no backend could be picked: 503 at once
// by default (fail fast, do not spin), with a Retry-After until the first
// breaker half-opens.
func (rt *Router) shed(w http.ResponseWriter, r *http.Request, pool *pool, err error) {
	w.Header().Set("Retry-After", strconv.Itoa(pool.retryAfter(rt.now())))
	rt.handleError(w, r, pool, fmt.Errorf("route: pool %s: %w", pool.id, err))
}

// handleError calls the ErrorHandler and counts the status it answered.
func (rt *Router) handleError(w http.ResponseWriter, r *http.Request, pool *pool, err error) {
	sw := &statusWriter{ResponseWriter: w}
	rt.errorHandler(sw, r, err)
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	rt.metrics.clientCode(pool.id, sw.status).Inc()
}

// statusWriter records the status an ErrorHandler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// send sends one attempt, under stall's context and deadline (armed as it
// is sent), and returns the backend's response headers, or the error that
// prevented them.
func (rt *Router) send(stall *stallWatch, r *http.Request, body []byte, a *attempt) (*http.Response, error) {
	up, err := http.NewRequestWithContext(stall.ctx, http.MethodPost, a.backend.target(r.URL.Path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyRequestHeaders(up.Header, r.Header)
	if a.backend.apiKey != "" {
		up.Header.Set("Authorization", "Bearer "+a.backend.apiKey)
	}
	if a.pool.orca != "" {
		up.Header.Set(orcaRequestHeader, a.pool.orca)
	}
	if rt.rewrite != nil {
		rt.rewrite(up, Attempt{Pool: a.pool.id, Backend: a.backend.id, N: a.n})
	}
	a.sent = rt.now()
	stall.arm()
	resp, err := rt.client.Do(up)
	a.headersAt = rt.now()
	return resp, err
}

// classify fills ev for an attempt that has its headers (or failed to get
// them) and reports whether the attempt failed in a retryable way:
// no answer (connect error, reset), 5xx or 429. For such a failure ev is
// complete; for anything else deliver completes it.
func (rt *Router) classify(ctx context.Context, resp *http.Response, err error, a *attempt, ev *fleetwatch.Event) bool {
	ev.HasStatus = true
	ev.DurationMs, ev.HasDuration = ms(a.headersAt.Sub(a.sent)), true
	if err != nil {
		switch {
		case ctx.Err() != nil: // the client went away
			ev.Outcome = fleetwatch.OutcomeCanceled
			return false
		case errors.Is(err, ErrStalled):
			ev.Outcome = fleetwatch.OutcomeStalled
		case isTimeout(err):
			ev.Outcome = fleetwatch.OutcomeTimeout
		default:
			ev.Outcome = fleetwatch.OutcomeError
		}
		return true
	}
	ev.Status = resp.StatusCode
	if a.pool.orca != "" {
		rt.loadReport(a.pool.id, resp.Header, ev)
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		ev.Outcome = fleetwatch.OutcomeFromStatus(resp.StatusCode)
		hint := rt.retryHint(a.pool.id, resp, a.headersAt)
		ev.RetryAfterMs, ev.QuotaResetMs = hint.Ms, hint.QuotaMs
		ev.TTFTMs, ev.HasTTFT = ms(a.headersAt.Sub(a.sent)), true
		// A gateway or scheduler in front of the backend refused it: not
		// the backend's fault (retried elsewhere all the same).
		ev.Shed = shed.Reason(resp.StatusCode, resp.Header.Get)
		return true
	}
	return false
}

// isTimeout reports whether err is a timeout (a deadline, or the transport's
// response header timeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStalled) || (errors.As(err, &ne) && ne.Timeout())
}

// answerFailure gives the client the last failure when no retry follows:
// the backend's own 5xx or 429 response passed through, the ErrorHandler's
// answer to a *BackendError when no answer came (502 or 504 by default),
// nothing when the client is gone.
func (rt *Router) answerFailure(w http.ResponseWriter, r *http.Request, a *attempt, resp *http.Response, err error) {
	if resp != nil {
		defer resp.Body.Close()
		rt.copyResponseHeaders(w.Header(), resp.Header, a)
		w.WriteHeader(resp.StatusCode)
		rt.metrics.clientCode(a.pool.id, resp.StatusCode).Inc()
		io.Copy(w, resp.Body)
		return
	}
	if errors.Is(err, context.Canceled) {
		rt.metrics.clientCode(a.pool.id, 499).Inc()
		return
	}
	w.Header().Set("X-Fleetwatch-Backend", a.backend.id)
	rt.handleError(w, r, a.pool, &BackendError{Pool: a.pool.id, Backend: a.backend.id, Err: err})
}

// copyResponseHeaders gives the client the backend's headers, less the
// hop-by-hop ones, with the backend and attempt count (and, with
// Settings.Why, why the backend stood where it did).
func (rt *Router) copyResponseHeaders(dst, src http.Header, a *attempt) {
	for k, vs := range src {
		dst[k] = vs
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	dst.Set("X-Fleetwatch-Backend", a.backend.id)
	dst.Set("X-Fleetwatch-Attempts", strconv.Itoa(a.n+1))
	if rt.why {
		rt.core.Why(a.pool.id, a.backend.id).SetHeaders(dst)
	}
}

// deliver passes a successful (or client-error) response through to the
// client, flushing every chunk of a stream, and reports the attempt's
// outcome once the body is done.
func (rt *Router) deliver(ctx context.Context, w http.ResponseWriter, resp *http.Response, a *attempt,
	ev *fleetwatch.Event) {
	defer resp.Body.Close()
	rt.copyResponseHeaders(w.Header(), resp.Header, a)
	streaming := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if streaming {
		w.Header().Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	rt.metrics.clientCode(a.pool.id, resp.StatusCode).Inc()

	var meta responseMeta
	meta.checks = rt.checks && resp.StatusCode >= 200 && resp.StatusCode <= 299
	if meta.checks {
		meta.check.start(a.tools)
	}
	var copyErr, readErr error
	if streaming {
		copyErr, readErr = streamCopy(w, resp.Body, &meta, rt.now)
	} else {
		meta.firstContent = a.headersAt
		copyErr, readErr = plainCopy(w, resp.Body, &meta)
	}
	end := rt.now()
	if !a.firstToken.IsZero() {
		meta.firstContent = a.firstToken // read ahead by awaitFirstToken
	}
	ev.Outcome = fleetwatch.OutcomeFromStatus(resp.StatusCode)
	switch {
	case ctx.Err() != nil || copyErr != nil:
		ev.Outcome = fleetwatch.OutcomeCanceled // the client left; says nothing of the backend
	case readErr != nil && ev.Outcome == fleetwatch.OutcomeOK:
		ev.Outcome = fleetwatch.OutcomeError // the backend broke the body off
	case meta.checks && rt.checkPassing(a, &meta, streaming, ev):
		ev.Outcome = fleetwatch.OutcomeError // a 200 stream that failed on the way (check.go)
	}
	switch {
	case !meta.firstContent.IsZero():
		ev.TTFTMs, ev.HasTTFT = ms(meta.firstContent.Sub(a.sent)), true
	case ev.Outcome != fleetwatch.OutcomeOK:
		ev.TTFTMs, ev.HasTTFT = ms(a.headersAt.Sub(a.sent)), true
	}
	ev.DurationMs, ev.HasDuration = ms(end.Sub(a.sent)), true
	ev.InputTokens, ev.OutputTokens = meta.promptTokens, meta.completionTokens
	if ev.OutputTokens == 0 {
		ev.OutputTokens = meta.contentChunks
	}
	ev.CacheHit = meta.cachedTokens > 0
	ev.Fingerprint = meta.fingerprint
	rt.finish(a, ev)
	if readErr != nil && copyErr == nil && ctx.Err() == nil {
		// The backend broke off: drop the client's connection too, so that it
		// sees a cut answer rather than a short one that looks complete (as
		// net/http/httputil.ReverseProxy does).
		panic(http.ErrAbortHandler)
	}
}

// finish reports an attempt: the picker's local signals, metrics, and the
// outcome event.
func (rt *Router) finish(a *attempt, ev *fleetwatch.Event) {
	ev.TS = rt.now() // when the outcome became known
	a.choice.Done(ev.Outcome, ev.TTFTMs, ev.Cold)
	rt.metrics.attempt(a.pool.id, a.backend.id, ev.Status).Inc()
	if rt.events != nil {
		rt.events.Publish(*ev)
	}
}

func (rt *Router) event(a *attempt, prefix string) fleetwatch.Event {
	return fleetwatch.Event{
		Pool:    a.pool.id,
		Backend: a.backend.id,
		Cold:    a.cold,
		Prefix:  prefix,
		Source:  rt.source,
	}
}

func ms(d time.Duration) float64 {
	v := float64(d) / float64(time.Millisecond)
	return min(max(v, 0), fleetwatch.MaxDurationMs)
}

// retryHint is the wait a failed attempt's answer states, in ms (0: none),
// read by retryhint.Parse from its headers and, for a 429 or 503
// that no header answered, from the start of its body. The body read is
// held and put back in front of the rest, so whoever reads resp.Body next
// (the client's copy, or the discard before a retry) sees every byte.
// Malformed hints are counted by source.
func (rt *Router) retryHint(pool string, resp *http.Response, now time.Time) retryhint.Hint {
	hint := retryhint.Parse(resp.StatusCode, resp.Header.Get, func() []byte { return peekBody(resp) }, now)
	for _, source := range hint.Malformed {
		rt.metrics.hintMalformed(pool, source).Inc()
	}
	return hint
}

// peekBody reads up to retryhint.MaxBody bytes of a non-streaming
// body and puts them back. A stream is left alone: an error answer that
// streams has no JSON error body to read, and reading ahead would hold
// its first events back.
func peekBody(resp *http.Response) []byte {
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return nil
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, retryhint.MaxBody))
	rest := io.Reader(resp.Body)
	if err != nil {
		rest = errReader{err} // the client's copy meets the same break
	}
	resp.Body = &heldBody{r: io.MultiReader(bytes.NewReader(head), rest), body: resp.Body}
	return head
}

func copyRequestHeaders(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = vs
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	dst.Del("Content-Length")  // set from the body
	dst.Del("Accept-Encoding") // let the transport negotiate, so streams stay readable
}

func openAIError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
