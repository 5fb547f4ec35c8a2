package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Policy names. Each is a router implementation; every router of a run has
// its own instance (its own local view).
const (
	RoundRobin    = "round-robin"    // cycle through the backends
	Random        = "random"         // uniform random
	LeastConn     = "least-conn"     // fewest of this router's requests in flight, ties random
	LatencyGreedy = "latency-greedy" // lowest global EWMA of response time, no breaker, no randomness
	P2CLocal      = "p2c-local"      // the seed's pick/score on local in-flight and local EWMA, no feed
	LiteLLM       = "litellm"        // random shuffle with LiteLLM's cooldown rules
	AlwaysSticky  = "always-sticky"  // rendezvous on the prefix, never leaves
	Fleetwatch    = "fleetwatch"     // feed/p2c with the default score, fed by the analyzer
	FWSeed        = "fw-seed"        // fleetwatch with the seed's score
	FWInFlight    = "fw-inflight"    // fleetwatch with the in-flight score
	FWSqrt        = "fw-sqrt"        // fleetwatch with the sqrt score
	FWUnbudgeted  = "fw-unbudgeted"  // fleetwatch without the retry budget
	// FWDefaultAnalyzer is fleetwatch with every analyzer setting at its
	// default, including the slow rule that the other feed policies turn
	// off (see FleetwatchAnalyzer).
	FWDefaultAnalyzer = "fw-default-analyzer"
	// FWNoGuard is fleetwatch without the picker's slow-outlier guard.
	FWNoGuard = "fw-no-guard"
	// FWV1 is the picker as it was before the load score: the in-flight
	// score, two choices and the per-router retry budget.
	FWV1 = "fw-v1"
	// FWChoices4 and FWOwn4 are the steady-state experiments of
	// docs/EVALUATION.md ("The steady-state cells"): fleetwatch with 4
	// choices at every router count, and the same over the router's own
	// in-flight counts (the in-flight score).
	FWChoices4 = "fw-choices4"
	FWOwn4     = "fw-own4"
	// FWChoices3 is fleetwatch sampling 3 candidates at every router count
	// (choices: 3) instead of the scan of few routers: at 4 routers the
	// rule before 2026-12-05 (docs/EVALUATION.md "Pools larger than the
	// choices").
	FWChoices3 = "fw-choices3"
	// FWRunningQuarter is fleetwatch counting a published load's running
	// sequences a quarter (p2c.Settings.RunningWeight 0.25), an experiment
	// of docs/EVALUATION.md "Pools larger than the choices".
	FWRunningQuarter = "fw-running-quarter"
)

// FleetwatchAnalyzer are the analyzer settings of the feed policies other
// than FWDefaultAnalyzer: the defaults, except that the slow rule is
// effectively off (SlowFactor 1e9). With the default SlowFactor of 5 the
// rule opened healthy backends in every steady-state run (an EWMA of raw
// TTFT with alpha 0.2 jumps past 5x the peers' median on one long prompt or
// one queue burst), and each false trip cut a quarter of the capacity; see
// docs/EVALUATION.md. A scenario's own Analyzer settings replace these.
var FleetwatchAnalyzer = analyzer.Settings{SlowFactor: 1e9}

// StandardPolicies are compared in every scenario unless it says otherwise.
var StandardPolicies = []string{RoundRobin, Random, LeastConn, LatencyGreedy, P2CLocal, LiteLLM, Fleetwatch}

// ScorePolicies compare the picker's score variants for the default choice.
var ScorePolicies = []string{LeastConn, FWSeed, FWSqrt, FWInFlight, FWV1}

// pickerPolicy is a policy that runs the real feed/p2c picker: its settings
// and what the simulator's snapshots carry for it.
type pickerPolicy struct {
	settings p2c.Settings
	// exact: the backends' true loads at the snapshot instead of the
	// newest ones reported on outcome events (a perfect scrape).
	exact bool
	// both: with Scenario.ScrapeInterval, the newer of the load an event
	// reported and the latest scrape (serve with metrics_url and events
	// that carry loads); without it, the events' loads.
	both bool
	// localBudget: the snapshots carry no retry_budget, so the picker
	// keeps its per-router budget.
	localBudget bool
	// spareFree is the retry budget's free threshold (0: the default).
	spareFree float64
}

