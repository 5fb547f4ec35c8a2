package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// poolID is the simulated pool's id.
const poolID = "sim"

// defaultFeedMs is the feed period when the scenario sets none: the
// analyzer's default heartbeat (1 s), which is also the latency-greedy
// policy's refresh period.
const defaultFeedMs = 1000

// sampleMs is how often backend occupancy is sampled for the imbalance.
const sampleMs = 250

// simBase is virtual time zero as a wall-clock time, for the analyzer and
// the picker.
var simBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sim is one run: one scenario, one policy, one seed.
type sim struct {
	sc      Scenario
	policy  string
	now     float64 // virtual ms
	end     float64
	feedMs  float64 // feed period: evaluations, snapshots, published loads
	queue   eventQueue
	seq     uint64
	timeout float64

	ids      []string
	index    map[string]int // backend id -> index
	backends []*backend
	routers  []router
	global   *globalLatency
	feed     *fleetFeed
	sources  []string  // per router, its Event.Source
	loads    []float64 // scratch: true backend loads at a heartbeat
	// scraped and scrapedAt are each backend's load at its latest scrape
	// and when (Scenario.ScrapeInterval; nil without).
	scraped, scrapedAt []float64
	an                 *analyzer.Analyzer
	evBuf              []fleetwatch.Event
	urgent             bool // an urgent evaluation is scheduled

	workload   *rand.Rand // arrivals and sizes: identical for every policy
	service    *rand.Rand // incident coin flips
	prefixSalt uint64
	nextID     int

	m      metrics
	events int64

	stallP95 float64 // the pool's p95 TTFT in the latest snapshot, for the deadline (stall.go)

	// compact is the serve side of the compact feed, frame its last frame
	// (compactfeed.go).
	compact    *feed.CompactEncoder
	frame      []byte
	feedBytes  int64
	feedFrames int64
}

// Run simulates sc under policy with seed and returns the measurements. The
// same (sc, policy, seed) gives the same Result.
func Run(sc Scenario, policy string, seed uint64) (*Result, error) {
	s, err := newSim(sc, policy, seed)
	if err != nil {
		return nil, err
	}
	s.run()
	return s.result(seed), nil
}

func newSim(sc Scenario, policy string, seed uint64) (*sim, error) {
	if len(sc.Backends) == 0 {
		return nil, errors.New("sim: scenario has no backends")
	}
	if sc.Trace != nil {
		if len(sc.Trace.Requests) == 0 {
			return nil, errors.New("sim: trace has no requests")
		}
		if sc.TraceSpeed < 0 {
			return nil, errors.New("sim: trace speed must be > 0")
		}
	} else if sc.Workload.RatePerSec <= 0 {
		return nil, errors.New("sim: workload rate must be > 0")
	}
	if sc.Routers == 0 {
		sc.Routers = 1
	}
	s := &sim{
		sc:         sc,
		compact:    feed.NewCompactEncoder(feed.CompactSettings{}),
		policy:     policy,
		end:        ms(sc.Duration),
		timeout:    ms(sc.ClientTimeout),
		workload:   rand.New(rand.NewPCG(seed, 0x5eed0001)),
		service:    rand.New(rand.NewPCG(seed, 0x5eed0002)),
		prefixSalt: mix64(seed ^ 0x1234),
	}
	if s.timeout == 0 {
		s.timeout = 30000
	}
	if s.feedMs = ms(sc.FeedPeriod); s.feedMs <= 0 {
		s.feedMs = defaultFeedMs
	}
	n := len(sc.Backends)
	s.global = &globalLatency{live: make([]float64, n), published: make([]float64, n)}
	pc := analyzer.PoolConfig{ID: poolID}
	for i, spec := range sc.Backends {
		spec = spec.withDefaults()
		if spec.ID == "" {
			spec.ID = fmt.Sprintf("b%d", i)
		}
		s.ids = append(s.ids, spec.ID)
		be := &backend{spec: spec, cache: lru{size: spec.CacheSize}, fingerprint: "fp_a"}
		if spec.KVBlocks > 0 {
			be.kv = newBlockCache(spec.KVBlocks)
		}
		for j := range sc.Incidents {
			if sc.Incidents[j].Backend == spec.ID {
				be.incidents = append(be.incidents, &sc.Incidents[j])
			}
		}
		be.counted = make([]int, len(be.incidents))
		s.backends = append(s.backends, be)
		pc.Backends = append(pc.Backends, analyzer.BackendConfig{ID: spec.ID, Priority: spec.Priority})
	}
	s.index = make(map[string]int, n)
	for i, id := range s.ids {
		s.index[id] = i
	}
	slots := make([]float64, n)
	for i, be := range s.backends {
		slots[i] = float64(be.spec.Slots)
	}
	s.loads = make([]float64, n)
	s.feed = newFleetFeed(slots, sc.Routers, analyzer.DefaultWindow)
	if usesFeed(policy) {
		an, err := newSimAnalyzer(sc, policy, pc, seed)
		if err != nil {
			return nil, err
		}
		s.an = an
	}
	for r := range sc.Routers {
		rt, err := newRouter(policy, env{
			ids:      s.ids,
			rng:      rand.New(rand.NewPCG(seed, uint64(r+1)<<32|0x70)),
			now:      func() float64 { return s.now },
			wall:     func() time.Time { return s.wall() },
			global:   s.global,
			feed:     s.feed,
			backends: s.backends,
		})
		if err != nil {
			return nil, err
		}
		s.routers = append(s.routers, rt)
		s.sources = append(s.sources, fmt.Sprintf("r%d", r))
	}
	s.m.init(s)
	return s, nil
}

