package route

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// pool is one pool as the router sees it: the configured backends and the
// picker that follows the pool's decisions.
type pool struct {
	id       string
	models   []string
	backends map[string]*backend
	order    []string // configured backend ids, sorted
	cfg      Pool
	picker   *p2c.Picker
	applied  atomic.Pointer[fleetwatch.Snapshot] // the last snapshot given to picker
	// followed is p2c.ShadowView(applied): the decisions the picker
	// follows, applied itself unless the pool is in shadow mode.
	followed atomic.Pointer[fleetwatch.Snapshot]
	logf     func(format string, args ...any)
	orca     string // the endpoint-load-metrics-format value to send; "": none (orca.go)

	warnMu sync.Mutex // guards warned
	warned string     // the unconfigured backends last logged, so each set is logged once
}

// backend is one configured backend.
type backend struct {
	id       string
	base     *url.URL
	apiKey   string
	lastUsed atomic.Int64 // unix ns of the last request this router sent; 0: never
}

// newPool builds pool i of the settings.
func newPool(i int, pc Pool, now func() time.Time, logf func(string, ...any)) (*pool, error) {
	if pc.ID == "" {
		return nil, fmt.Errorf("%w: pools[%d]: the pool needs an id", ErrConfig, i)
	}
	ps := pc.Picker
	if ps.Score.Rank == nil && ps.Score.Name != "" {
		return nil, fmt.Errorf("%w: pools[%d] (%s): unknown score %q (want one of p2c.Scores)", ErrConfig, i, pc.ID, ps.Score.Name)
	}
	if ps.Now == nil {
		ps.Now = now
	}
	p := &pool{id: pc.ID, cfg: pc, backends: map[string]*backend{}, picker: p2c.New(ps), logf: logf}
	if !pc.Shadow.Valid() {
		return nil, fmt.Errorf("%w: pools[%d].shadow = %q: want off, breakers or observe", ErrConfig, i, pc.Shadow)
	}
	var ok bool
	if p.orca, ok = orcaFormat(pc.ORCA); !ok {
		return nil, fmt.Errorf("%w: pools[%d].orca = %q: want %q, %q or %q", ErrConfig, i, pc.ORCA, ORCAText, ORCAJSON, ORCAOff)
	}
	p.cfg.Backends = slices.Clone(pc.Backends)
	p.models = append([]string{pc.ID}, pc.Models...)
	for j, bc := range pc.Backends {
		if bc.ID == "" {
			return nil, fmt.Errorf("%w: pools[%d].backends[%d] (pool %s): the backend needs an id", ErrConfig, i, j, pc.ID)
		}
		if _, dup := p.backends[bc.ID]; dup {
			return nil, fmt.Errorf("%w: pools[%d].backends[%d] (%s): backend id appears twice in pool %s", ErrConfig, i, j, bc.ID, pc.ID)
		}
		if bc.URL == "" {
			return nil, fmt.Errorf("%w: pools[%d].backends[%d] (%s): route needs a url", ErrConfig, i, j, bc.ID)
		}
		u, ok := validURL(bc.URL)
		if !ok {
			return nil, fmt.Errorf("%w: pools[%d].backends[%d].url = %q: want an http(s) base URL", ErrConfig, i, j, bc.URL)
		}
		p.backends[bc.ID] = &backend{id: bc.ID, base: u, apiKey: bc.APIKey}
		p.order = append(p.order, bc.ID)
	}
	if len(p.backends) == 0 {
		return nil, fmt.Errorf("%w: pools[%d] (%s): route needs at least one backend", ErrConfig, i, pc.ID)
	}
	slices.Sort(p.order)
	// Until the first decision arrives the pool routes on equal weights
	// and local signals: a snapshot from the configuration, stale from the
	// start (At is the Unix epoch), which any real snapshot replaces.
	p.apply(nil)
	return p, nil
}

// target returns the backend URL for a request path such as
// "/v1/chat/completions". A base URL that already ends in /v1 (as OpenAI
// client base URLs do) is not given a second one.
func (b *backend) target(path string) string {
	base := strings.TrimSuffix(b.base.String(), "/")
	if strings.HasSuffix(base, "/v1") && strings.HasPrefix(path, "/v1/") {
		path = path[len("/v1"):]
	}
	return base + path
}

// address is the backend's host:port (the scheme's default port when its
// URL names none).
func (b *backend) address() string {
	if b.base.Port() != "" {
		return b.base.Host
	}
	port := "80"
	if b.base.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(b.base.Hostname(), port)
}

// markUsed records a request sent now and reports whether, as far as this
// router knows, it hits a cold backend: the first request it sends there, or
// the first after idleGap without any.
func (b *backend) markUsed(now time.Time, idleGap time.Duration) bool {
	prev := b.lastUsed.Swap(now.UnixNano())
	return prev == 0 || now.Sub(time.Unix(0, prev)) >= idleGap
}

// configEpoch names the placeholder snapshot built from the configuration.
const configEpoch = "route-config"

