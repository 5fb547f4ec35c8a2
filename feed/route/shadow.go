package route

import (
	"fmt"
	"io"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// Shadow mode (PROTOCOL.md "Shadow mode (extension)"). A pool whose
// decision carries shadow "breakers" or "observe" is routed by
// p2c.ShadowView of it: the breakers only, or nothing but an operator's
// overrides. The pool's picker counts the picks the full decisions would
// have made differently, which the router exposes per pool at every
// scrape:
//
//	fleetwatch_route_shadow_mode{pool,mode}            1, mode off, breakers or observe
//	fleetwatch_route_shadow_picks_total{pool}          picks made in shadow mode
//	fleetwatch_route_shadow_differed_total{pool}       ... to another backend than the full decisions' pick
//	fleetwatch_route_shadow_excluded_total{pool,reason} ... to a backend the full decisions never pick:
//	                                                   reason open, weight (no share) or shed (all open)
//
// The counters appear once a pool has been in shadow mode. A retry is a
// pick like any other, so a request that failed on a backend the full
// decisions hold open, and was retried, counts twice. The third-attempt
// fallback (pool.untried) and a shed request's Retry-After follow the same
// view, so nothing in the router acts on what the mode holds back. The
// per-backend gauges (fleetwatch_route_backend_weight, _open) keep showing
// the decisions as published.

// ShadowStats returns the shadow-mode counts of pool (p2c.ShadowStats);
// ok is false for a pool the router does not route.
func (rt *Router) ShadowStats(pool string) (stats p2c.ShadowStats, ok bool) {
	p := rt.core.pools[pool]
	if p == nil {
		return p2c.ShadowStats{}, false
	}
	return p.picker.ShadowStats(), true
}

// writeShadow writes the shadow-mode series of every pool; the metrics set
// calls it on every scrape.
func (rt *Router) writeShadow(w io.Writer) {
	for _, id := range rt.core.ids {
		st := rt.core.pools[id].picker.ShadowStats()
		pool := promlabel.Quote(id)
		mode := string(st.Mode)
		if mode == "" {
			mode = string(fleetwatch.ShadowOffName)
		}
		fmt.Fprintf(w, "fleetwatch_route_shadow_mode{pool=%s,mode=%q} 1\n", pool, mode)
		if st.Mode == fleetwatch.ShadowOff && st.Picks == 0 {
			continue // never in shadow mode: no counters
		}
		fmt.Fprintf(w, "fleetwatch_route_shadow_picks_total{pool=%s} %d\n", pool, st.Picks)
		fmt.Fprintf(w, "fleetwatch_route_shadow_differed_total{pool=%s} %d\n", pool, st.Differed)
		for _, r := range [...]struct {
			reason string
			n      uint64
		}{{"open", st.ExcludedOpen}, {"weight", st.ExcludedWeight}, {"shed", st.ExcludedShed}} {
			fmt.Fprintf(w, "fleetwatch_route_shadow_excluded_total{pool=%s,reason=%q} %d\n", pool, r.reason, r.n)
		}
	}
}
