package epp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// The pick endpoint: a plain HTTP answer naming the backend a proxy should
// send a request to, for proxies that can ask before they forward (nginx's
// auth_request, Caddy's forward_auth; docs/INTEGRATIONS.md "nginx steered
// by fleetwatch"). It follows the same decisions as the router, through the
// same pick core (route.Pools).
//
// GET /v1/pick (also HEAD and POST; the body is not read) answers 200 with
//
//	X-Fleetwatch-Upstream: <host:port>   the chosen backend's address
//	X-Fleetwatch-Backend:  <backend id>
//
// and, with PickSettings.Why, the decision visibility headers
// (route.Why.SetHeaders: X-Fleetwatch-State, -Weight, -Reason-Class,
// -Decision-Age). The pool is
// the query's pool, else the X-Fleetwatch-Pool header, else the pool that
// serves the model of the X-Fleetwatch-Model header, else the only pool.
// X-Fleetwatch-Among restricts the pick to a comma list of addresses or
// backend ids (a subset the proxy can reach); X-Fleetwatch-Prefix keeps a
// request with the same value on one backend (affinity, any string).
// X-Fleetwatch-Tried, a comma list of the addresses or backend ids a
// request already tried, makes the pick a retry, as the router's: it draws
// from the retry budget, the last one tried is picked again only when it
// is the only candidate, and the earlier ones never.
//
// When no backend may be picked (or a retry finds the retry budget spent)
// the answer carries X-Fleetwatch-Shed with the reason and Retry-After, with status 503, or the status the request's
// X-Fleetwatch-Shed-Status header asks for (403 for nginx: auth_request
// passes 401 and 403 on and treats any other status as an error, which a
// configuration that fails open sends to its plain upstream). An unknown
// pool is 404.
//
// A proxy that asks does not say when its request ended: a pick is counted
// in flight on its backend until an outcome event of that backend from the
// proxy's log (Outcome: fleetwatch's nginx and HAProxy log adapters publish
// one per request) finishes the oldest pick outstanding there, with the
// event's outcome and TTFT, or until PickSettings.Hold passes (Sweep).

// Headers of the pick endpoint.
const (
	HeaderUpstream   = "X-Fleetwatch-Upstream"
	HeaderBackend    = "X-Fleetwatch-Backend"
	HeaderPool       = "X-Fleetwatch-Pool"
	HeaderModel      = "X-Fleetwatch-Model"
	HeaderAmong      = "X-Fleetwatch-Among"
	HeaderPrefix     = "X-Fleetwatch-Prefix"
	HeaderTried      = "X-Fleetwatch-Tried"
	HeaderShed       = "X-Fleetwatch-Shed"
	HeaderShedStatus = "X-Fleetwatch-Shed-Status"
)

// DefaultHold is PickSettings.Hold's default.
const DefaultHold = 2 * time.Minute

// PickSettings configure a PickHandler. Pools is required.
type PickSettings struct {
	// Pools is the pick core the answers come from.
	Pools *route.Pools
	// Hold is how long a pick counts in flight when no outcome event
	// finishes it. If zero, DefaultHold.
	Hold time.Duration
	// Why adds the decision visibility headers to every pick.
	Why bool
	// Metrics receives the fleetwatch_pick_* series. If nil, a set of its
	// own.
	Metrics *metrics.Set
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Seed seeds the picks. If zero, a random seed.
	Seed uint64
}

// PickHandler is the pick endpoint (an http.Handler). It is safe for
// concurrent use and starts no goroutine: its owner calls Sweep.
type PickHandler struct {
	s    PickSettings
	rngs sync.Pool // *rand.Rand

	mu      sync.Mutex // guards pending
	pending map[pendingKey][]*pendingPick

	requests sync.Map // result -> *metrics.Counter, by pool
	seconds  *metrics.Histogram
	expired  *metrics.Counter
	matched  *metrics.Counter
}

