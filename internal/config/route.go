package config

import (
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
// and its score, choices and load_stale when the file sets them. route.New checks them and names the
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
		if pc.LoadStale != nil {
			p.Picker.LoadStale = pc.LoadStale.Duration
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
// first-token deadline (StallFloor, StallMultiple). Keys the file leaves
// out keep s's values (zero: route's defaults).
func (c *Config) RouteSettings(s route.Settings) route.Settings {
	if v := c.Route.StallFloor; v != nil {
		s.StallFloor = v.Duration
	}
	if v := c.Route.StallMultiple; v != nil {
		s.StallMultiple = *v
	}
	return s
}
