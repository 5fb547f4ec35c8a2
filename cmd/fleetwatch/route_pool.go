package main

import (
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// routePool is one pool as the router sees it: the configured backends and
// the picker that follows the pool's decisions.
type routePool struct {
	id       string
	models   []string
	backends map[string]*routeBackend
	order    []string // configured backend ids, sorted
	cfg      config.PoolConfig
	picker   *p2c.Picker
	applied  atomic.Pointer[fleetwatch.Snapshot] // the last snapshot given to picker
}

// routeBackend is one configured backend.
type routeBackend struct {
	id       string
	base     *url.URL
	apiKey   string
	lastUsed atomic.Int64 // unix ns of the last request this router sent; 0: never
}

// target returns the backend URL for a request path such as
// "/v1/chat/completions". A base URL that already ends in /v1 (as OpenAI
// client base URLs do) is not given a second one.
func (b *routeBackend) target(path string) string {
	base := strings.TrimSuffix(b.base.String(), "/")
	if strings.HasSuffix(base, "/v1") && strings.HasPrefix(path, "/v1/") {
		path = path[len("/v1"):]
	}
	return base + path
}

// markUsed records a request sent now and reports whether, as far as this
// router knows, it hits a cold backend: the first request it sends there, or
// the first after idleGap without any.
func (b *routeBackend) markUsed(now time.Time, idleGap time.Duration) bool {
	prev := b.lastUsed.Swap(now.UnixNano())
	return prev == 0 || now.Sub(time.Unix(0, prev)) >= idleGap
}

// newRoutePools builds the pools of cfg. Every pool needs at least one
// backend with a URL.
func newRoutePools(cfg *config.Config, ps p2c.Settings) (map[string]*routePool, error) {
	pools := make(map[string]*routePool, len(cfg.Pools))
	for i, pc := range cfg.Pools {
		p := &routePool{id: pc.ID, cfg: pc, backends: map[string]*routeBackend{}, picker: p2c.New(ps)}
		p.models = append([]string{pc.ID}, pc.Models...)
		for j, bc := range pc.Backends {
			if bc.URL == "" {
				return nil, fmt.Errorf("pools[%d].backends[%d] (%s): route needs a url", i, j, bc.ID)
			}
			u, err := url.Parse(bc.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("pools[%d].backends[%d].url = %q: want an http(s) base URL", i, j, bc.URL)
			}
			b := &routeBackend{id: bc.ID, base: u}
			if bc.APIKeyEnv != "" {
				b.apiKey = os.Getenv(bc.APIKeyEnv)
			}
			p.backends[bc.ID] = b
			p.order = append(p.order, bc.ID)
		}
		if len(p.backends) == 0 {
			return nil, fmt.Errorf("pools[%d] (%s): route needs at least one backend", i, pc.ID)
		}
		slices.Sort(p.order)
		// Until the first decision arrives the pool routes on equal weights
		// and local signals: a snapshot from the configuration, stale from
		// the start (At is the Unix epoch), which any real snapshot replaces.
		p.apply(nil)
		pools[pc.ID] = p
	}
	return pools, nil
}

// configEpoch names the placeholder snapshot built from the configuration.
const configEpoch = "route-config"

// merge returns the snapshot the picker should apply for decision snap (nil
// for none yet): snap's decisions for the configured backends, and a
// healthy entry for each configured backend snap does not name yet. A
// backend snap names that is not configured is left out: the router has no
// URL for it.
func (p *routePool) merge(snap *fleetwatch.Snapshot) *fleetwatch.Snapshot {
	out := &fleetwatch.Snapshot{
		V:       fleetwatch.ProtocolVersion,
		Pool:    p.id,
		Epoch:   configEpoch,
		At:      fleetwatch.At(time.Unix(0, 0)),
		TTLMs:   1,
		Mode:    fleetwatch.Mode(p.cfg.Mode),
		AllOpen: fleetwatch.AllOpen(p.cfg.AllOpen),
	}
	if out.Mode == "" {
		out.Mode = fleetwatch.ModeBalance
	}
	if out.AllOpen == "" {
		out.AllOpen = fleetwatch.AllOpenShed
	}
	if snap != nil {
		*out = *snap
		out.Backends = nil
	}
	for _, id := range p.order {
		var b fleetwatch.Backend
		if snap != nil {
			if d := snap.Find(id); d != nil {
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

// apply hands a decision snapshot for this pool to the picker.
func (p *routePool) apply(snap *fleetwatch.Snapshot) {
	m := p.merge(snap)
	if prev := p.applied.Load(); prev == nil || m.NewerThan(prev) {
		p.applied.Store(m)
	}
	p.picker.Update(m)
}

// untried returns a backend for a third or later attempt when the picker,
// which can exclude only the previous backend, chose one already tried: the
// first (by id) configured backend not tried yet that the last snapshot does
// not hold open, or "" when there is none.
func (p *routePool) untried(tried []string) string {
	snap := p.applied.Load()
	for _, b := range snap.Backends {
		if b.State != fleetwatch.StateOpen && b.Weight > 0 && !slices.Contains(tried, b.Backend) {
			return b.Backend
		}
	}
	return ""
}

// retryAfter is what a shed request is told to wait: until the first open
// breaker of the pool half-opens, in whole seconds, at least 1 and at most
// 300 (the analyzer's default open_max).
func (p *routePool) retryAfter(now time.Time) int {
	best := time.Duration(-1)
	for _, b := range p.applied.Load().Backends {
		if b.State == fleetwatch.StateOpen && b.OpenUntil != nil {
			if d := b.OpenUntil.Sub(now); best < 0 || d < best {
				best = d
			}
		}
	}
	secs := int((best + time.Second - 1) / time.Second)
	return min(max(secs, 1), 300)
}