type pendingKey struct{ pool, backend string }

// pendingPick is a pick counted in flight until its outcome.
type pendingPick struct {
	choice p2c.Choice
	at     time.Time
}

// NewPickHandler returns the handler.
func NewPickHandler(s PickSettings) (*PickHandler, error) {
	if s.Pools == nil {
		return nil, errors.New("epp: pick endpoint: no pools")
	}
	if s.Hold <= 0 {
		s.Hold = DefaultHold
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	seed := s.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	h := &PickHandler{s: s, pending: map[pendingKey][]*pendingPick{}}
	var n atomic.Uint64
	h.rngs.New = func() any { return rand.New(rand.NewPCG(seed, n.Add(1))) }
	h.seconds = s.Metrics.NewHistogram("fleetwatch_pick_duration_seconds")
	h.expired = s.Metrics.NewCounter("fleetwatch_pick_expired_total")
	h.matched = s.Metrics.NewCounter("fleetwatch_pick_outcomes_matched_total")
	s.Metrics.NewGauge("fleetwatch_pick_outstanding", func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		n := 0
		for _, q := range h.pending {
			n += len(q)
		}
		return float64(n)
	})
	return h, nil
}

// Pick results, the values of fleetwatch_pick_requests_total's result.
const (
	PickOK          = "ok"
	PickShed        = "shed"
	PickNoEndpoint  = "no_endpoint"
	PickUnknownPool = "unknown_pool"
	PickRetryBudget = "retry_budget"
)

func (h *PickHandler) count(pool, result string) {
	key := pool + "\x00" + result
	c, ok := h.requests.Load(key)
	if !ok {
		c, _ = h.requests.LoadOrStore(key, h.s.Metrics.GetOrCreateCounter(
			fmt.Sprintf(`fleetwatch_pick_requests_total{pool=%s,result=%q}`, promlabel.Quote(pool), result)))
	}
	c.(*metrics.Counter).Inc()
}

// ServeHTTP answers a pick.
func (h *PickHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer h.seconds.UpdateDuration(start)
	pool, ok := h.poolOf(r)
	if !ok {
		h.count(pool, PickUnknownPool)
		http.Error(w, fmt.Sprintf("epp: no pool %q (give ?pool=, %s or %s)", pool, HeaderPool, HeaderModel), http.StatusNotFound)
		return
	}
	req := p2c.Request{Among: h.backendIDs(pool, r.Header.Get(HeaderAmong))}
	if tried := h.backendIDs(pool, r.Header.Get(HeaderTried)); len(tried) > 0 {
		req.Exclude, req.Retry = tried[len(tried)-1], true
		req.Avoid = tried[:len(tried)-1]
	}
	if prefix := r.Header.Get(HeaderPrefix); prefix != "" {
		req.Prefix, req.HasPrefix = hashString(prefix), true
	}
	rng := h.rngs.Get().(*rand.Rand)
	choice, err := h.s.Pools.Pick(pool, rng, req)
	h.rngs.Put(rng)
	if err != nil {
		h.shed(w, r, pool, err)
		return
	}
	backend := choice.Backend
	h.mu.Lock()
	k := pendingKey{pool, backend}
	h.pending[k] = append(h.pending[k], &pendingPick{choice: choice, at: h.s.Now()})
	h.mu.Unlock()
	hdr := w.Header()
	hdr.Set(HeaderUpstream, h.s.Pools.Address(pool, backend))
	hdr.Set(HeaderBackend, backend)
	if h.s.Why {
		h.s.Pools.Why(pool, backend).SetHeaders(hdr)
	}
	hdr.Set("Cache-Control", "no-store")
	h.count(pool, PickOK)
	w.WriteHeader(http.StatusOK)
}

