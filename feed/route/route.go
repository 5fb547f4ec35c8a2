// Package route is fleetwatch's embeddable OpenAI-compatible router: an
// http.Handler that routes POST /v1/chat/completions, /v1/completions and
// /v1/embeddings to a backend of the pool serving the request's model,
// chosen by the pool's feed/p2c picker from fleetwatch's decisions, and
// reports one outcome event per attempt to a Publisher.
//
// The pool is the one whose id or Models list names the request's model;
// with a single pool every model goes there, otherwise an unknown model is
// ErrUnknownModel (404). GET /v1/models lists the routable model ids. Until
// a pool's first decision arrives (and whenever its decision is stale) the
// picker routes on equal weights and the router's own signals; open
// breakers whose open_until is ahead stay honoured, and the picker's local
// breakers (p2c.Settings.LocalFailures) keep a backend that fails at once
// from drawing the traffic its empty queue would win.
//
// Connect errors, 5xx, 429 and stalls (no first token within the
// first-token deadline, see deadline.go; outcome stalled) are retried on
// another backend while the client has seen nothing, within the pool's retry budget and MaxAttempts;
// never once a byte has gone to the client. A backend that breaks off
// mid-answer makes the router drop the client's connection too (as
// net/http/httputil.ReverseProxy does). When every backend is open
// (all_open=shed) the answer is 503 with Retry-After. Responses carry
// X-Fleetwatch-Backend and X-Fleetwatch-Attempts. The wait a 429 or 5xx
// states, in whichever provider's header or JSON error body
// (retryhint.Parse), becomes its event's retry_after_ms.
//
// Every 2xx answer is also checked in passing (check.go): a stream that
// carries an error event after it started, or ends with neither a finish
// reason nor [DONE], is published as outcome error with stream_error (the
// client still gets the backend's bytes; nothing is retried); an answer
// from another model than the one asked for, broken tool calls and fake
// streams set model_mismatch, tool_call_broken and fake_stream. Each is
// counted per backend. Settings.SkipResponseChecks turns the checks off.
//
// A pool whose decisions are in shadow mode (their shadow field, see
// shadow.go) is routed by the breakers only ("breakers") or by nothing but
// an operator's overrides ("observe"), and the router counts, per pool,
// the requests the full decisions would have routed differently
// (fleetwatch_route_shadow_*, Router.ShadowStats).
//
// Decisions reach the router through Router.Apply, which fits
// feed.WatcherSettings.OnUpdate (see the package example). Outcome events
// go to Settings.Publisher; OutcomePublisher is the batching NATS publisher
// fleetwatch's own router uses, usable alone by any Go proxy.
//
// Lifecycle: New starts no goroutine and the Router owns none, so it has no
// Run. The OutcomePublisher has one, owned by whoever calls its Run. Close
// makes the Router refuse new requests (ErrClosed) and closes the idle
// connections of its default transport.
package route

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Errors the ErrorHandler sees (wrapped with the pool or the model), besides
// p2c.ErrShed and p2c.ErrNoBackends when a pool has no usable backend.
var (
	// ErrUnknownModel: no pool serves the request's model (and there is
	// more than one pool).
	ErrUnknownModel = errors.New("route: the model is not served by any pool")
	// ErrClosed: the Router was closed, or OutcomePublisher.Run was called
	// after Close.
	ErrClosed = errors.New("route: closed")
	// ErrRunning is returned by OutcomePublisher.Run while another Run
	// runs.
	ErrRunning = errors.New("route: already running")
	// ErrConfig: New was given Settings it cannot use.
	ErrConfig = errors.New("route: invalid settings")
)

// Defaults of Settings.MaxAttempts, IdleGap, MaxBody and Source, for
// callers that state them (flags, the config file's route block).
const (
	DefaultMaxAttempts = 3
	DefaultIdleGap     = 5 * time.Minute
	DefaultMaxBody     = 32 << 20
	DefaultSource      = "route"
)

// PrefixFrom values.
const (
	// PrefixSystem hashes the first system (or developer) message's
	// content into the affinity prefix.
	PrefixSystem = "system"
	// PrefixNone sends no prefix: no affinity.
	PrefixNone = "none"
)

// Backend is one backend of a pool.
type Backend struct {
	// ID is the backend id the decisions name. Required, unique in the pool.
	ID string
	// URL is the backend's OpenAI-compatible base URL, http or https, with
	// or without a trailing /v1. Required.
	URL string
	// APIKey is sent as "Authorization: Bearer <APIKey>" to this backend,
	// replacing the client's. If empty, the client's header is passed on.
	APIKey string
	// Priority and CostPerMTok are what the picker assumes until the first
	// decision names this backend.
	Priority    int
	CostPerMTok *float64
}

