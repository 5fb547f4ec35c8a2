package analyzer

import (
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Reconfigured says what Reconfigure changed, each list sorted.
type Reconfigured struct {
	// PoolsAdded are configured pools that were not configured before
	// (a pool already tracked from its events keeps its state and becomes
	// configured).
	PoolsAdded []string `json:"pools_added,omitempty"`
	// PoolsRemoved are pools no longer configured: they are tracked on as
	// pools seen only in events, with the global settings, and are dropped
	// once their backends have expired.
	PoolsRemoved []string `json:"pools_removed,omitempty"`
	// PoolsChanged are pools that stay configured and whose effective
	// settings, mode, all_open or affinity tolerance changed.
	PoolsChanged []string `json:"pools_changed,omitempty"`
	// BackendsAdded and BackendsRemoved are "pool/backend" pairs that
	// became configured or stopped being configured. A removed backend is
	// tracked on as a backend seen only in events: it expires after the
	// pool's Expiry without an event (at once if it never had one).
	BackendsAdded   []string `json:"backends_added,omitempty"`
	BackendsRemoved []string `json:"backends_removed,omitempty"`
	// WindowsResized are pools whose Window or Bucket changed: their
	// backends' windows were rebuilt with the counts of the old ones (see
	// Reconfigure).
	WindowsResized []string `json:"windows_resized,omitempty"`
}

// Reconfigure applies a new configuration to a running analyzer: the global
// Settings, the Limits, the quarantine flag, and the configured pools and
// backends, added, removed or changed. Everything that stays keeps its
// state: breaker state, open_until, trip count, generation, EWMA, weight,
// drift status, load, windows and seq. cfg.Epoch and cfg.Seed are ignored:
// an analyzer keeps its epoch and its random stream for life.
//
// A pool or backend removed from the configuration is not dropped at once:
// it becomes what it would be had it never been configured (a pool seen only
// in events, with the global settings; a backend with priority 0 and no
// cost that expires after Expiry without an event), so that one that still
// has traffic keeps its breaker, and one with no traffic is gone at the
// next Evaluate.
//
// A pool whose Window or Bucket changed has its backends' windows rebuilt:
// each old bucket's counts and TTFT samples go to the new bucket that holds
// the old bucket's start, and what is older than the new window is
// dropped. With the same Bucket this is exact; with another it moves counts
// by less than a bucket.
//
// It validates cfg as New does and changes nothing when cfg is invalid (a
// *SettingError wrapping ErrInvalidSettings or ErrInvalidConfig). Limits
// lower than what is tracked drop nothing: they refuse new pools and
// backends until enough have expired.
func (a *Analyzer) Reconfigure(cfg Config) (Reconfigured, error) {
	global := cfg.Settings.WithDefaults()
	if err := cfg.validate(global); err != nil {
		return Reconfigured{}, err
	}
	limits := cfg.Limits.WithDefaults()
	if err := limits.validate(cfg.Pools); err != nil {
		return Reconfigured{}, err
	}
	configs := make(map[string]*PoolConfig, len(cfg.Pools))
	for i := range cfg.Pools {
		pc := cfg.Pools[i]
		pc.Backends = slices.Clone(pc.Backends)
		configs[pc.ID] = &pc
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	var r Reconfigured
	for id := range a.configs {
		if configs[id] == nil {
			r.PoolsRemoved = append(r.PoolsRemoved, id)
		}
	}
	for id := range configs {
		if a.configs[id] == nil {
			r.PoolsAdded = append(r.PoolsAdded, id)
		}
	}
	old := a.configs
	a.global, a.quarantine, a.limits, a.configs = global, cfg.Quarantine, limits, configs

	// Every tracked pool takes its new settings, configured or not.
	for _, p := range a.pools {
		before := poolView{p.settings, p.mode, p.allOpen, p.shadow, p.tolerance}
		a.configurePool(p)
		if p.settings.Window != before.settings.Window || p.settings.Bucket != before.settings.Bucket {
			for _, b := range p.backends {
				b.resizeWindows(p.settings.Window, p.settings.Bucket)
			}
			r.WindowsResized = append(r.WindowsResized, p.id)
		}
		if old[p.id] != nil && configs[p.id] != nil && before != (poolView{p.settings, p.mode, p.allOpen, p.shadow, p.tolerance}) {
			r.PoolsChanged = append(r.PoolsChanged, p.id)
		}
	}

	// Configured backends: added, kept (their priority and cost updated)
	// or no longer configured.
	for id, pc := range configs {
		p := a.pools[id]
		if p == nil {
			p = a.newPool(id)
		}
		want := make(map[string]bool, len(pc.Backends))
		for _, bc := range pc.Backends {
			want[bc.ID] = true
			b := p.backends[bc.ID]
			if b == nil {
				b = p.addBackend(bc.ID)
			}
			if !b.configured {
				r.BackendsAdded = append(r.BackendsAdded, id+"/"+bc.ID)
			}
			b.configured = true
			b.priority = bc.Priority
			b.cost = nil
			if bc.CostPerMTok != nil {
				b.cost = new(float64(*bc.CostPerMTok))
			}
		}
		for bid, b := range p.backends {
			if b.configured && !want[bid] {
				unconfigure(b)
				r.BackendsRemoved = append(r.BackendsRemoved, id+"/"+bid)
			}
		}
	}
	for _, id := range r.PoolsRemoved {
		if p := a.pools[id]; p != nil {
			for bid, b := range p.backends {
				if b.configured {
					unconfigure(b)
					r.BackendsRemoved = append(r.BackendsRemoved, id+"/"+bid)
				}
			}
		}
	}
	a.backendCount = 0
	for _, p := range a.pools {
		a.backendCount += len(p.backends)
	}
	a.poolOrder = nil
	a.lastPool, a.lastBackend = nil, nil
	for _, l := range [][]string{r.PoolsAdded, r.PoolsRemoved, r.PoolsChanged, r.BackendsAdded, r.BackendsRemoved, r.WindowsResized} {
		slices.Sort(l)
	}
	return r, nil
}

// conform brings a pool made under another configuration (an adopted
// one, rebuilt by an analyzer created before a Reconfigure) to a's: its
// settings, windows and configured backends. Called with a.mu held.
func (a *Analyzer) conform(p *pool) {
	window, bucket := p.settings.Window, p.settings.Bucket
	a.configurePool(p)
	if p.settings.Window != window || p.settings.Bucket != bucket {
		for _, b := range p.backends {
			b.resizeWindows(p.settings.Window, p.settings.Bucket)
		}
	}
	want := map[string]BackendConfig{}
	if pc := a.configs[p.id]; pc != nil {
		for _, bc := range pc.Backends {
			want[bc.ID] = bc
			if p.backends[bc.ID] == nil {
				p.addBackend(bc.ID)
			}
		}
	}
	for id, b := range p.backends {
		bc, ok := want[id]
		if !ok {
			if b.configured {
				unconfigure(b)
			}
			continue
		}
		b.configured, b.priority, b.cost = true, bc.Priority, nil
		if bc.CostPerMTok != nil {
			b.cost = new(float64(*bc.CostPerMTok))
		}
	}
}

// poolView is what configurePool sets, compared to report a changed pool.
type poolView struct {
	settings  Settings
	mode      fleetwatch.Mode
	allOpen   fleetwatch.AllOpen
	shadow    fleetwatch.Shadow
	tolerance float64
}

// configurePool sets p's settings, mode, all_open, shadow mode and
// tolerance from a.configs and a.global (newPool and Reconfigure).
func (a *Analyzer) configurePool(p *pool) {
	p.configured = false
	p.settings = a.global
	p.mode = fleetwatch.ModeBalance
	p.allOpen = fleetwatch.AllOpenShed
	p.shadow = fleetwatch.ShadowOff
	p.tolerance = fleetwatch.DefaultAffinityTolerance
	pc, ok := a.configs[p.id]
	if !ok {
		return
	}
	p.configured = true
	p.settings = a.global.Override(pc.Settings)
	if pc.Mode != "" {
		p.mode = pc.Mode
	}
	if pc.AllOpen != "" {
		p.allOpen = pc.AllOpen
	}
	p.shadow = pc.Shadow.Normalize()
	if pc.AffinityTolerance != 0 {
		p.tolerance = pc.AffinityTolerance
	}
}

// unconfigure makes b a backend seen only in events.
func unconfigure(b *backend) {
	b.configured = false
	b.priority = 0
	b.cost = nil
}

// resizeWindows rebuilds b's windows (outcomes and TPOT) for a new window
// and bucket length, keeping their contents (window.resized).
func (b *backend) resizeWindows(window, bucket time.Duration) {
	size := int(window / bucket)
	b.win = b.win.resized(size, bucket)
	if b.tpot != nil {
		w := b.tpot.resized(size, bucket)
		b.tpot = &w
	}
	b.view = b.win.stats()
}

// resized returns a window of size buckets of bucketLen holding w's
// contents: each live bucket of w is merged into the new bucket that holds
// its start; buckets older than the new window are dropped. The head stays
// at the time of w's head.
func (w *window) resized(size int, bucketLen time.Duration) window {
	nw := newWindow(size, bucketLen)
	if !w.started {
		return nw
	}
	nw.advance(floorDiv(w.head*w.bucketNanos, nw.bucketNanos))
	live := make([]int, 0, len(w.buckets))
	for i := range w.buckets {
		if b := &w.buckets[i]; !b.empty() && b.num > w.head-w.size() {
			live = append(live, i)
		}
	}
	slices.SortFunc(live, func(x, y int) int { return int(w.buckets[x].num - w.buckets[y].num) })
	for _, i := range live {
		b := &w.buckets[i]
		num := floorDiv(b.num*w.bucketNanos, nw.bucketNanos)
		nw.merge(num, b)
		if w.status != nil && b.counts[fleetwatch.OutcomeClientError] > 0 {
			nw.mergeStatus(num, &w.status[i])
		}
	}
	return nw
}

// mergeStatus adds the client errors by status class of an old bucket to
// bucket num, as merge adds its counts.
func (w *window) mergeStatus(num int64, src *statusCounts) {
	if num <= w.head-w.size() || num > w.head {
		return
	}
	if w.status == nil {
		w.status = make([]statusCounts, len(w.buckets))
	}
	dst := &w.status[w.index(num)]
	for k, c := range src {
		dst[k] += c
		w.statusTotal[k] += c
	}
}

// merge adds the counts and samples of src to bucket num, which must not
// be newer than the head; it does nothing when num is older than the
// window.
func (w *window) merge(num int64, src *bucket) {
	if num <= w.head-w.size() || num > w.head {
		return
	}
	dst := w.slot(num)
	if dst.empty() {
		dst.num = num
	}
	for o, c := range src.counts {
		dst.counts[o] += c
		w.counts[o] += uint64(c)
	}
	dst.maxRetryMs = max(dst.maxRetryMs, src.maxRetryMs)
	dst.hinted += src.hinted
	w.hinted += uint64(src.hinted)
	dst.sent += src.sent
	dst.sentClientErr += src.sentClientErr
	for _, bin := range src.samples {
		w.addSample(dst, bin)
	}
	if src.isDense() {
		for bin, c := range src.dense.counts {
			for range c {
				w.addSample(dst, uint16(bin))
			}
		}
	}
}

// addSample adds one TTFT sample to bucket dst of w, as add does.
func (w *window) addSample(dst *bucket, bin uint16) {
	if w.ttft == nil {
		w.ttft = new(histogram)
	}
	w.ttft.add(bin)
	dense := dst.isDense()
	dst.sampleCounts++
	switch {
	case dense:
		dst.dense.add(bin)
	case len(dst.samples) < denseAfter:
		dst.samples = append(dst.samples, bin)
	default:
		if dst.dense == nil {
			dst.dense = new(histogram)
		}
		for _, s := range dst.samples {
			dst.dense.add(s)
		}
		dst.dense.add(bin)
		dst.samples = dst.samples[:0]
	}
}

// floorDiv is x / y rounded towards minus infinity (y > 0).
func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y != 0 && x < 0 {
		q--
	}
	return q
}
