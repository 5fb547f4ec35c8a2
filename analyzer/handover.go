package analyzer

import "slices"

// Forget drops every pool for which drop returns true, with its backends
// and windows, and returns their ids, sorted: what an instance does when it
// no longer owns the pools' partition (another instance decides for them
// now). A pool forgotten and later adopted or seen again continues its seq
// within the epoch. Configured pools are forgotten too; Adopt brings them
// back.
func (a *Analyzer) Forget(drop func(pool string) bool) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, p := range a.pools {
		if drop(id) {
			ids = append(ids, id)
			a.retire(id, p.seq)
			a.backendCount -= len(p.backends)
			delete(a.pools, id)
		}
	}
	if len(ids) > 0 {
		a.poolOrder = nil
		a.lastPool, a.lastBackend = nil, nil
	}
	slices.Sort(ids)
	return ids
}

// Adopt moves every pool of from for which keep returns true into a,
// replacing a's pool of the same id, and returns their ids, sorted. from is
// an analyzer of the same configuration that rebuilt those pools apart (a
// replay and a Restore of the partitions an instance takes over, done while
// a keeps deciding for the others), so that rebuilding evaluates only them
// and at their events' times. The adopted pools continue a's seq and are
// published by a's next Evaluate. from must not be used concurrently and
// keeps its other pools.
func (a *Analyzer) Adopt(from *Analyzer, keep func(pool string) bool) []string {
	if from == a {
		return nil
	}
	from.mu.Lock()
	var moved []*pool
	for id, p := range from.pools {
		if keep(id) {
			moved = append(moved, p)
			delete(from.pools, id)
			from.backendCount -= len(p.backends)
		}
	}
	from.poolOrder = nil
	from.lastPool, from.lastBackend = nil, nil
	from.mu.Unlock()

	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(moved))
	for _, p := range moved {
		seq := a.startSeq(p.id)
		if old := a.pools[p.id]; old != nil {
			seq = max(seq, old.seq)
			a.backendCount -= len(old.backends)
		}
		p.seq = seq
		p.published, p.signature, p.spare = false, nil, nil
		a.conform(p) // from's configuration may predate a Reconfigure of a (reload.go)
		a.pools[p.id] = p
		a.backendCount += len(p.backends)
		ids = append(ids, p.id)
	}
	if len(moved) > 0 {
		a.poolOrder = nil
		a.lastPool, a.lastBackend = nil, nil
	}
	slices.Sort(ids)
	return ids
}