// Pool is one pool of backends serving the same model.
type Pool struct {
	// ID is the pool id of the decisions. Required, unique. Requests for
	// the model ID are routed here.
	ID string
	// Models are further request `model` values routed here. A model named
	// by two pools goes to the first by id.
	Models []string
	// Mode and AllOpen are what the picker assumes until the first
	// decision. If empty, fleetwatch.ModeBalance and
	// fleetwatch.AllOpenShed.
	Mode    fleetwatch.Mode
	AllOpen fleetwatch.AllOpen
	// Shadow is the shadow mode the picker assumes until the first
	// decision, which then says (see shadow.go): "" or "off", "breakers"
	// or "observe".
	Shadow fleetwatch.Shadow
	// Backends are the pool's backends. At least one is required; a
	// backend a decision names that is not here is never routed to (the
	// router has no URL for it).
	Backends []Backend
	// Picker configures the pool's p2c picker. If Picker.Now is nil,
	// Settings.Now is used.
	Picker p2c.Settings
	// ORCA is how the router asks the pool's backends for ORCA load
	// reports (the endpoint-load-metrics header vLLM answers, see
	// orca.go): ORCAText, ORCAJSON or ORCAOff. A report is copied into the
	// attempt's outcome event. If empty, ORCAText: servers that do not
	// know the request header ignore it.
	ORCA string
}

// Attempt describes one try of a request, for Settings.Rewrite.
type Attempt struct {
	Pool    string
	Backend string
	// N is 0 for the first attempt, 1 for the first retry, and so on.
	N int
}

// Publisher receives the router's outcome events. Publish must not block:
// it is called on the request path. *OutcomePublisher implements it.
type Publisher interface {
	Publish(fleetwatch.Event)
}

// Settings configure a Router. Only Pools is required.
type Settings struct {
	// Pools are the pools routed to. At least one is required.
	Pools []Pool
	// Transport sends the attempts. If nil, a transport that dials
	// backends directly (no proxy from the environment), keeps up to 256
	// idle connections per backend and waits HeaderTimeout for response
	// headers is used, and Close closes its idle connections.
	Transport http.RoundTripper
	// HeaderTimeout bounds the wait for a backend's response headers when
	// Transport is nil (a timeout outcome, retried). If zero, the router
	// waits as long as the client does.
	HeaderTimeout time.Duration
	// StallFloor and StallMultiple set the first-token deadline of every
	// attempt: max(StallFloor, StallMultiple x the pool's p95 TTFT, the
	// largest p95_ttft_ms of its backends not open in the decision
	// applied: PoolP95TTFT). An
	// attempt without its first token by then is ended, reported stalled
	// and retried elsewhere if nothing reached the client (deadline.go).
	// If StallFloor is zero, DefaultStallFloor (10s); negative turns the
	// deadline off. If StallMultiple is zero, DefaultStallMultiple (8).
	StallFloor    time.Duration
	StallMultiple float64
	// MaxAttempts is the number of attempts per request, the first
	// included (retries also need the pool's retry budget). If zero,
	// DefaultMaxAttempts (3); 1 disables retries.
	MaxAttempts int
	// Source is this router's id: the source field of its events. If
	// empty, DefaultSource ("route").
	Source string
	// PrefixFrom is what the affinity prefix hash is computed from:
	// PrefixSystem or PrefixNone. If empty, PrefixSystem.
	PrefixFrom string
	// IdleGap is the silence after which this router marks its next
	// request to a backend cold. If zero, DefaultIdleGap (5 minutes).
	IdleGap time.Duration
	// MaxBody is the largest request body accepted, in bytes. If zero,
	// DefaultMaxBody (32 MiB).
	MaxBody int64
	// Publisher receives one outcome event per attempt. If nil, events are
	// not published.
	Publisher Publisher
	// Metrics receives the router's metrics (see metrics.go for the
	// series); the per-backend gauges are registered on it as a metrics
	// writer, computed at every scrape, so give each Router its own set.
	// If nil, a private set is used.
	Metrics *metrics.Set
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Seed seeds the pickers' random choices. If zero, a random seed is
	// used; set it to make a test's sequence of picks repeatable.
	Seed uint64
	// Logf receives operational messages (decisions naming backends that
	// are not configured). If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Rewrite, if not nil, is called with each outgoing attempt once the
	// router has set its URL, headers and API key, and may change them
	// (add headers, rewrite the path). It must not read or replace Body.
	Rewrite func(out *http.Request, a Attempt)
	// Why adds the decision visibility headers to every response: the
	// state, weight and reason class of the backend that answered in the
	// decisions the router followed, and their age (Why.SetHeaders). If
	// false, only X-Fleetwatch-Backend and X-Fleetwatch-Attempts.
	Why bool
	// SkipResponseChecks turns off the checks of 2xx answers in passing
	// (check.go, docs/INTEGRATIONS.md "Responses checked in passing"): error
	// events and cuts in streams (outcome error), another model than the one
	// asked for, broken tool calls and fake streams (optional event fields).
	// If false, the checks run.
	SkipResponseChecks bool
	// ErrorHandler answers a request that no backend can serve: no pool
	// for its model (ErrUnknownModel), every backend open (p2c.ErrShed,
	// with Retry-After already set on w), no backend (p2c.ErrNoBackends),
	// the router closed (ErrClosed), or the last attempt got no response
	// (a *BackendError, with X-Fleetwatch-Backend already set). If nil,
	// an OpenAI-style JSON error: 404 for ErrUnknownModel, 504 for a
	// backend timeout, 502 for another backend error, 503 otherwise.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
}

