package config

import (
	"math"
	"strings"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// RoutePools is the router's view of the pools: ids, models, the initial
// mode, all_open policy and shadow mode, backends with their URL, API key (read with
// getenv from the variable the file names), priority and cost, and the
// picker settings ps for every pool, with the pool's ms_per_cost_unit as
// the score's exchange rate (p2c.Settings.CostWeightPerMs, its inverse)
// and its score, choices, scan_routers, load_stale
// and load_running_weight (0, waiting only, is p2c's negative) when the
// file sets them, and the
// route block's retry_ratio when set. route.New checks them and names the
// pool, backend or URL at fault (a backend without a URL, for one).
func (c *Config) RoutePools(getenv func(string) string, ps p2c.Settings) []route.Pool {
	pools := make([]route.Pool, 0, len(c.Pools))
	for _, pc := range c.Pools {
		p := route.Pool{
			ID:      pc.ID,
			Models:  pc.Models,
			Mode:    fleetwatch.Mode(pc.Mode),
			AllOpen: fleetwatch.AllOpen(pc.AllOpen),
			Shadow:  fleetwatch.Shadow(pc.Shadow),
			Picker:  ps,
			ORCA:    pc.ORCA,
		}
		if v := pc.MsPerCostUnit; v != nil && *v > 0 {
			p.Picker.CostWeightPerMs = 1 / *v // cost / CostWeightPerMs is in ms
		}
		if pc.Score != "" {
			// An unknown name (Validate rejects it) keeps its name and no
			// Rank, which route.New reports.
			p.Picker.Score = p2c.Score{Name: pc.Score}
			if sc, ok := p2c.ScoreByName(pc.Score); ok {
				p.Picker.Score = sc
			}
		}
		if pc.Choices != nil {
			p.Picker.Choices = *pc.Choices
		}
		if pc.ScanRouters != nil {
			p.Picker.ScanRouters = *pc.ScanRouters
		}
		if pc.LoadStale != nil {
			p.Picker.LoadStale = pc.LoadStale.Duration
		}
		if v := pc.LoadRunningWeight; v != nil {
			p.Picker.RunningWeight = *v
			if *v == 0 {
				p.Picker.RunningWeight = -1 // waiting only
			}
		}
		if v := c.Route.RetryRatio; v != nil {
			p.Picker.RetryRatio = *v
		}
		for _, bc := range pc.Backends {
			b := route.Backend{ID: bc.ID, URL: bc.URL, Priority: bc.Priority, CostPerMTok: bc.CostPerMTok}
			if bc.APIKeyEnv != "" {
				b.APIKey = getenv(bc.APIKeyEnv)
			}
			p.Backends = append(p.Backends, b)
		}
		pools = append(pools, p)
	}
	return pools
}

// scoreNames lists the picker's named scores, for errors.
func scoreNames() string {
	var names []string
	for _, s := range p2c.Scores {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// RouteSettings returns s with what the file's route block sets: the
// first-token deadline (StallFloor, StallMultiple), MaxAttempts, IdleGap,
// MaxBody, HeaderTimeout and PrefixFrom (retry_ratio goes to the pools'
// pickers, RoutePools). Keys the file leaves out keep s's values (zero:
// route's defaults).
func (c *Config) RouteSettings(s route.Settings) route.Settings {
	r := c.Route
	if v := r.StallFloor; v != nil {
		s.StallFloor = v.Duration
	}
	if v := r.StallMultiple; v != nil {
		s.StallMultiple = *v
	}
	if v := r.MaxAttempts; v != nil {
		s.MaxAttempts = *v
	}
	if v := r.IdleGap; v != nil {
		s.IdleGap = v.Duration
	}
	if v := r.MaxBodyBytes; v != nil {
		s.MaxBody = *v
	}
	if v := r.HeaderTimeout; v != nil {
		s.HeaderTimeout = v.Duration
	}
	if r.PrefixFrom != "" {
		s.PrefixFrom = r.PrefixFrom
	}
	if r.Why {
		s.Why = true
	}
	return s
}

// validate checks the route block; fail names the key and its line.
func (r *RouteConfig) validate(fail func(key, format string, args ...any) error) error {
	if v := r.StallFloor; v != nil && v.Duration == 0 {
		return fail("route.stall_floor", "0s: must be > 0 (negative turns the first-token deadline off)")
	}
	if v := r.StallMultiple; v != nil && (!(*v > 0) || math.IsInf(*v, 0)) {
		return fail("route.stall_multiple", "%v: must be a finite number > 0", *v)
	}
	if v := r.MaxAttempts; v != nil && *v < 1 {
		return fail("route.max_attempts", "%d: must be >= 1", *v)
	}
	if v := r.IdleGap; v != nil && v.Duration <= 0 {
		return fail("route.idle_gap", "%v: must be > 0", v.Duration)
	}
	if v := r.MaxBodyBytes; v != nil && *v <= 0 {
		return fail("route.max_body_bytes", "%d: must be > 0", *v)
	}
	if v := r.HeaderTimeout; v != nil && v.Duration < 0 {
		return fail("route.header_timeout", "%v: must be >= 0 (0: wait as long as the client does)", v.Duration)
	}
	if v := r.RetryRatio; v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
		return fail("route.retry_ratio", "%v: must be a finite number (negative: no retry budget)", *v)
	}
	if p := r.PrefixFrom; p != "" && p != route.PrefixSystem && p != route.PrefixNone {
		return fail("route.prefix_from", "%q: want %s or %s", p, route.PrefixSystem, route.PrefixNone)
	}
	if f := r.Feed; f != "" && f != FeedCompact && f != FeedJSON {
		return fail("route.feed", "%q: want %s or %s", f, FeedCompact, FeedJSON)
	}
	return nil
}

// CompactFeed reports whether a router follows the compact feed
// (route.feed: compact, the default).
func (r *RouteConfig) CompactFeed() bool { return r.Feed != FeedJSON }