// pickerPolicies are the policies that run feed/p2c. Each router of a run
// has its own Picker; the analyzer's snapshots reach every one, with the
// fleet loads, routers and retry budget the simulator adds (see
// sim.withFleetLoad).
var pickerPolicies = map[string]pickerPolicy{
	Fleetwatch:        {},
	FWDefaultAnalyzer: {},
	FWSeed:            {settings: p2c.Settings{Score: p2c.SeedScore}},
	FWInFlight:        {settings: p2c.Settings{Score: p2c.InFlightScore}},
	FWSqrt:            {settings: p2c.Settings{Score: p2c.SqrtScore}},
	FWUnbudgeted:      {settings: p2c.Settings{RetryRatio: -1}},
	FWNoGuard:         {settings: p2c.Settings{SlowOutlierFactor: -1}},
	FWV1:              {settings: p2c.Settings{Score: p2c.InFlightScore, Choices: 2}, localBudget: true},
	FLoad3:            {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 3}, localBudget: true},
	FLoad2:            {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 2}, localBudget: true},
	FLoad4:            {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 4}, localBudget: true},
	FLoad3Exact:       {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 3}, localBudget: true, exact: true},
	FWExact:           {exact: true},
	FWBothLoads:       {both: true},
	FLoad3Weighted:    {settings: p2c.Settings{Score: weightedLoadScore, Choices: 3}, localBudget: true},
	FLoad3Fleet:       {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 3}},
	FLoad3Fleet25:     {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 3}, spareFree: 0.25},
	FLoad3NoBudget:    {settings: p2c.Settings{Score: p2c.LoadScore, Choices: 3, RetryRatio: -1}},
	FWChoices4:        {settings: p2c.Settings{Choices: 4}},
	FWOwn4:            {settings: p2c.Settings{Score: p2c.InFlightScore, Choices: 4}},
	FWChoices3:        {settings: p2c.Settings{Choices: 3}},
	FWRunningQuarter:  {settings: p2c.Settings{RunningWeight: 0.25}},
}

// weightedLoadScore is the load score divided by the backend's weight.
var weightedLoadScore = p2c.Score{Name: "load-weighted", Rank: p2c.LoadScore.Rank, FleetLoad: true, Weighted: true}

// PolicyDescriptions say what each policy is, for the reports.
var PolicyDescriptions = map[string]string{
	RoundRobin:        "round-robin per router",
	Random:            "uniform random",
	LeastConn:         "least connections (the router's own in-flight counts), ties random",
	LatencyGreedy:     "lowest global EWMA of response time over all outcomes, refreshed every second; no breaker, no randomness",
	P2CLocal:          "the seed's pick/score: two random choices, (inFlight+1) x local EWMA of ok TTFT; no feed, no breaker",
	LiteLLM:           "random shuffle; a backend cools down 5 s on a 429 or on > 50% failures in the current minute with >= 5 requests",
	AlwaysSticky:      "rendezvous hashing on the prefix over all backends, whatever their health",
	Fleetwatch:        "feed/p2c with its defaults, fed by the real analyzer every second",
	FWV1:              "feed/p2c as before the load score: in-flight score, 2 choices, per-router retry budget",
	FWSeed:            "feed/p2c with the seed's score (inFlight+1) x EWMA",
	FWInFlight:        "feed/p2c with the in-flight score",
	FWSqrt:            "feed/p2c with (inFlight+1) x sqrt(EWMA)",
	FWUnbudgeted:      "feed/p2c, default score, no retry budget",
	FWNoGuard:         "fleetwatch without the picker's slow-outlier guard",
	FWChoices4:        "fleetwatch with 4 choices at every router count",
	FWOwn4:            "fleetwatch with the in-flight score (the router's own counts, no published load) and 4 choices",
	FWDefaultAnalyzer: "fleetwatch with every analyzer default, including the slow rule (slow_factor 5)",
	FWRunningQuarter:  "fleetwatch with a published load of waiting + running / 4 (running sequences count a quarter)",
	FWChoices3:        "fleetwatch sampling 3 candidates at every router count (choices: 3) instead of the scan of few routers",
}

// errNoBackend is a router's "nothing to send to".
var errNoBackend = errors.New("sim: no backend available")

