package analyzer

import (
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// snapshot builds the pool's snapshot at now from the backends' current
// decisions and window views. It allocates the nullable numbers of all
// backends in one backing array. A light snapshot (a load beat's,
// Evaluation.Loads) leaves out the reasons, the TTFT and TPOT quantiles,
// the rates and since: what a load frame does not carry and costs the
// most to compute.
func (a *Analyzer) snapshot(p *pool, now time.Time, light bool) fleetwatch.Snapshot {
	s := &p.settings
	bs := p.sorted()
	snap := fleetwatch.Snapshot{
		V:                 fleetwatch.ProtocolVersion,
		Pool:              p.id,
		Epoch:             a.epoch,
		Seq:               p.seq,
		At:                fleetwatch.At(now),
		TTLMs:             s.TTL.Milliseconds(),
		Mode:              p.mode,
		AllOpen:           p.allOpen,
		Shadow:            p.shadow,
		AffinityTolerance: p.tolerance,
		Backends:          make([]fleetwatch.Backend, len(bs)),
	}
	// Nine nullable numbers per backend (kv_cache_usage and TPOT included) plus
	// the median: the capacity is fixed, so pointers into the array stay
	// valid. Loads share one array too, made when the first is needed.
	nums := make([]float64, 0, 9*len(bs)+1)
	var loads []fleetwatch.Load
	ptr := func(v float64) *float64 {
		nums = append(nums, v)
		return &nums[len(nums)-1]
	}
	times := make([]fleetwatch.Time, 0, 2*len(bs))
	tptr := func(t time.Time) *fleetwatch.Time {
		times = append(times, fleetwatch.At(t))
		return &times[len(times)-1]
	}
	ewmas := make([]float64, 0, len(bs))
	prior := 0.0
	if !light {
		prior = weightPrior(s, bs) // for the weights' reasons
	}
	for i, b := range bs {
		v := &b.view
		d := fleetwatch.Backend{
			Backend:  b.id,
			State:    b.state,
			Weight:   b.weight,
			Priority: b.priority,
			Requests: int64(v.requests),
			WindowMs: s.Window.Milliseconds(),
			Drift:    b.drift,
			Trips:    b.trips,
		}
		if !light {
			d.Reason = a.snapshotReason(p, b, prior)
		}
		if !b.weightSet {
			d.Weight = 1 // not evaluated yet: a router treats it as healthy
		}
		if b.hasEWMA {
			d.EWMATTFTMs = ptr(b.ewma)
			ewmas = append(ewmas, b.ewma)
		}
		if !light {
			a.windowFields(b, &d, ptr)
		}
		if b.state == fleetwatch.StateOpen {
			d.OpenUntil = tptr(b.openUntil)
			if !b.quotaUntil.IsZero() && b.tripCause == CauseQuota {
				d.QuotaUntil = tptr(b.quotaUntil)
			}
		}
		if !b.since.IsZero() && !light {
			d.Since = tptr(b.since)
		}
		if b.cost != nil {
			d.CostPerMTok = ptr(*b.cost)
		}
		if l, kv, hasKV, ok := b.load.publish(now, s.LoadMaxAge); ok {
			if loads == nil {
				loads = make([]fleetwatch.Load, 0, len(bs))
			}
			if hasKV {
				l.KVCacheUsage = ptr(kv)
			}
			loads = append(loads, l)
			d.Load = &loads[len(loads)-1]
		}
		if p50, p95, ok := b.tpotQuantiles(now); ok && !light {
			d.P50TPOTMs, d.P95TPOTMs = ptr(p50), ptr(p95)
		}
		a.applyOverride(p.id, &d, now) // override.go
		snap.Backends[i] = d
	}
	if len(ewmas) > 0 {
		slices.Sort(ewmas)
		snap.MedianEWMATTFTMs = ptr(median(ewmas))
	}
	snap.Routers = p.routers.count(now.UnixNano(), int64(s.Window))
	snap.RetryBudget = retryBudget(snap.Backends, s.Window)
	return snap
}

// windowFields fills d's TTFT quantiles and rates from b's window.
func (a *Analyzer) windowFields(b *backend, d *fleetwatch.Backend, ptr func(float64) *float64) {
	if p50, p95, ok := b.win.ttftQuantiles(); ok {
		d.P50TTFTMs, d.P95TTFTMs = ptr(p50), ptr(p95)
	}
	if r, ok := b.view.successRate(); ok {
		d.SuccessRate = ptr(r)
	}
	if r, ok := b.view.rate429(); ok {
		d.Rate429 = ptr(r)
	}
}