// newSimAnalyzer is the analyzer of a policy that follows the feed: the
// fleetwatch settings of the simulator, the scenario's, the defaults or a
// variant's as the policy says, with a heartbeat of one feed period.
func newSimAnalyzer(sc Scenario, policy string, pc analyzer.PoolConfig, seed uint64) (*analyzer.Analyzer, error) {
	settings := FleetwatchAnalyzer
	if sc.Analyzer != (analyzer.Settings{}) {
		settings = sc.Analyzer
	}
	if policy == FWDefaultAnalyzer {
		settings = analyzer.Settings{}
	}
	if v, ok := fwAnalyzerVariants[policy]; ok {
		settings = v
	}
	switch {
	case sc.JSONFeed && sc.FeedPeriod > 0 && settings.Heartbeat == 0:
		// A snapshot every feed period: the period is the analyzer's
		// heartbeat (a faster feed is analyzer.heartbeat set lower).
		settings.Heartbeat, settings.LoadBeat = sc.FeedPeriod, -1
	case sc.JSONFeed:
		settings.LoadBeat = -1 // snapshots only, every heartbeat
	case sc.FeedPeriod > 0 && settings.LoadBeat == 0:
		// The compact feed's loads every feed period; the snapshots every
		// heartbeat (1 s), or every period when it is longer.
		settings.LoadBeat = sc.FeedPeriod
		if sc.FeedPeriod >= analyzer.DefaultHeartbeat && settings.Heartbeat == 0 {
			settings.Heartbeat, settings.LoadBeat = sc.FeedPeriod, -1
		}
	}
	return analyzer.New(analyzer.Config{Settings: settings, Pools: []analyzer.PoolConfig{pc}, Seed: seed, Epoch: "sim", Quarantine: true})
}

func (s *sim) wall() time.Time { return simBase.Add(dur(s.now)) }

func (s *sim) schedule(e event) {
	s.seq++
	e.seq = s.seq
	s.queue.push(e)
}

