package route

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Pools is the pick core of the router, shared with the other front ends
// of the same decisions (feed/epp's endpoint picker and pick endpoint):
// the configured pools, each with its feed/p2c picker following the
// decisions (Apply), found by id or by request model, and why a backend
// stands where it does (Why). A pick is counted in flight on its backend
// until its Choice is done. Stale decisions fail static, as the picker
// does. It starts no goroutine and is safe for concurrent use.
type Pools struct {
	pools   map[string]*pool // by pool id
	ids     []string         // pool ids, sorted
	byModel map[string]*pool // request `model` -> pool
	models  []string         // every routable model, in the order of ids
	single  *pool            // the only pool, when there is exactly one
	now     func() time.Time
}

// NewPools builds the pools (an error wraps ErrConfig and names the pool,
// backend or URL). A model named by two pools goes to the first by id. now
// is the pickers' clock unless a pool's Picker.Now is set (nil: time.Now);
// logf receives the decisions naming backends that are not configured.
func NewPools(pools []Pool, now func() time.Time, logf func(string, ...any)) (*Pools, error) {
	if len(pools) == 0 {
		return nil, fmt.Errorf("%w: no pools", ErrConfig)
	}
	if now == nil {
		now = time.Now
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ps := &Pools{pools: make(map[string]*pool, len(pools)), byModel: map[string]*pool{}, now: now}
	for i, pc := range pools {
		p, err := newPool(i, pc, now, logf)
		if err != nil {
			return nil, err
		}
		if _, dup := ps.pools[p.id]; dup {
			return nil, fmt.Errorf("%w: pools[%d]: pool id %q appears twice", ErrConfig, i, p.id)
		}
		ps.pools[p.id] = p
	}
	ps.ids = slices.Sorted(maps.Keys(ps.pools))
	for _, id := range ps.ids {
		p := ps.pools[id]
		for _, m := range p.models {
			if _, dup := ps.byModel[m]; !dup {
				ps.byModel[m] = p
				ps.models = append(ps.models, m)
			}
		}
	}
	if len(ps.pools) == 1 {
		ps.single = ps.pools[ps.ids[0]]
	}
	return ps, nil
}

// IDs returns the pool ids, sorted: what to follow
// (feed.WatcherSettings.Pools).
func (ps *Pools) IDs() []string { return slices.Clone(ps.ids) }

// Apply hands a decision snapshot to the picker of the pool it names; a
// snapshot of another pool, or not newer than the one applied, is ignored.
// Backends the snapshot names that are not configured are left out, and
// configured backends it does not name are picked as healthy. It fits
// feed.WatcherSettings.OnUpdate; snap is not modified or retained.
func (ps *Pools) Apply(snap *fleetwatch.Snapshot) {
	if snap == nil {
		return
	}
	if p := ps.pools[snap.Pool]; p != nil {
		p.apply(snap)
	}
}

// ApplyLoads hands a load update of the compact feed to the picker of the
// pool it names (p2c.Picker.UpdateLoads): the loads and EWMAs that moved
// since the snapshot applied, which stays fresh until the update's at +
// ttl_ms. It fits feed.WatcherSettings.OnLoads and does not allocate.
func (ps *Pools) ApplyLoads(pool string, u *p2c.LoadUpdate) {
	if p := ps.pools[pool]; p != nil {
		p.picker.UpdateLoads(u)
	}
}

// InFlight returns the picks of pool's backend not done yet (counted by
// this process: p2c.Picker.InFlight); 0 for an unknown pool or backend.
func (ps *Pools) InFlight(pool, backend string) int {
	if p := ps.pools[pool]; p != nil {
		return p.picker.InFlight(backend)
	}
	return 0
}

// ForModel returns the pool serving a request's model: the pool whose id
// or Models name it, else the only pool when there is one; ok is false
// when no pool serves it.
func (ps *Pools) ForModel(model string) (pool string, ok bool) {
	if p := ps.lookup(model); p != nil {
		return p.id, true
	}
	return "", false
}

func (ps *Pools) lookup(model string) *pool {
	if p := ps.byModel[model]; p != nil {
		return p
	}
	return ps.single
}

// ErrUnknownPool is returned for a pool id that is not configured.
var ErrUnknownPool = errors.New("route: no such pool")

// Pick asks pool's picker for a backend (p2c.Picker.Pick, with its
// errors: p2c.ErrShed, p2c.ErrNoCandidates, p2c.ErrRetryBudget,
// p2c.ErrNoBackends). The request is counted in flight on the backend
// until the Choice is done.
func (ps *Pools) Pick(pool string, r p2c.Rand, req p2c.Request) (p2c.Choice, error) {
	p := ps.pools[pool]
	if p == nil {
		return p2c.Choice{}, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	ch, err := p.picker.Pick(r, req)
	if err == nil && p.backends[ch.Backend] == nil { // defensive: the merged snapshot has configured backends only
		ch.Done(fleetwatch.OutcomeCanceled, 0, false)
		return p2c.Choice{}, p2c.ErrNoBackends
	}
	return ch, err
}

// Fallbacks appends to dst up to n further backends of pool for the same
// request after primary (p2c.Picker.Fallbacks): an ordered fallback list,
// counted nowhere.
func (ps *Pools) Fallbacks(pool string, r p2c.Rand, req p2c.Request, primary string, n int, dst []string) []string {
	if p := ps.pools[pool]; p != nil {
		return p.picker.Fallbacks(r, req, primary, n, dst)
	}
	return dst
}

// Choose returns a Choice for a named backend of pool, counted in flight
// as a pick (p2c.Picker.Choose): a backend the caller's data plane chose.
func (ps *Pools) Choose(pool, backend string) (p2c.Choice, error) {
	p := ps.pools[pool]
	if p == nil {
		return p2c.Choice{}, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	return p.picker.Choose(backend)
}

// Address is the host:port a front end hands its data plane for backend
// (the host and port of its configured URL, the scheme's default port when
// the URL names none); "" when the pool has no such backend.
func (ps *Pools) Address(pool, backend string) string {
	if p := ps.pools[pool]; p != nil {
		if b := p.backends[backend]; b != nil {
			return b.address()
		}
	}
	return ""
}

// Backend returns the id of pool's backend at address (as Address gives
// it), "" when none is: how a front end reads the endpoint its data plane
// reports back.
func (ps *Pools) Backend(pool, address string) string {
	p := ps.pools[pool]
	if p == nil {
		return ""
	}
	if b := p.backends[address]; b != nil {
		return b.id
	}
	for _, id := range p.order {
		if p.backends[id].address() == address {
			return id
		}
	}
	return ""
}

// Picker returns pool's picker (nil for an unknown pool), for its metrics.
func (ps *Pools) Picker(pool string) *p2c.Picker {
	if p := ps.pools[pool]; p != nil {
		return p.picker
	}
	return nil
}

// RetryAfter is how many seconds a client shed by pool should wait: until
// the first open breaker of the decisions half-opens, at least 1.
func (ps *Pools) RetryAfter(pool string) int {
	if p := ps.pools[pool]; p != nil {
		return p.retryAfter(ps.now())
	}
	return 1
}

// Why says why a backend stands where it does in the decisions its pool's
// picker follows: for the response headers and metadata that tell a
// client which backend served it and why (docs/INTEGRATIONS.md "Decision
// visibility").
type Why struct {
	// State and Weight are the decision's ("" and 0 before any decision
	// names the backend: then Class is "unknown").
	State  fleetwatch.State
	Weight float64
	// Class is the reason's class: healthy, down_weighted, half_open,
	// open, quota, override, drift, unknown (no decision yet) or stale
	// (the decisions are past their ttl: the picker fails static).
	Class string
	// Age is the decisions' age: since the snapshot applied, or the
	// last load update based on it, which confirmed them (negative
	// before the first decision).
	Age time.Duration
}

// Reason classes of Why.
const (
	WhyHealthy      = "healthy"
	WhyDownWeighted = "down_weighted"
	WhyHalfOpen     = "half_open"
	WhyOpen         = "open"
	WhyQuota        = "quota"
	WhyOverride     = "override"
	WhyDrift        = "drift"
	WhyUnknown      = "unknown"
	WhyStale        = "stale"
)

// Why returns backend's standing in pool's decisions.
func (ps *Pools) Why(pool, backend string) Why {
	p := ps.pools[pool]
	if p == nil {
		return Why{Class: WhyUnknown, Age: -1}
	}
	snap := p.followed.Load()
	now := ps.now()
	w := Why{Class: WhyUnknown, Age: -1}
	if snap == nil || snap.Epoch == configEpoch {
		return w
	}
	w.Age = now.Sub(p.confirmedAt(snap))
	b := snap.Find(backend)
	if b == nil {
		return w
	}
	w.State, w.Weight = b.State, b.Weight
	switch {
	case now.After(p.picker.StaleAt()):
		w.Class = WhyStale
	case b.Override != nil:
		w.Class = WhyOverride
	case b.State == fleetwatch.StateOpen && b.QuotaUntil != nil:
		w.Class = WhyQuota
	case b.State == fleetwatch.StateOpen:
		w.Class = WhyOpen
	case b.State == fleetwatch.StateHalfOpen:
		w.Class = WhyHalfOpen
	case b.Drift == fleetwatch.DriftDrifted && b.Weight == 0:
		w.Class = WhyDrift
	case b.Weight < 1:
		w.Class = WhyDownWeighted
	default:
		w.Class = WhyHealthy
	}
	return w
}

// Decision visibility headers (docs/INTEGRATIONS.md "Decision
// visibility"): the router's responses carry them with
// Settings.Why, the pick endpoint's with its own setting.
const (
	HeaderState       = "X-Fleetwatch-State"
	HeaderWeight      = "X-Fleetwatch-Weight"
	HeaderReasonClass = "X-Fleetwatch-Reason-Class"
	HeaderDecisionAge = "X-Fleetwatch-Decision-Age"
)

// SetHeaders writes w as the decision visibility headers: the state and
// weight (when a decision names the backend), the reason class, and the
// decisions' age in seconds (-1 before the first).
func (w Why) SetHeaders(h http.Header) {
	if w.State != "" {
		h.Set(HeaderState, string(w.State))
		h.Set(HeaderWeight, strconv.FormatFloat(w.Weight, 'f', -1, 64))
	}
	h.Set(HeaderReasonClass, w.Class)
	h.Set(HeaderDecisionAge, strconv.FormatFloat(w.AgeSeconds(), 'f', -1, 64))
}

// AgeSeconds is Age in seconds rounded to milliseconds, -1 before the
// first decision: the value of the visibility header.
func (w Why) AgeSeconds() float64 {
	if w.Age < 0 {
		return -1
	}
	return math.Round(w.Age.Seconds()*1000) / 1000
}