// BackendError is the error of an attempt that got no response.
type BackendError struct {
	Pool, Backend string
	Err           error
}

func (e *BackendError) Error() string {
	return fmt.Sprintf("route: backend %s of pool %s: %v", e.Backend, e.Pool, e.Err)
}

func (e *BackendError) Unwrap() error { return e.Err }

// Timeout reports whether the attempt timed out.
func (e *BackendError) Timeout() bool { return isTimeout(e.Err) }

// Router is the HTTP handler. It is safe for concurrent use.
type Router struct {
	core *Pools // the pools and their pickers (core.go)

	client        *http.Client
	ownTransport  *http.Transport // nil when Settings.Transport was given
	events        Publisher
	source        string
	prefixFrom    string
	maxAttempts   int
	idleGap       time.Duration
	stallFloor    time.Duration // <= 0: no first-token deadline
	stallMultiple float64
	maxBody       int64
	checks        bool // !Settings.SkipResponseChecks
	why           bool // Settings.Why
	metrics       *routerMetrics
	now           func() time.Time
	logf          func(format string, args ...any)
	rewrite       func(*http.Request, Attempt)
	errorHandler  func(http.ResponseWriter, *http.Request, error)

	closed atomic.Bool
	rngs   sync.Pool // *rand.Rand: p2c.Rand is not safe for concurrent use
}

// New returns a Router over s.Pools. It validates the pools (an error wraps
// ErrConfig and names the pool, backend or URL) and starts nothing.
func New(s Settings) (*Router, error) {
	if len(s.Pools) == 0 {
		return nil, fmt.Errorf("%w: no pools", ErrConfig)
	}
	rt := &Router{
		events:       s.Publisher,
		source:       s.Source,
		prefixFrom:   s.PrefixFrom,
		maxAttempts:  s.MaxAttempts,
		idleGap:      s.IdleGap,
		maxBody:      s.MaxBody,
		checks:       !s.SkipResponseChecks,
		why:          s.Why,
		now:          s.Now,
		logf:         s.Logf,
		rewrite:      s.Rewrite,
		errorHandler: s.ErrorHandler,
	}
	if err := rt.withDefaults(s); err != nil {
		return nil, err
	}
	transport := s.Transport
	if transport == nil {
		rt.ownTransport = &http.Transport{
			Proxy:                 nil, // a router talks to its backends directly
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: s.HeaderTimeout,
		}
		transport = rt.ownTransport
	}
	rt.client = &http.Client{Transport: transport}
	var err error
	if rt.core, err = NewPools(s.Pools, rt.now, rt.logf); err != nil {
		return nil, err
	}
	seed := s.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	var n atomic.Uint64
	rt.rngs.New = func() any { return rand.New(rand.NewPCG(seed, n.Add(1))) }
	rt.metrics = newRouterMetrics(s.Metrics, rt)
	return rt, nil
}

