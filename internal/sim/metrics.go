package sim

import (
	"errors"
	"math"
	"slices"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// Result is what one run measured.
type Result struct {
	Scenario string
	Policy   string
	Seed     uint64
	Backends []string

	Requests  int // client requests
	Failed    int // requests that did not succeed (after any retries)
	Attempts  int // attempts sent to backends
	Retries   int // attempts after the first
	Shed      int // requests refused by the picker (shed, no backend)
	Refused   int // retries refused by the retry budget
	ErrorRate float64

	// Client TTFT of successful requests (arrival to first token,
	// retries included), ms.
	TTFTP50, TTFTP95, TTFTP99 float64

	// WatchShare is the share of attempts sent to the scenario's watched
	// backend in its watch window; NaN without one.
	WatchShare float64
	// Imbalance is max/mean backend occupancy (running + waiting),
	// averaged over samples every 250 ms; ImbalanceP95 its 95th
	// percentile. MaxMinP95 is the 95th percentile of max/min occupancy
	// (min floored at 1): "one backend N times as loaded as another".
	Imbalance, ImbalanceP95, MaxMinP95 float64
	// CacheHitRate is the share of started prefixed attempts that hit the
	// backend's prefix cache; NaN without prefixes.
	CacheHitRate float64
	// TokenHitRate is the share of the started attempts' prompt tokens
	// served from a prefix cache (the prompt-token cache hit rate); NaN
	// when no attempt started.
	TokenHitRate float64
	// RetriesPerRequest and AttemptsPerRequest measure retry load.
	RetriesPerRequest, AttemptsPerRequest float64
	// WindowAttemptsPerRequest is attempts sent during the watch window
	// per request arriving in it: the load multiplier of an incident.
	WindowAttemptsPerRequest float64
	// BudgetLimit is the most retries fleetwatch's budgets allow for this
	// run's first attempts (20% plus 3/s per router).
	BudgetLimit float64
	// Oscillation is the standard deviation over seconds of a backend's
	// share of the attempts of each second, averaged over backends: 0 for
	// steady shares; about 0.43 for a pool of 4 whose traffic goes all to
	// one backend, then all to another. Sampling noise alone gives a few
	// hundredths at these rates.
	Oscillation float64
	// Ejections counts how often the scenario's quiet backend was taken
	// out: breaker opened (feed policies) or cooled down (litellm).
	Ejections int
	// Opens counts the analyzer's breaker openings over all backends (feed
	// policies): in a steady-state scenario every one is a false trip.
	Opens int
	// WatchOpenMs is the time from WatchFrom to the first opening of the
	// watched backend's breaker at or after it (time to detect); NaN when
	// it never opened.
	WatchOpenMs float64
	// DetectedShare is WatchShare from that first opening on (to
	// WatchTo): what the watched backend gets once detected, its half-open
	// trickles included; NaN when it never opened.
	DetectedShare float64
	// HalfOpenHits of the HalfOpenAttempts sent while the analyzer had
	// the watched backend half-open (from WatchFrom to WatchTo, over
	// HalfOpens such periods) went to it: the trickle. Pool them over
	// runs (a period ends at its first failure, so a period's own ratio
	// is biased up).
	HalfOpenHits, HalfOpenAttempts, HalfOpens int
	// FeedBytes and FeedFrames are the compact feed's frames (their
	// payload bytes, no NATS framing) each router received over the run;
	// 0 with Scenario.JSONFeed and for policies that follow no feed.
	FeedBytes, FeedFrames int64
	// Shares[t][b] is backend b's share of the attempts of second t.
	Shares [][]float64
	// Events is the number of simulated events processed.
	Events int64
}

// metrics accumulates a run's measurements.
type metrics struct {
	n            int
	requests     int
	failed       int
	attempts     int
	retries      int
	shed         int
	refusedRetry int
	ttfts        []float64
	perSecond    [][]int // [second][backend] attempts
	watchIdx     int
	watchFrom    float64
	watchTo      float64
	watchHits    int
	watchTotal   int
	windowReqs   int
	imbalance    []float64
	maxMin       []float64
	prefixStarts int
	cacheHits    int
	promptTokens int64 // of started attempts
	cachedTokens int64 // of those, served from a prefix cache
	opened       []int
	watchOpenMs  float64 // -1 until the watched backend opens in the window
	// From the watched backend's first opening in the window: attempts,
	// and those sent to it.
	detectedHits, detectedTotal int
	// While the analyzer has the watched backend half-open (from
	// watchFrom): attempts, those sent to it, and the periods.
	watchHalfOpen       bool
	halfHits, halfTotal int
	halfOpens           int
	quietIdx            int
}

func (m *metrics) init(s *sim) {
	m.n = len(s.ids)
	m.watchIdx = slices.Index(s.ids, s.sc.Watch)
	m.watchFrom, m.watchTo = ms(s.sc.WatchFrom), ms(s.sc.WatchTo)
	if m.watchTo == 0 {
		m.watchTo = s.end
	}
	m.quietIdx = slices.Index(s.ids, s.sc.Quiet)
	m.opened = make([]int, m.n)
	m.watchOpenMs = -1
	m.perSecond = make([][]int, int(s.end/1000)+1)
}

func (m *metrics) attempt(s *sim, b int) {
	m.attempts++
	sec := int(s.now / 1000)
	if sec < len(m.perSecond) {
		if m.perSecond[sec] == nil {
			m.perSecond[sec] = make([]int, m.n)
		}
		m.perSecond[sec][b]++
	}
	if s.now >= m.watchFrom && s.now < m.watchTo {
		m.watchTotal++
		if b == m.watchIdx {
			m.watchHits++
		}
		if m.watchOpenMs >= 0 {
			m.detectedTotal++
			if b == m.watchIdx {
				m.detectedHits++
			}
		}
		if m.watchHalfOpen {
			m.halfTotal++
			if b == m.watchIdx {
				m.halfHits++
			}
		}
	}
}

// transition records the analyzer's transition of backend b to state at
// now (the watched backend's half-open periods).
func (m *metrics) transition(b int, to fleetwatch.State, now float64) {
	if b < 0 || b != m.watchIdx {
		return
	}
	m.watchHalfOpen = to == fleetwatch.StateHalfOpen
	if m.watchHalfOpen && now >= m.watchFrom && now < m.watchTo {
		m.halfOpens++
	}
}

// open records a breaker opening of backend b at now.
func (m *metrics) open(b int, now float64) {
	if b < 0 {
		return
	}
	m.opened[b]++
	if b == m.watchIdx && m.watchOpenMs < 0 && now >= m.watchFrom {
		m.watchOpenMs = now - m.watchFrom
	}
}

func (m *metrics) refused(err error) {
	if errors.Is(err, p2c.ErrRetryBudget) {
		m.refusedRetry++
		return
	}
	m.shed++
}

func (m *metrics) success(ttft float64) { m.ttfts = append(m.ttfts, ttft) }

func (m *metrics) sample(s *sim) {
	sum, hi, lo := 0, 0, math.MaxInt
	for _, be := range s.backends {
		occ := be.busy + be.waiting
		sum += occ
		hi = max(hi, occ)
		lo = min(lo, occ)
	}
	if sum == 0 {
		return
	}
	mean := float64(sum) / float64(len(s.backends))
	m.imbalance = append(m.imbalance, float64(hi)/mean)
	m.maxMin = append(m.maxMin, float64(hi)/float64(max(lo, 1)))
}

func (s *sim) result(seed uint64) *Result {
	m := &s.m
	r := &Result{
		Scenario: s.sc.Name, Policy: s.policy, Seed: seed,
		Backends: s.ids,
		Requests: m.requests, Failed: m.failed, Attempts: m.attempts,
		Retries: m.retries, Shed: m.shed, Refused: m.refusedRetry,
		WatchShare: math.NaN(), CacheHitRate: math.NaN(), WatchOpenMs: math.NaN(),
		DetectedShare: math.NaN(), HalfOpenHits: m.halfHits, HalfOpenAttempts: m.halfTotal, HalfOpens: m.halfOpens,
		Events: s.events, FeedBytes: s.feedBytes, FeedFrames: s.feedFrames,
	}
	if m.requests > 0 {
		r.ErrorRate = float64(m.failed) / float64(m.requests)
		r.RetriesPerRequest = float64(m.retries) / float64(m.requests)
		r.AttemptsPerRequest = float64(m.attempts) / float64(m.requests)
	}
	r.BudgetLimit = budgetLimit(m.requests, len(s.routers), s.sc.Duration)
	slices.Sort(m.ttfts)
	r.TTFTP50, r.TTFTP95, r.TTFTP99 = quantile(m.ttfts, 0.50), quantile(m.ttfts, 0.95), quantile(m.ttfts, 0.99)
	if m.watchIdx >= 0 && m.watchTotal > 0 {
		r.WatchShare = float64(m.watchHits) / float64(m.watchTotal)
	}
	if m.windowReqs > 0 {
		r.WindowAttemptsPerRequest = float64(m.watchTotal) / float64(m.windowReqs)
	}
	r.Imbalance = mean(m.imbalance)
	slices.Sort(m.imbalance)
	r.ImbalanceP95 = quantile(m.imbalance, 0.95)
	slices.Sort(m.maxMin)
	r.MaxMinP95 = quantile(m.maxMin, 0.95)
	r.TokenHitRate = math.NaN()
	if m.promptTokens > 0 {
		r.TokenHitRate = float64(m.cachedTokens) / float64(m.promptTokens)
	}
	if m.prefixStarts > 0 {
		r.CacheHitRate = float64(m.cacheHits) / float64(m.prefixStarts)
	}
	r.Shares = make([][]float64, len(m.perSecond))
	perBackend := make([][]float64, m.n)
	for t, counts := range m.perSecond {
		share := make([]float64, m.n)
		total := 0
		for _, c := range counts {
			total += c
		}
		if total > 0 {
			for b, c := range counts {
				share[b] = float64(c) / float64(total)
				perBackend[b] = append(perBackend[b], share[b])
			}
		}
		r.Shares[t] = share
	}
	sum := 0.0
	for _, v := range perBackend {
		sum += stddev(v)
	}
	r.Oscillation = sum / float64(m.n)
	for _, n := range m.opened {
		r.Opens += n
	}
	if m.watchOpenMs >= 0 {
		r.WatchOpenMs = m.watchOpenMs
	}
	if m.detectedTotal > 0 {
		r.DetectedShare = float64(m.detectedHits) / float64(m.detectedTotal)
	}
	if m.quietIdx >= 0 {
		r.Ejections = m.opened[m.quietIdx]
		for _, rt := range s.routers {
			if l, ok := rt.(*liteLLM); ok {
				r.Ejections += l.cooldowns[m.quietIdx]
			}
		}
	}
	return r
}

// quantile is the nearest-rank quantile of sorted values; NaN when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

func stddev(v []float64) float64 {
	if len(v) < 2 {
		return 0
	}
	m := mean(v)
	sum := 0.0
	for _, x := range v {
		sum += (x - m) * (x - m)
	}
	return math.Sqrt(sum / float64(len(v)))
}