// backendIDs turns a header's comma list of addresses or backend ids into
// backend ids (nil for none); an address the pool does not know is kept as
// it is, which the picker ignores as an id it does not name.
func (h *PickHandler) backendIDs(pool, list string) []string {
	if list == "" {
		return nil
	}
	var ids []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if id := h.s.Pools.Backend(pool, a); id != "" {
			a = id
		}
		ids = append(ids, a)
	}
	return ids
}

// shed answers a pick that found no backend.
func (h *PickHandler) shed(w http.ResponseWriter, r *http.Request, pool string, err error) {
	reason, result := "all_open", PickShed
	switch {
	case errors.Is(err, p2c.ErrNoCandidates):
		reason, result = "no_eligible_endpoint", PickNoEndpoint
	case errors.Is(err, p2c.ErrNoBackends):
		reason, result = "no_backend", PickNoEndpoint
	case errors.Is(err, p2c.ErrRetryBudget):
		reason, result = "retry_budget", PickRetryBudget
	}
	h.count(pool, result)
	status := http.StatusServiceUnavailable
	if v, err := strconv.Atoi(r.Header.Get(HeaderShedStatus)); err == nil && v >= 400 && v <= 599 {
		status = v
	}
	w.Header().Set(HeaderShed, reason)
	w.Header().Set("Retry-After", strconv.Itoa(h.s.Pools.RetryAfter(pool)))
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, "epp: "+err.Error(), status)
}

// poolOf finds the request's pool; ok is false for an unknown one (named
// in pool).
func (h *PickHandler) poolOf(r *http.Request) (pool string, ok bool) {
	ids := h.s.Pools.IDs()
	pick := func(p string) (string, bool) {
		for _, id := range ids {
			if id == p {
				return p, true
			}
		}
		return p, false
	}
	if p := r.URL.Query().Get("pool"); p != "" {
		return pick(p)
	}
	if p := r.Header.Get(HeaderPool); p != "" {
		return pick(p)
	}
	if m := r.Header.Get(HeaderModel); m != "" {
		if p, ok := h.s.Pools.ForModel(m); ok {
			return p, true
		}
		return m, false
	}
	if len(ids) == 1 {
		return ids[0], true
	}
	return "", false
}

// Outcome finishes the oldest pick outstanding on ev's backend with ev's
// outcome and TTFT: the outcome event the steered proxy's log adapter
// published for a request. An event with no pick outstanding on its
// backend is ignored. Give it only the events of the proxies this endpoint
// steers (their source), or a request another proxy sent would finish one
// of these picks.
func (h *PickHandler) Outcome(ev *fleetwatch.Event) {
	k := pendingKey{ev.Pool, ev.Backend}
	h.mu.Lock()
	q := h.pending[k]
	if len(q) == 0 {
		h.mu.Unlock()
		return
	}
	p := q[0]
	q[0] = nil
	if q = q[1:]; len(q) == 0 {
		delete(h.pending, k)
	} else {
		h.pending[k] = q
	}
	h.mu.Unlock()
	h.matched.Inc()
	ttft := -1.0
	if ev.TTFTKnown() {
		ttft = ev.TTFTMs
	}
	p.choice.Done(ev.Outcome, ttft, ev.Cold)
}

// Sweep finishes, as canceled, every pick outstanding for longer than Hold
// at now: its outcome never came (a proxy that does not log it, an event
// lost). The owner calls it every few seconds.
func (h *PickHandler) Sweep(now time.Time) {
	var done []*pendingPick
	h.mu.Lock()
	for k, q := range h.pending {
		i := 0
		for i < len(q) && now.Sub(q[i].at) > h.s.Hold {
			done = append(done, q[i])
			i++
		}
		switch {
		case i == len(q):
			delete(h.pending, k)
		case i > 0:
			h.pending[k] = q[i:]
		}
	}
	h.mu.Unlock()
	h.expired.Add(len(done))
	for _, p := range done {
		p.choice.Done(fleetwatch.OutcomeCanceled, 0, false)
	}
}

// hashString is FNV-1a of s, the affinity key of a prefix header.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