func (s *sim) run() {
	s.schedule(event{at: 0, kind: evHeartbeat})
	s.schedule(event{at: 0, kind: evSample})
	s.schedule(event{at: s.nextArrival(), kind: evArrival})
	if every := ms(s.sc.ScrapeInterval); every > 0 {
		n := len(s.backends)
		s.scraped, s.scrapedAt = make([]float64, n), make([]float64, n)
		for b := range n { // each at a phase of its own, spread evenly
			s.scrapedAt[b] = -1
			s.schedule(event{at: every * (float64(b) + 0.5) / float64(n), kind: evScrape, b: b})
		}
	}
	for i := range s.sc.Incidents {
		if in := &s.sc.Incidents[i]; in.Kind == Drift && in.To > 0 {
			s.schedule(event{at: ms(in.To), kind: evDrift, b: slices.Index(s.ids, in.Backend)})
		}
	}
	for len(s.queue.items) > 0 {
		e := s.queue.pop()
		if e.at > s.end {
			break
		}
		s.now = e.at
		s.events++
		switch e.kind {
		case evArrival:
			s.arrive()
		case evAnswer:
			s.complete(e.att)
		case evDone:
			s.finishService(e.att)
		case evTimeout:
			s.timeoutAttempt(e.att)
		case evStall:
			s.stallAttempt(e.att)
		case evHeartbeat:
			s.heartbeat()
			s.schedule(event{at: s.now + s.nextBeatMs(), kind: evHeartbeat})
		case evUrgent:
			s.urgent = false
			s.evaluate()
		case evSample:
			s.m.sample(s)
			s.schedule(event{at: s.now + sampleMs, kind: evSample})
		case evScrape:
			be := s.backends[e.b]
			s.scraped[e.b], s.scrapedAt[e.b] = float64(be.busy+be.waiting), s.now
			s.schedule(event{at: s.now + ms(s.sc.ScrapeInterval), kind: evScrape, b: e.b})
		case evDrift:
			if s.an != nil && e.b >= 0 {
				s.an.SetDrift(poolID, s.ids[e.b], fleetwatch.DriftDrifted)
				s.evaluate()
			}
		}
	}
}

// interArrival draws the time to the next arrival (Poisson, optionally
// modulated by bursts).
func (s *sim) interArrival() float64 {
	w := &s.sc.Workload
	rate := w.RatePerSec
	if w.Bursty {
		factor, on, off := w.BurstFactor, ms(w.BurstOn), ms(w.BurstOff)
		if factor == 0 {
			factor = 3
		}
		if on == 0 {
			on = 5000
		}
		if off == 0 {
			off = 15000
		}
		phase := math.Mod(s.now, on+off)
		if phase < on {
			rate *= factor
		} else {
			// Keep the mean: on x factor + off x low = (on + off).
			rate *= math.Max(0.05, (on+off-on*factor)/off)
		}
	}
	return s.now + s.workload.ExpFloat64()/rate*1000
}

// nextArrival is the time of the next arrival: the trace's next request,
// or a draw from the workload.
func (s *sim) nextArrival() float64 {
	if tr := s.sc.Trace; tr != nil {
		if s.nextID >= len(tr.Requests) {
			return math.Inf(1)
		}
		return ms(tr.Requests[s.nextID].At) / s.traceSpeed()
	}
	return s.interArrival()
}

func (s *sim) traceSpeed() float64 {
	if s.sc.TraceSpeed > 0 {
		return s.sc.TraceSpeed
	}
	return 1
}

// affinityBlocks is how many leading KV blocks make a trace request's
// prefix key for the policies with prefix affinity (fleetwatch,
// always-sticky): the hash of its first 1,024 tokens, what a proxy can
// compute from a request's body.
const affinityBlocks = 2

func (s *sim) arriveTrace() {
	tr := s.sc.Trace.Requests[s.nextID]
	req := &request{
		id:           s.nextID,
		router:       s.workload.IntN(len(s.routers)),
		arrival:      s.now,
		promptTokens: tr.PromptTokens,
		outputTokens: tr.OutputTokens,
		blocks:       tr.Blocks,
	}
	if n := len(tr.Blocks); n > 0 {
		req.prefix, req.hasPrefix = tr.Blocks[min(n, affinityBlocks)-1], true
	}
	s.nextID++
	if at := s.nextArrival(); !math.IsInf(at, 1) {
		s.schedule(event{at: at, kind: evArrival})
	}
	s.m.requests++
	s.send(req, -1)
}

func (s *sim) arrive() {
	if s.sc.Trace != nil {
		s.arriveTrace()
		return
	}
	w := &s.sc.Workload
	req := &request{
		id:           s.nextID,
		router:       s.workload.IntN(len(s.routers)),
		arrival:      s.now,
		promptTokens: drawLogNormal(s.workload, w.PromptTokens),
		outputTokens: drawLogNormal(s.workload, w.OutputTokens),
	}
	if w.Prefixes > 0 {
		// The prefixes' hashes depend on the seed, so that each seed places
		// them on backends differently.
		req.prefix = mix64(uint64(s.workload.IntN(w.Prefixes)) + s.prefixSalt)
		req.hasPrefix = true
		req.promptTokens += w.PrefixTokens
	}
	s.nextID++
	s.schedule(event{at: s.interArrival(), kind: evArrival})
	s.m.requests++
	if s.now >= s.m.watchFrom && s.now < s.m.watchTo {
		s.m.windowReqs++
	}
	s.send(req, -1)
}