// router is one router's policy.
type router interface {
	// pick chooses a backend for req; exclude is a backend already tried
	// (-1 for none).
	pick(req *request, exclude int) (int, error)
	start(b int)
	finish(att *attempt, ttftMs float64)
	// update applies a decision snapshot (feed policies only).
	update(snap *fleetwatch.Snapshot)
}

// env is what a policy may know when it is built.
type env struct {
	ids      []string
	rng      *rand.Rand
	now      func() float64 // virtual ms
	wall     func() time.Time
	global   *globalLatency
	usesFeed bool
	feed     *fleetFeed // the published fleet loads (fleet-load policies)
	// backends are the simulated servers themselves, for the
	// perfect-knowledge precise-prefix policy only.
	backends []*backend
}

func newRouter(name string, e env) (router, error) {
	n := len(e.ids)
	switch name {
	case RoundRobin:
		return &roundRobin{n: n, next: e.rng.IntN(n)}, nil
	case Random:
		return &randomPolicy{n: n, rng: e.rng}, nil
	case LeastConn:
		return &leastConn{inFlight: make([]int, n), rng: e.rng}, nil
	case LatencyGreedy:
		return &latencyGreedy{global: e.global}, nil
	case P2CLocal:
		return &p2cLocal{inFlight: make([]int, n), ewma: make([]float64, n), rng: e.rng}, nil
	case LiteLLM:
		return newLiteLLM(n, e), nil
	case AlwaysSticky:
		return newSticky(e), nil
	}
	if rt := newPrefixRouter(name, e); rt != nil {
		return rt, nil
	}
	if pp, ok := pickerPolicies[name]; ok {
		s := pp.settings
		s.Now = e.wall
		return &fleetwatchRouter{picker: p2c.New(s), ids: e.ids, rng: e.rng}, nil
	}
	if cfg, ok := fleetLoadConfigs[name]; ok {
		return newFleetLoadRouter(cfg, e), nil
	}
	if _, ok := fwAnalyzerVariants[name]; ok {
		return newRouter(Fleetwatch, e)
	}
	return nil, fmt.Errorf("sim: unknown policy %q", name)
}

// usesFeed reports whether a policy reads the analyzer's snapshots.
func usesFeed(name string) bool {
	if _, ok := pickerPolicies[name]; ok {
		return true
	}
	_, load := fleetLoadConfigs[name]
	_, variant := fwAnalyzerVariants[name]
	return load || variant
}

type roundRobin struct{ n, next int }

func (p *roundRobin) pick(_ *request, exclude int) (int, error) {
	b := p.next % p.n
	p.next++
	if b == exclude && p.n > 1 {
		b = p.next % p.n
		p.next++
	}
	return b, nil
}
func (p *roundRobin) start(int)                   {}
func (p *roundRobin) finish(*attempt, float64)    {}
func (p *roundRobin) update(*fleetwatch.Snapshot) {}

type randomPolicy struct {
	n   int
	rng *rand.Rand
}

func (p *randomPolicy) pick(_ *request, exclude int) (int, error) {
	return uniformExcept(p.rng, p.n, exclude), nil
}
func (p *randomPolicy) start(int)                   {}
func (p *randomPolicy) finish(*attempt, float64)    {}
func (p *randomPolicy) update(*fleetwatch.Snapshot) {}

// uniformExcept draws from [0, n) without exclude when n > 1.
func uniformExcept(rng *rand.Rand, n, exclude int) int {
	if exclude < 0 || n < 2 {
		return rng.IntN(n)
	}
	b := rng.IntN(n - 1)
	if b >= exclude {
		b++
	}
	return b
}

type leastConn struct {
	inFlight []int
	rng      *rand.Rand
}

func (p *leastConn) pick(_ *request, exclude int) (int, error) {
	best, ties := -1, 0
	for b, n := range p.inFlight {
		if b == exclude && len(p.inFlight) > 1 {
			continue
		}
		switch {
		case best < 0 || n < p.inFlight[best]:
			best, ties = b, 1
		case n == p.inFlight[best]:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir: a uniform tie-break
				best = b
			}
		}
	}
	return best, nil
}
func (p *leastConn) start(b int)                  { p.inFlight[b]++ }
func (p *leastConn) finish(a *attempt, _ float64) { p.inFlight[a.backend]-- }
func (p *leastConn) update(*fleetwatch.Snapshot)  {}

