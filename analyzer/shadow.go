package analyzer

import "github.com/fleetwatch/fleetwatch"

// Shadow mode is a property of a configured pool (PoolConfig.Shadow) that
// the analyzer only publishes: it computes the pool's decisions exactly as
// it would otherwise, and every snapshot of the pool carries the mode in
// its shadow field, so that routers that know the field treat the
// decisions as advisory (feed/p2c, shadow.go) while the analyzer keeps
// judging the backends from the outcomes they report. Pools tracked from
// events alone are never in shadow mode.
//
// Nothing else changes: in "observe" mode an open backend keeps receiving
// traffic, so its breaker sees real outcomes while open; the breaker still
// half-opens after its open time and closes after half_open_successes ok
// events in a row, as it would on a trickle.

// validateShadow checks a pool's shadow mode; key is the pool's key
// ("pools[0]").
func validateShadow(key string, s fleetwatch.Shadow) error {
	if !s.Valid() {
		return configErr(key+".shadow", string(s), "must be off, breakers or observe")
	}
	return nil
}