// send makes one attempt of req; exclude is the backend just tried.
func (s *sim) send(req *request, exclude int) {
	rt := s.routers[req.router]
	b, err := rt.pick(req, exclude)
	if err != nil {
		s.m.refused(err)
		s.fail(req)
		return
	}
	req.attempts++
	if req.attempts > 1 {
		s.m.retries++
	}
	att := &attempt{req: req, backend: b, sent: s.now}
	rt.start(b)
	s.m.attempt(s, b)
	s.admit(att)
}

// admit is the backend receiving an attempt.
func (s *sim) admit(att *attempt) {
	be := s.backends[att.backend]
	t := dur(s.now)
	for i, in := range be.incidents {
		if !in.active(t) {
			continue
		}
		switch in.Kind {
		case FailFast, Throttle, BareThrottle, ClientErrors:
			if in.Count > 0 && be.counted[i] >= in.Count {
				continue
			}
			if in.Rate > 0 && s.service.Float64() >= in.Rate {
				continue
			}
			be.counted[i]++
			switch {
			case in.Kind == FailFast:
				s.answer(att, 500, 1)
			case in.Kind == Throttle:
				att.quota = true
				s.answer(att, 429, 1)
			case in.Kind == BareThrottle:
				s.answer(att, 429, 1)
			case in.Status != 0:
				s.answer(att, in.Status, 1)
			default:
				s.answer(att, 404, 1)
			}
			return
		case Stall:
			att.stalled = true
		}
	}
	switch {
	case be.busy < be.spec.Slots:
		s.startService(be, att)
	case be.waiting < be.spec.Queue:
		att.queued = true
		be.queue = append(be.queue, att)
		be.waiting++
	default:
		s.answer(att, 429, 1)
		return
	}
	s.schedule(event{at: att.sent + s.timeout, kind: evTimeout, att: att})
	if d := s.stallDeadlineMs(); d > 0 && d < s.timeout {
		s.schedule(event{at: att.sent + d, kind: evStall, att: att})
	}
}

// answer schedules an immediate answer (an error or a 429) after delayMs.
func (s *sim) answer(att *attempt, status int, delayMs float64) {
	att.status = status
	att.outcome = fleetwatch.OutcomeFromStatus(status)
	s.schedule(event{at: s.now + delayMs, kind: evAnswer, att: att})
}

// speed is the backend's time multiplier now.
func (s *sim) speed(be *backend) float64 {
	f := be.spec.Speed
	t := dur(s.now)
	for _, in := range be.incidents {
		if in.Kind == Slow || in.Kind == Fast {
			f *= in.speedFactor(t)
		}
	}
	return f
}

func (s *sim) startService(be *backend, att *attempt) {
	be.busy++
	att.inSlot = true
	req := att.req
	cached := 0
	switch {
	case len(req.blocks) > 0 && be.kv != nil:
		// A hit is the run of leading blocks cached; the last block may be
		// partial.
		cached = min(be.kv.use(req.blocks)*BlockTokens, req.promptTokens)
		att.cacheHit = cached > 0
		s.m.prefixStarts++
	case req.hasPrefix && len(req.blocks) == 0:
		att.cacheHit = be.cache.touch(req.prefix)
		s.m.prefixStarts++
		if att.cacheHit {
			cached = s.sc.Workload.PrefixTokens
		}
	}
	if att.cacheHit {
		s.m.cacheHits++
	}
	s.m.promptTokens += int64(req.promptTokens)
	s.m.cachedTokens += int64(cached)
	if att.stalled {
		return // the timeout ends it
	}
	spec := &be.spec
	extra := 0.0
	if spec.ColdMs > 0 && ((!be.served && spec.StartsCold) || (be.served && s.now-be.lastServed > ms(spec.ColdIdle))) {
		extra = spec.ColdMs
	}
	be.served, be.lastServed = true, s.now
	uncached := req.promptTokens - cached
	speed := s.speed(be)
	prefill := (spec.PrefillBaseMs + spec.PrefillPerTokenMs*float64(uncached)) * speed
	if spec.PrefillBatchPenalty > 0 {
		prefill *= 1 + spec.PrefillBatchPenalty*float64(be.busy-1)/float64(spec.Slots)
	}
	decode := float64(req.outputTokens) * spec.DecodePerTokenMs * speed *
		(1 + spec.BatchPenalty*float64(be.busy-1)/float64(spec.Slots))
	att.firstToken = s.now + extra + prefill
	att.gotFirst = true
	s.schedule(event{at: att.firstToken + decode, kind: evDone, att: att})
}

