package sim

import (
	"math/rand/v2"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Fleet-load policies (docs/EVALUATION.md, "Fleet-wide load (experiment)"). Those the
// picker implements run the real feed/p2c with its load score
// (p2c.LoadScore: the backend's published load plus R times the router's
// own change of in-flight requests since the report, R the snapshot's
// routers) and are listed in pickerPolicies. They were measured with the
// change counted from the snapshot that carries the load (the picker's
// rule before 2026-12-05, removed on 2026-12-06 after commit f98bc80:
// their EVALUATION.md figures are that build's); they now count it from
// the report, as the default does. Three variants that the
// picker does not implement, kept for the comparison, are simulator-local
// routers below: the score without the R factor, the published load alone,
// and every candidate ranked. Those honour the analyzer's breakers and
// weights as feed/p2c does (open and weight-0 backends are never
// candidates; a down-weighted candidate after the first joins the
// comparison only with probability weight / largest weight) and have the
// per-router retry budget, but no affinity and no slow-outlier guard.
const (
	FLoad3         = "fl-load3"          // p2c.LoadScore, 3 choices, per-router retry budget
	FLoad2         = "fl-load2"          // 2 choices
	FLoad4         = "fl-load4"          // 4 choices
	FLoad3Weighted = "fl-load3-weighted" // the load score divided by the backend's weight
	FLoad3NoR      = "fl-load3-nor"      // simulator-local: 3 choices, load + 1 x own delta (no R factor)
	FLoad3Shared   = "fl-load3-shared"   // simulator-local: 3 choices, the published load alone (no delta)
	FLoadFull      = "fl-load-full"      // simulator-local: every candidate ranked (no sampling), load + R x own delta
	FLoad3Fleet    = "fl-load3-fleet"    // FLoad3 with the snapshot's retry budget: free while half the slots are idle, else fleet-wide
	FLoad3Fleet25  = "fl-load3-fleet25"  // as FLoad3Fleet, free while a quarter of the slots is idle
	FLoad3NoBudget = "fl-load3-unbudget" // FLoad3 without a retry budget
	// FLoad3Exact is FLoad3 with the backends' true load at the snapshot
	// instead of the newest value reported on an outcome event: what the
	// event-borne report costs against a perfect scrape.
	FLoad3Exact = "fl-load3-exact"
	// FWExact is fleetwatch, the real picker with its defaults, fed the
	// backends' true loads the same way: with Scenario.ScrapeInterval the
	// latest read of a scrape, as serve's scraper publishes it for proxies
	// whose events carry no load (docs/EVALUATION.md "What the two goals
	// need").
	FWExact = "fw-exact"
	// FWBothLoads is fleetwatch with the loads of the outcome events and
	// of a scrape (Scenario.ScrapeInterval), the newer of the two, as
	// serve publishes them when a backend has a metrics_url and its events
	// carry loads too.
	FWBothLoads = "fw-both-loads"
)

// FWOldDetection is fleetwatch with the analyzer's detection as it was
// before the newest-quarter trip and the pool-wide 429 hold (both off),
// for the comparison in docs/EVALUATION.md. It, FWNo429Run and
// FW429RunAll count every 429 toward the 429 rate, as when they were
// measured; FW429RateAll is the default with that count alone
// (throttle_rate_counts: all, the default before 2026-12-05).
const FWOldDetection = "fw-old-detection"

// FWNo429Run is fleetwatch without the run-of-429s rule (the default
// before it counted hinted 429s), and FW429RunAll with it counting every
// 429, bare ones (a full queue) included: the comparison of
// docs/EVALUATION.md "The 429 breaker".
const (
	FWNo429Run   = "fw-no-429-run"
	FW429RunAll  = "fw-429-run-all"
	FW429RateAll = "fw-429-rate-all"
)

// FWNoRefuse is fleetwatch without the refusal rule
// (analyzer.Settings.ThrottleRefuseRate < 0, the default before
// 2026-12-06): a backend answering only bare 429s is down-weighted, never
// opened. docs/EVALUATION.md "A backend that refuses everything".
const FWNoRefuse = "fw-no-refuse"

// fwAnalyzerVariants are fleetwatch (the real picker) with other analyzer
// settings.
var fwAnalyzerVariants = map[string]analyzer.Settings{
	// The analyzers of earlier comparisons keep the rules of their time:
	// no refusal rule.
	FWOldDetection: {SlowFactor: FleetwatchAnalyzer.SlowFactor, RecentMinRequests: -1, PoolThrottleHold: -1, ConsecutiveThrottled: -1,
		ThrottleRateCounts: analyzer.RunCountsAll, ThrottleRefuseRate: -1},
	FWNo429Run: {SlowFactor: FleetwatchAnalyzer.SlowFactor, ConsecutiveThrottled: -1, ThrottleRateCounts: analyzer.RunCountsAll,
		ThrottleRefuseRate: -1},
	FW429RunAll: {SlowFactor: FleetwatchAnalyzer.SlowFactor, ThrottledRunCounts: analyzer.RunCountsAll, ThrottleRateCounts: analyzer.RunCountsAll,
		ThrottleRefuseRate: -1},
	FW429RateAll: {SlowFactor: FleetwatchAnalyzer.SlowFactor, ThrottleRateCounts: analyzer.RunCountsAll, ThrottleRefuseRate: -1},
	FWNoRefuse:   {SlowFactor: FleetwatchAnalyzer.SlowFactor, ThrottleRefuseRate: -1},
}

// FleetLoadPolicies are the fleet-load variants, in report order.
var FleetLoadPolicies = []string{FLoad3, FLoad2, FLoad4, FLoad3Weighted, FLoad3NoR, FLoad3Shared, FLoadFull}

// fleetLoadConfig is one simulator-local variant.
type fleetLoadConfig struct {
	choices int  // candidates sampled
	delta   int  // 0: no own delta; 1: x1; 2: x R
	full    bool // rank every candidate
}

var fleetLoadConfigs = map[string]fleetLoadConfig{
	FLoad3NoR:    {choices: 3, delta: 1},
	FLoad3Shared: {choices: 3, delta: 0},
	FLoadFull:    {full: true, delta: 2},
}

func init() {
	for name, d := range map[string]string{
		FLoad3:         "feed/p2c with p2c.LoadScore (published load + R x own in-flight change since the snapshot), 3 choices, per-router retry budget",
		FLoad2:         "as fl-load3 with 2 choices",
		FLoad4:         "as fl-load3 with 4 choices",
		FLoad3Weighted: "as fl-load3 with the score divided by the backend's weight",
		FLoad3NoR:      "simulator-local: as fl-load3 without the R factor (own change x 1)",
		FLoad3Shared:   "simulator-local: 3 choices ranked by the published load alone",
		FLoadFull:      "simulator-local: every candidate ranked by published load + R x own change (no sampling)",
		FLoad3Fleet:    "fl-load3 with the snapshot's retry budget: free while half the pool's capacity is idle, else one fleet-wide budget",
		FLoad3NoBudget: "fl-load3 without a retry budget",
		FLoad3Fleet25:  "fl-load3-fleet with retries free while a quarter of the capacity is idle",
		FLoad3Exact:    "fl-load3 with every backend's true load at the snapshot (a perfect scrape)",
		FWExact:        "fleetwatch with every backend's true load at the snapshot (a perfect scrape), or with --scrape-interval its latest read",
		FWBothLoads:    "fleetwatch with the newer of the event's load and the latest scrape (--scrape-interval; without it the events' loads)",
		FWOldDetection: "fleetwatch with the analyzer's newest-quarter trip, pool-wide 429 hold and run of 429s off (the detection before them)",
		FWNo429Run:     "fleetwatch with the run of 429s off (consecutive_throttled: -1, the default before)",
		FW429RunAll:    "fleetwatch with the run of 429s counting bare 429s too (throttled_run_counts: all)",
		FW429RateAll:   "fleetwatch with the 429 rate that opens a breaker counting bare 429s too (throttle_rate_counts: all, the default before 2026-12-05)",
		FWNoRefuse:     "fleetwatch without the refusal rule (throttle_refuse_rate: -1, the default before 2026-12-06): a backend answering only bare 429s is down-weighted, never opened",
	} {
		PolicyDescriptions[name] = d
	}
}

// fleetLoadRouter is one router running a simulator-local variant.
type fleetLoadRouter struct {
	cfg  fleetLoadConfig
	feed *fleetFeed
	rng  *rand.Rand

	inFlight []int
	atSnap   []int // inFlight when the latest load snapshot arrived
	weight   []float64
	open     []bool
	index    map[string]int

	budget *p2c.Budget

	cand []int // scratch
}

func newFleetLoadRouter(cfg fleetLoadConfig, e env) *fleetLoadRouter {
	n := len(e.ids)
	p := &fleetLoadRouter{
		cfg: cfg, feed: e.feed, rng: e.rng,
		inFlight: make([]int, n), atSnap: make([]int, n),
		weight: make([]float64, n), open: make([]bool, n),
		index:  make(map[string]int, n),
		cand:   make([]int, 0, n),
		budget: p2c.NewBudget(p2c.DefaultRetryRatio, p2c.DefaultRetryFloorPerSec, e.wall),
	}
	for i, id := range e.ids {
		p.weight[i] = 1
		p.index[id] = i
	}
	return p
}

// allowRetry applies the per-router retry budget to one attempt.
func (p *fleetLoadRouter) allowRetry(retry bool) bool {
	if !retry {
		p.budget.Deposit()
		return true
	}
	return p.budget.Withdraw()
}

func (p *fleetLoadRouter) score(b int) float64 {
	pub := &p.feed.pub
	own := float64(p.inFlight[b] - p.atSnap[b])
	load := pub.load[b]
	switch p.cfg.delta {
	case 0:
		if !pub.valid {
			return float64(p.inFlight[b]) // nothing published yet: local counts
		}
		return load
	case 1:
		return load + own
	}
	return load + float64(max(pub.routers, 1))*own
}

func (p *fleetLoadRouter) pick(_ *request, exclude int) (int, error) {
	if !p.allowRetry(exclude >= 0) {
		return -1, p2c.ErrRetryBudget
	}
	p.cand = p.cand[:0]
	maxW := 0.0
	for b := range p.weight {
		if b != exclude && !p.open[b] && p.weight[b] > 0 {
			p.cand = append(p.cand, b)
			maxW = max(maxW, p.weight[b])
		}
	}
	if len(p.cand) == 0 {
		if exclude >= 0 && !p.open[exclude] && p.weight[exclude] > 0 {
			return exclude, nil // the tried backend is the only candidate
		}
		return -1, errNoBackend
	}
	d := p.cfg.choices
	if p.cfg.full {
		d = len(p.cand)
	}
	best, bestScore, ties := -1, 0.0, 0
	for k := 0; k < d && len(p.cand) > 0; k++ {
		// Draw one remaining candidate in proportion to its weight and
		// remove it from the draw.
		total := 0.0
		for _, b := range p.cand {
			total += p.weight[b]
		}
		x, j := p.rng.Float64()*total, 0
		for j = 0; j < len(p.cand)-1; j++ {
			if x -= p.weight[p.cand[j]]; x < 0 {
				break
			}
		}
		b := p.cand[j]
		p.cand = append(p.cand[:j], p.cand[j+1:]...)
		// A down-weighted candidate after the first joins the comparison
		// with probability weight / largest weight (as in feed/p2c).
		if best >= 0 && p.weight[b] < maxW && p.rng.Float64()*maxW >= p.weight[b] {
			continue
		}
		sc := p.score(b)
		switch {
		case best < 0 || sc < bestScore:
			best, bestScore, ties = b, sc, 1
		case sc == bestScore && p.cfg.full:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = b
			}
		}
	}
	return best, nil
}

func (p *fleetLoadRouter) start(b int)                  { p.inFlight[b]++ }
func (p *fleetLoadRouter) finish(a *attempt, _ float64) { p.inFlight[a.backend]-- }

// update applies the analyzer's breakers and weights, and takes the
// router's in-flight counts now as the base of its delta (the snapshot
// carries the published loads).
func (p *fleetLoadRouter) update(snap *fleetwatch.Snapshot) {
	for i := range snap.Backends {
		sb := &snap.Backends[i]
		if b, ok := p.index[sb.Backend]; ok {
			p.weight[b] = sb.Weight
			p.open[b] = sb.State == fleetwatch.StateOpen
		}
	}
	copy(p.atSnap, p.inFlight)
}