// merge returns the snapshot the picker should apply for decision snap (nil
// for none yet): snap's decisions for the configured backends, and a
// healthy entry for each configured backend snap does not name yet. A
// backend snap names that is not configured is left out: the router has no
// URL for it.
func (p *pool) merge(snap *fleetwatch.Snapshot) *fleetwatch.Snapshot {
	out := &fleetwatch.Snapshot{
		V:       fleetwatch.ProtocolVersion,
		Pool:    p.id,
		Epoch:   configEpoch,
		At:      fleetwatch.At(time.Unix(0, 0)),
		TTLMs:   1,
		Mode:    p.cfg.Mode,
		AllOpen: p.cfg.AllOpen,
		Shadow:  p.cfg.Shadow.Normalize(),
	}
	if out.Mode == "" {
		out.Mode = fleetwatch.ModeBalance
	}
	if out.AllOpen == "" {
		out.AllOpen = fleetwatch.AllOpenShed
	}
	if snap != nil {
		*out = *snap
	}
	out.Backends = make([]fleetwatch.Backend, 0, len(p.order))
	next := 0 // where snap's backends, sorted by id as p.order is, reached
	for _, id := range p.order {
		var b fleetwatch.Backend
		if snap != nil {
			if d := findSorted(snap, id, &next); d != nil {
				b = *d
			}
		}
		if b.Backend == "" {
			b = fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftUnknown}
			for _, bc := range p.cfg.Backends {
				if bc.ID == id {
					b.Priority, b.CostPerMTok = bc.Priority, bc.CostPerMTok
				}
			}
		}
		out.Backends = append(out.Backends, b)
	}
	return out
}

// confirmedAt is when the decisions of snap, the snapshot applied, were
// last confirmed: its at, or the at of the latest load update based on
// it (a load frame, or a key frame that repeated them: feed.Watcher's
// refresh), which moved the picker's StaleAt on by as much.
func (p *pool) confirmedAt(snap *fleetwatch.Snapshot) time.Time {
	at := snap.At.Time
	if s := p.picker.StaleAt(); !s.IsZero() {
		if c := s.Add(-snap.StaleAt().Sub(at)); c.After(at) {
			return c
		}
	}
	return at
}

// findSorted returns snap's backend id, looking from *next on (snap's
// backends are sorted: Snapshot.Backends) and moving *next past it, so
// that merging the configured ids in order costs one pass; it searches
// all of them when the walk misses (a snapshot out of order, or one that
// does not name id).
func findSorted(snap *fleetwatch.Snapshot, id string, next *int) *fleetwatch.Backend {
	bs := snap.Backends
	j := *next
	for j < len(bs) && bs[j].Backend < id {
		j++
	}
	if j < len(bs) && bs[j].Backend == id {
		*next = j + 1
		return &bs[j]
	}
	return snap.Find(id)
}

// apply hands a decision snapshot for this pool to the picker.
func (p *pool) apply(snap *fleetwatch.Snapshot) {
	if snap != nil {
		p.warnUnconfigured(snap)
	}
	m := p.merge(snap)
	if prev := p.applied.Load(); prev == nil || m.NewerThan(prev) {
		p.followed.Store(p2c.ShadowView(m))
		p.applied.Store(m)
	}
	p.picker.Update(m)
}

// warnUnconfigured logs the backends snap names that are not configured
// (the router cannot route to them), once for each new set of them.
func (p *pool) warnUnconfigured(snap *fleetwatch.Snapshot) {
	var unknown []string
	for _, b := range snap.Backends {
		if p.backends[b.Backend] == nil {
			unknown = append(unknown, b.Backend)
		}
	}
	list := strings.Join(unknown, ", ")
	p.warnMu.Lock()
	changed := list != p.warned
	p.warned = list
	p.warnMu.Unlock()
	if changed && list != "" {
		p.logf("pool %s: the decisions name backends that are not configured, so not routed to: %s", p.id, list)
	}
}

// untried returns a backend for a third or later attempt when the picker,
// which can exclude only the previous backend, chose one already tried: the
// first (by id) configured backend not tried yet that the decisions the
// picker follows do not hold open or give weight 0, or "" when there is
// none.
func (p *pool) untried(tried []string) string {
	snap := p.followed.Load()
	for _, b := range snap.Backends {
		if b.State != fleetwatch.StateOpen && b.Weight > 0 && !slices.Contains(tried, b.Backend) {
			return b.Backend
		}
	}
	return ""
}

// retryAfter is what a shed request is told to wait: until the first open
// breaker of the decisions followed half-opens, in whole seconds, at least 1 and at most
// 300 (the analyzer's default open_max).
func (p *pool) retryAfter(now time.Time) int {
	best := time.Duration(-1)
	for _, b := range p.followed.Load().Backends {
		if b.State == fleetwatch.StateOpen && b.OpenUntil != nil {
			if d := b.OpenUntil.Sub(now); best < 0 || d < best {
				best = d
			}
		}
	}
	secs := int((best + time.Second - 1) / time.Second)
	return min(max(secs, 1), 300)
}