// globalLatency is the latency-greedy policy's shared signal: an EWMA of
// every response's time (first token for ok, the answer for errors), over
// all routers, published once per heartbeat (so it is up to a second old,
// like any global feed).
type globalLatency struct {
	live      []float64
	published []float64
}

func (g *globalLatency) observe(b int, ms float64) {
	if g.live[b] == 0 {
		g.live[b] = ms
		return
	}
	g.live[b] = 0.2*ms + 0.8*g.live[b]
}

func (g *globalLatency) publish() { copy(g.published, g.live) }

type latencyGreedy struct{ global *globalLatency }

func (p *latencyGreedy) pick(_ *request, exclude int) (int, error) {
	best := -1
	for b, v := range p.global.published {
		if b == exclude && len(p.global.published) > 1 {
			continue
		}
		if best < 0 || v < p.global.published[best] { // unknown (0) first
			best = b
		}
	}
	return best, nil
}
func (p *latencyGreedy) start(int)                   {}
func (p *latencyGreedy) finish(*attempt, float64)    {}
func (p *latencyGreedy) update(*fleetwatch.Snapshot) {}

// p2cLocal is the seed article's code as written: two distinct uniform
// choices, score (inFlight+1) x ewmaMs with the router's own counts and an
// EWMA of its own ok TTFT samples (0 until the first, as in the seed), and
// no breaker.
type p2cLocal struct {
	inFlight []int
	ewma     []float64
	rng      *rand.Rand
}

func (p *p2cLocal) pick(_ *request, exclude int) (int, error) {
	n := len(p.inFlight)
	if n == 1 {
		return 0, nil
	}
	i := uniformExcept(p.rng, n, exclude)
	var j int
	if n == 2 && exclude >= 0 {
		return i, nil
	}
	for j = uniformExcept(p.rng, n, i); j == exclude; j = uniformExcept(p.rng, n, i) {
	}
	si := float64(p.inFlight[i]+1) * p.ewma[i]
	sj := float64(p.inFlight[j]+1) * p.ewma[j]
	if si <= sj {
		return i, nil
	}
	return j, nil
}
func (p *p2cLocal) start(b int) { p.inFlight[b]++ }
func (p *p2cLocal) finish(a *attempt, ttft float64) {
	p.inFlight[a.backend]--
	if a.outcome == fleetwatch.OutcomeOK {
		if p.ewma[a.backend] == 0 {
			p.ewma[a.backend] = ttft
		} else {
			p.ewma[a.backend] = 0.2*ttft + 0.8*p.ewma[a.backend]
		}
	}
}
func (p *p2cLocal) update(*fleetwatch.Snapshot) {}

// liteLLM mimics LiteLLM's router defaults: simple-shuffle (random) over
// the deployments not in cooldown; a deployment cools down for 5 s on a 429,
// or when more than 50% of its requests in the current minute failed with
// at least 5 requests (litellm/router_utils/cooldown_handlers.py,
// DEFAULT_COOLDOWN_TIME_SECONDS = 5, DEFAULT_FAILURE_THRESHOLD_PERCENT =
// 0.5, DEFAULT_FAILURE_THRESHOLD_MINIMUM_REQUESTS = 5).
type liteLLM struct {
	rng       *rand.Rand
	now       func() float64
	minute    []int64
	ok, fails []int
	coolUntil []float64
	cooldowns []int // per backend, how many times it was cooled down
}

const (
	liteLLMCooldownMs  = 5000
	liteLLMFailPercent = 0.5
	liteLLMMinRequests = 5
)

func newLiteLLM(n int, e env) *liteLLM {
	return &liteLLM{
		rng: e.rng, now: e.now,
		minute: make([]int64, n), ok: make([]int, n), fails: make([]int, n),
		coolUntil: make([]float64, n), cooldowns: make([]int, n),
	}
}

func (p *liteLLM) pick(_ *request, exclude int) (int, error) {
	now := p.now()
	count := 0
	for b := range p.coolUntil {
		if b != exclude && p.coolUntil[b] <= now {
			count++
		}
	}
	if count == 0 {
		return -1, errNoBackend // LiteLLM: "No deployments available"
	}
	k := p.rng.IntN(count)
	for b := range p.coolUntil {
		if b != exclude && p.coolUntil[b] <= now {
			if k == 0 {
				return b, nil
			}
			k--
		}
	}
	return -1, errNoBackend
}