// release frees a slot and starts the next waiting attempt.
func (s *sim) release(be *backend) {
	be.busy--
	for be.queueHead < len(be.queue) {
		next := be.queue[be.queueHead]
		be.queue[be.queueHead] = nil
		be.queueHead++
		if !next.queued {
			continue // timed out while waiting
		}
		next.queued = false
		be.waiting--
		s.startService(be, next)
		break
	}
	if be.queueHead > 256 && be.queueHead*2 > len(be.queue) {
		be.queue = append(be.queue[:0], be.queue[be.queueHead:]...)
		be.queueHead = 0
	}
}

func (s *sim) finishService(att *attempt) {
	if att.done {
		return
	}
	att.status, att.outcome = 200, fleetwatch.OutcomeOK
	s.release(s.backends[att.backend])
	s.complete(att)
}

func (s *sim) timeoutAttempt(att *attempt) { s.endAttempt(att, 504, fleetwatch.OutcomeTimeout) }

// endAttempt ends an attempt that has no first token yet (the client's
// timeout, the router's first-token deadline) with status and outcome.
func (s *sim) endAttempt(att *attempt, status int, outcome fleetwatch.Outcome) {
	if att.done || (att.gotFirst && att.firstToken <= s.now) {
		return // answered, or streaming: the timeout is on the first token
	}
	be := s.backends[att.backend]
	switch {
	case att.queued:
		att.queued = false
		be.waiting--
	case att.inSlot:
		s.release(be)
	}
	att.status, att.outcome = status, outcome
	s.complete(att)
}

// complete delivers an attempt's outcome to its router, the feed and the
// client.
func (s *sim) complete(att *attempt) {
	att.done = true
	req := att.req
	ttft := 0.0
	if att.outcome == fleetwatch.OutcomeOK {
		ttft = att.firstToken - att.sent
		s.global.observe(att.backend, ttft)
	} else {
		s.global.observe(att.backend, s.now-att.sent)
	}
	s.routers[req.router].finish(att, ttft)
	// The backend reports its load (running + waiting) with the answer.
	be := s.backends[att.backend]
	s.feed.report(s.now, att.backend, float64(be.busy), float64(be.waiting), req.router)
	if s.an != nil {
		s.observe(att, ttft)
	}
	switch {
	case att.outcome == fleetwatch.OutcomeOK:
		req.finished = true
		s.m.success(att.firstToken - req.arrival)
	case req.attempts <= s.sc.Retries:
		s.send(req, att.backend)
	default:
		s.fail(req)
	}
}

func (s *sim) fail(req *request) {
	req.finished = true
	s.m.failed++
}

// observe sends the attempt's outcome event to the analyzer, as a proxy
// would publish it.
func (s *sim) observe(att *attempt, ttft float64) {
	be := s.backends[att.backend]
	ev := fleetwatch.Event{
		Pool: poolID, Backend: s.ids[att.backend], TS: s.wall(),
		Status: att.status, HasStatus: true, Outcome: att.outcome,
		DurationMs: s.now - att.sent, HasDuration: true,
		InputTokens: int64(att.req.promptTokens), CacheHit: att.cacheHit,
		Fingerprint: be.fingerprintAt(dur(att.sent)),
		Source:      s.sources[att.req.router],
	}
	if att.outcome == fleetwatch.OutcomeOK {
		ev.TTFTMs, ev.HasTTFT = ttft, true
		ev.OutputTokens = int64(att.req.outputTokens)
	}
	if att.quota {
		// A quota's 429 carries a retry hint, as hosted APIs send one; a
		// full queue answers a bare 429, as an inference server's
		// admission limit does (text-generation-inference's
		// max_concurrent_requests, for one).
		ev.RetryAfterMs = 1000
	}
	s.evBuf = append(s.evBuf[:0], ev)
	if s.an.Observe(s.evBuf) && !s.urgent {
		s.urgent = true
		s.schedule(event{at: s.now, kind: evUrgent})
	}
}