// withDefaults checks s's knobs and sets the defaults of those unset.
func (rt *Router) withDefaults(s Settings) error {
	switch rt.prefixFrom {
	case "":
		rt.prefixFrom = PrefixSystem
	case PrefixSystem, PrefixNone:
	default:
		return fmt.Errorf("%w: PrefixFrom = %q: want %q or %q", ErrConfig, s.PrefixFrom, PrefixSystem, PrefixNone)
	}
	if rt.maxAttempts == 0 {
		rt.maxAttempts = DefaultMaxAttempts
	}
	if rt.maxAttempts < 0 {
		return fmt.Errorf("%w: MaxAttempts = %d: must be >= 1", ErrConfig, s.MaxAttempts)
	}
	if rt.source == "" {
		rt.source = DefaultSource
	}
	switch {
	case s.StallFloor == 0:
		rt.stallFloor = DefaultStallFloor
	case s.StallFloor > 0:
		rt.stallFloor = s.StallFloor
	}
	switch {
	case s.StallMultiple == 0:
		rt.stallMultiple = DefaultStallMultiple
	case s.StallMultiple > 0 && !math.IsInf(s.StallMultiple, 1):
		rt.stallMultiple = s.StallMultiple
	default:
		return fmt.Errorf("%w: StallMultiple = %v: must be > 0 and finite", ErrConfig, s.StallMultiple)
	}
	if rt.idleGap <= 0 {
		rt.idleGap = DefaultIdleGap
	}
	if rt.maxBody <= 0 {
		rt.maxBody = DefaultMaxBody
	}
	if rt.now == nil {
		rt.now = time.Now
	}
	if rt.logf == nil {
		rt.logf = func(string, ...any) {}
	}
	if rt.errorHandler == nil {
		rt.errorHandler = DefaultErrorHandler
	}
	return nil
}

// Pools returns the configured pool ids, sorted: what to follow
// (feed.WatcherSettings.Pools).
func (rt *Router) Pools() []string { return rt.core.IDs() }

// Core returns the router's pick core, for another front end of the same
// decisions in the same process.
func (rt *Router) Core() *Pools { return rt.core }

// Apply hands a decision snapshot to the picker of the pool it names; a
// snapshot of another pool, or not newer than the one applied, is ignored.
// Backends the snapshot names that are not configured are left out, and
// configured backends it does not name are routed to as healthy. Apply fits
// feed.WatcherSettings.OnUpdate; snap is not modified or retained.
func (rt *Router) Apply(snap *fleetwatch.Snapshot) { rt.core.Apply(snap) }

// ApplyLoads hands a load update of the compact feed to the picker of the
// pool it names (Pools.ApplyLoads); it fits feed.WatcherSettings.OnLoads.
func (rt *Router) ApplyLoads(pool string, u *p2c.LoadUpdate) { rt.core.ApplyLoads(pool, u) }

// Close makes the Router answer every later request with ErrClosed and
// closes the idle connections of its default transport. Requests in flight
// finish. It is idempotent and returns nil.
func (rt *Router) Close() error {
	if rt.closed.Swap(true) {
		return nil
	}
	if rt.ownTransport != nil {
		rt.ownTransport.CloseIdleConnections()
	}
	return nil
}

// DefaultErrorHandler is the ErrorHandler used when Settings.ErrorHandler is
// nil: an OpenAI-style JSON error, 404 for ErrUnknownModel, 504 for a
// backend timeout, 502 for another backend error, 503 otherwise.
func DefaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	var be *BackendError
	switch {
	case errors.Is(err, ErrUnknownModel):
		openAIError(w, http.StatusNotFound, "model_not_found", err.Error())
	case errors.As(err, &be) && be.Timeout():
		openAIError(w, http.StatusGatewayTimeout, "gateway_timeout", err.Error())
	case errors.As(err, &be):
		openAIError(w, http.StatusBadGateway, "bad_gateway", err.Error())
	default:
		openAIError(w, http.StatusServiceUnavailable, "service_unavailable", err.Error())
	}
}

// ServeHTTP serves the OpenAI-compatible API: POST /v1/chat/completions,
// /v1/completions and /v1/embeddings are proxied, GET /v1/models is answered
// from the configuration, anything else is a 404.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == "/v1/chat/completions" ||
		r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/embeddings"):
		rt.proxy(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		rt.listModels(w)
	default:
		NotFound(w, r)
	}
}

// NotFound answers an OpenAI-style 404 for a path the router does not serve.
func NotFound(w http.ResponseWriter, r *http.Request) {
	openAIError(w, http.StatusNotFound, "not_found", fmt.Sprintf("route: no route for %s %s", r.Method, r.URL.Path))
}

// listModels answers GET /v1/models from the configuration: one entry per
// routable model id (pool ids and their models), without asking backends.
func (rt *Router) listModels(w http.ResponseWriter) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := make([]model, len(rt.core.models))
	for i, m := range rt.core.models {
		data[i] = model{ID: m, Object: "model", OwnedBy: "fleetwatch:" + rt.core.byModel[m].id}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// validURL parses a backend base URL.
func validURL(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	return u, err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