func (p *liteLLM) start(int) {}

func (p *liteLLM) finish(a *attempt, _ float64) {
	b, now := a.backend, p.now()
	minute := int64(now / 60000)
	if p.minute[b] != minute {
		p.minute[b], p.ok[b], p.fails[b] = minute, 0, 0
	}
	switch {
	case a.outcome == fleetwatch.OutcomeOK:
		p.ok[b]++
		return
	case a.outcome == fleetwatch.OutcomeThrottled:
		p.fails[b]++
		p.cool(b, now)
		return
	}
	p.fails[b]++
	total := p.ok[b] + p.fails[b]
	if total >= liteLLMMinRequests && float64(p.fails[b])/float64(total) > liteLLMFailPercent {
		p.cool(b, now)
	}
}

func (p *liteLLM) cool(b int, now float64) {
	if p.coolUntil[b] <= now {
		p.cooldowns[b]++
	}
	p.coolUntil[b] = now + liteLLMCooldownMs
}

func (p *liteLLM) update(*fleetwatch.Snapshot) {}

// sticky sends a prefixed request to its rendezvous backend over all
// backends, whatever their health; others go at random.
type sticky struct {
	ids []string
	rng *rand.Rand
}

func newSticky(e env) *sticky { return &sticky{ids: e.ids, rng: e.rng} }

func (p *sticky) pick(req *request, exclude int) (int, error) {
	if !req.hasPrefix {
		return uniformExcept(p.rng, len(p.ids), exclude), nil
	}
	best, bestHash := -1, uint64(0)
	for b, id := range p.ids {
		if b == exclude && len(p.ids) > 1 {
			continue
		}
		// The same placement as the picker's affinity.
		if v := p2c.RendezvousWeight(req.prefix, id); best < 0 || v > bestHash {
			best, bestHash = b, v
		}
	}
	return best, nil
}
func (p *sticky) start(int)                   {}
func (p *sticky) finish(*attempt, float64)    {}
func (p *sticky) update(*fleetwatch.Snapshot) {}

// fleetwatchRouter is the real picker, as the route command uses it.
type fleetwatchRouter struct {
	picker *p2c.Picker
	ids    []string
	index  map[string]int
	rng    *rand.Rand
	held   [][]p2c.Choice // per backend index: the picks in flight, for finish
	// compact is the router's side of the compact feed (compactfeed.go).
	compact compactState
}

func (p *fleetwatchRouter) pick(req *request, exclude int) (int, error) {
	r := p2c.Request{Prefix: req.prefix, HasPrefix: req.hasPrefix}
	if exclude >= 0 {
		r.Exclude = p.ids[exclude]
	}
	c, err := p.picker.Pick(p.rng, r)
	if err != nil {
		return -1, err
	}
	if p.index == nil {
		p.index = make(map[string]int, len(p.ids))
		for i, id := range p.ids {
			p.index[id] = i
		}
	}
	b, ok := p.index[c.Backend]
	if !ok {
		c.Done(fleetwatch.OutcomeCanceled, 0, false)
		return -1, errNoBackend
	}
	if p.held == nil {
		p.held = make([][]p2c.Choice, len(p.ids))
	}
	p.held[b] = append(p.held[b], c) // finished by finish
	return b, nil
}

// start does nothing: Pick already counted the attempt in flight.
func (p *fleetwatchRouter) start(int) {}

func (p *fleetwatchRouter) finish(a *attempt, ttft float64) {
	// The choices of one backend are interchangeable: finish the newest.
	held := p.held[a.backend]
	c := &held[len(held)-1]
	// A proxy rarely knows a request hit a cold backend: report cold=false
	// and let the picker's blend and the analyzer's discounts cope.
	c.Done(a.outcome, ttft, false)
	p.held[a.backend] = held[:len(held)-1]
}

func (p *fleetwatchRouter) update(snap *fleetwatch.Snapshot) { p.picker.Update(snap) }

// mix64 is the splitmix64 finaliser (seeding prefix keys).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