func (be *backend) fingerprintAt(t time.Duration) string {
	for _, in := range be.incidents {
		if in.Kind == Drift && t >= in.From {
			return "fp_b"
		}
	}
	return be.fingerprint
}

// nextBeatMs is how long until the next heartbeat event: the feed
// period, or the analyzer's shorter load beat (analyzer.Settings.LoadBeat)
// of the compact feed.
func (s *sim) nextBeatMs() float64 {
	if s.an != nil {
		if hb := ms(s.an.Beat(poolID)); hb > 0 && hb < s.feedMs {
			return hb
		}
	}
	return s.feedMs
}

func (s *sim) heartbeat() {
	s.global.publish()
	s.evaluate()
}

// evaluate runs the analyzer and hands its snapshots to every router.
func (s *sim) evaluate() {
	if s.an == nil {
		return
	}
	ev := s.an.Evaluate(s.wall())
	for _, tr := range ev.Transitions {
		b := slices.Index(s.ids, tr.Backend)
		if tr.To == fleetwatch.StateOpen {
			s.m.open(b, s.now)
		}
		s.m.transition(b, tr.To, s.now)
	}
	if len(ev.Snapshots)+len(ev.Loads) > 0 {
		for i, be := range s.backends {
			s.loads[i] = float64(be.busy + be.waiting)
		}
		s.feed.publish(s.now, s.loads, len(ev.Snapshots) > 0)
	}
	for i := range ev.Snapshots {
		snap := s.withFleetLoad(&ev.Snapshots[i])
		if s.sc.JSONFeed {
			s.stallP95 = poolP95(snap)
		}
		s.deliver(snap, false)
	}
	for i := range ev.Loads {
		s.deliver(s.withFleetLoad(&ev.Loads[i]), true)
	}
}

// withFleetLoad returns a copy of the analyzer's snapshot with what the
// fleet-load feed adds (see fleetFeed): each backend's newest reported
// load (or its true load, for the exact variant), the routers counted, and
// the retry budget computed from them (none for the policies that keep the
// per-router budget). The analyzer of this tree does not fill these
// fields; the simulator computes them from the same events.
func (s *sim) withFleetLoad(in *fleetwatch.Snapshot) *fleetwatch.Snapshot {
	out := *in
	out.Backends = append([]fleetwatch.Backend(nil), in.Backends...)
	pp := pickerPolicies[s.policy]
	for i := range out.Backends {
		if b, ok := s.index[out.Backends[i].Backend]; ok {
			out.Backends[i].Load = s.feed.loadOf(b, pp.exact)
			if (pp.exact || pp.both) && s.scraped != nil { // the latest scrape instead
				ev := out.Backends[i].Load
				out.Backends[i].Load = nil
				if at := s.scrapedAt[b]; at >= 0 {
					out.Backends[i].Load = &fleetwatch.Load{Running: s.scraped[b], AgeMs: int64(s.now - at), Source: "metrics"}
				}
				// With both sources the newer report wins, as in the
				// analyzer (its ties go to the later report: here the
				// scrape).
				if sc := out.Backends[i].Load; pp.both && ev != nil && (sc == nil || ev.AgeMs < sc.AgeMs) {
					out.Backends[i].Load = ev
				}
			}
		}
	}
	out.Routers = s.feed.cur.routers
	out.RetryBudget = nil
	if !pp.localBudget {
		out.RetryBudget = analyzer.ComputeRetryBudget(out.Backends, s.capacity, s.feed.cur.ratePerSec,
			analyzer.RetryBudgetSettings{SpareFree: pp.spareFree})
	}
	return &out
}

// capacity is a backend's slots, for the retry budget's spare share.
func (s *sim) capacity(id string) float64 {
	if b, ok := s.index[id]; ok {
		return float64(s.backends[b].spec.Slots)
	}
	return 0
}

// budgetLimit is the most retries fleetwatch's budgets could allow in this
// run: per router, the ratio of its first attempts plus the floor over the
// run plus the initial second.
func budgetLimit(firstAttempts int, routers int, d time.Duration) float64 {
	return p2c.DefaultRetryRatio*float64(firstAttempts) +
		float64(routers)*p2c.DefaultRetryFloorPerSec*(d.Seconds()+1)
}
