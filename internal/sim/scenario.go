package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch/analyzer"
)

// Scenario is one simulated situation: a fleet, its traffic, its routers and
// what goes wrong.
type Scenario struct {
	Name        string
	Description string
	// Duration is the simulated time. Tests may shorten it (Shorten).
	Duration time.Duration
	// Routers is how many independent routers share the traffic, each with
	// its own policy instance and local view. If zero, 1 is used. The
	// command's --routers flag overrides it (1, 4, 16, 64 in
	// docs/EVALUATION.md).
	Routers int
	// FeedPeriod is how often the published loads reach the routers: the
	// compact feed's load beat (the snapshots every 1 s heartbeat, or
	// every period when it is longer), or with JSONFeed the heartbeat. If
	// zero, the analyzer's defaults (250 ms load beats, 1 s heartbeats);
	// the command's --feed-period flag sets it.
	FeedPeriod time.Duration
	// ScrapeInterval makes the exact-load policies (fl-load3-exact, fw-exact) and fw-both-loads read
	// each backend's load every ScrapeInterval, at a phase of its own,
	// and publish the latest read with its age, as serve's scrape does;
	// if zero they read every backend at every snapshot (a perfect
	// scrape). The command's --scrape-interval flag sets it.
	ScrapeInterval time.Duration
	// JSONFeed makes the routers follow the JSON snapshots alone
	// (route.feed: json, and every third-party router) instead of the
	// compact feed (compactfeed.go): a snapshot every heartbeat and
	// decision change, no load beats. The command's --feed json sets it.
	JSONFeed bool
	Backends []BackendSpec
	Workload Workload
	// Trace, when set, replaces Workload: its requests arrive at their
	// times divided by TraceSpeed (1 if zero), each at a router drawn
	// uniformly, with its prompt's KV blocks when the trace has them
	// (trace.go, fleetwatch sim --trace).
	Trace      *Trace
	TraceSpeed float64
	// Incidents change backends' behaviour over time.
	Incidents []Incident
	// Retries is how many times a client retries a failed attempt on
	// another backend (0: never).
	Retries int
	// ClientTimeout fails an attempt with no first token after this long.
	// If zero, 30s is used.
	ClientTimeout time.Duration
	// StallFloor and StallMultiple are the first-token deadline of the
	// routers that follow the feed (feed/route's, stall.go): an attempt
	// without a first token after max(StallFloor, StallMultiple x the
	// pool's p95 TTFT in the latest snapshot) ends as stalled. If zero, 10s
	// and 4 (route's defaults); a negative StallFloor turns it off (the
	// router before the deadline). The command's --stall-floor sets it.
	StallFloor    time.Duration
	StallMultiple float64
	// Policies are the policies compared. If empty, StandardPolicies.
	Policies []string
	// Watch names a backend whose share of attempts between WatchFrom and
	// WatchTo is reported as Result.WatchShare (the broken host of an
	// incident); "" for none.
	Watch              string
	WatchFrom, WatchTo time.Duration
	// Analyzer overrides the analyzer's settings (zero fields: the
	// defaults, as in production).
	Analyzer analyzer.Settings
	// Quiet names a low-traffic backend whose ejections (breaker opened,
	// LiteLLM cooldown) are counted in Result.Ejections.
	Quiet string
}

// BackendSpec is one simulated inference server with continuous batching:
// up to Slots sequences decode together, more wait in a queue, and a full
// queue answers 429. Time to first token is the queue wait plus prefill
// (which grows with the prompt tokens not found in the prefix cache); decode
// time grows with the output tokens and, mildly, with the batch occupancy.
type BackendSpec struct {
	ID string
	// Slots is the concurrency limit. If zero, 8 is used.
	Slots int
	// Queue is how many requests may wait for a slot; one more is answered
	// a bare 429 (no retry hint: a full queue, not a quota). If zero, 4 x
	// Slots is used.
	Queue int
	// PrefillBaseMs is the fixed part of prefill. If zero, 20 is used.
	PrefillBaseMs float64
	// PrefillPerTokenMs is the prefill time per uncached prompt token. If
	// zero, 0.1 is used.
	PrefillPerTokenMs float64
	// DecodePerTokenMs is the time per generated token at an empty batch.
	// If zero, 10 is used.
	DecodePerTokenMs float64
	// BatchPenalty slows decode by (1 + BatchPenalty x busy/Slots). If
	// zero, 0.5 is used.
	BatchPenalty float64
	// PrefillBatchPenalty slows a new request's prefill by (1 +
	// PrefillBatchPenalty x the other busy slots / Slots): a server that
	// runs its decodes and a new prompt's prefill in the same steps
	// (vLLM's chunked prefill). Zero (the default model) starts a prompt
	// at full speed whatever the slots decode.
	PrefillBatchPenalty float64
	// Speed multiplies every time (2: twice as slow). If zero, 1 is used.
	Speed float64
	// CacheSize is the number of prefixes the prefix cache (LRU) holds. If
	// zero, 16 is used.
	CacheSize int
	// KVBlocks is the capacity, in blocks of BlockTokens tokens, of the
	// backend's KV prefix cache (kvcache.go), used for requests that carry
	// their prompt's blocks (a trace's); 0 for none. See
	// docs/EVALUATION.md, "Real traces", for the sizing.
	KVBlocks int
	// ColdMs is the extra time of the first request after ColdIdle without
	// requests (scale to zero), and of the very first one when StartsCold.
	ColdMs     float64
	ColdIdle   time.Duration // if zero, 60s is used
	StartsCold bool
	// Priority is the backend's failover priority.
	Priority int
}

func (b BackendSpec) withDefaults() BackendSpec {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if b.Slots == 0 {
		b.Slots = 8
	}
	if b.Queue == 0 {
		b.Queue = 4 * b.Slots
	}
	def(&b.PrefillBaseMs, 20)
	def(&b.PrefillPerTokenMs, 0.1)
	def(&b.DecodePerTokenMs, 10)
	def(&b.BatchPenalty, 0.5)
	def(&b.Speed, 1)
	if b.CacheSize == 0 {
		b.CacheSize = 16
	}
	if b.ColdIdle == 0 {
		b.ColdIdle = time.Minute
	}
	return b
}

// Workload is the traffic: arrivals and request sizes.
type Workload struct {
	// RatePerSec is the mean arrival rate (Poisson).
	RatePerSec float64
	// Bursty modulates the rate: BurstFactor x the rate for BurstOn, then
	// a rate that keeps the mean for BurstOff (a two-state MMPP).
	Bursty      bool
	BurstFactor float64       // if zero, 3 is used
	BurstOn     time.Duration // if zero, 5s is used
	BurstOff    time.Duration // if zero, 15s is used
	// PromptTokens and OutputTokens are log-normal with these medians and
	// log-space sigmas, clamped to [Min, Max]: heavy-tailed over two to
	// three orders of magnitude.
	PromptTokens Dist
	OutputTokens Dist
	// Prefixes is the number of distinct shared prefixes (system prompts),
	// equally popular; 0 for none. Each is PrefixTokens long and part of
	// the prompt.
	Prefixes     int
	PrefixTokens int
}

// Dist is a clamped log-normal distribution.
type Dist struct {
	Median, Sigma, Min, Max float64
}

// IncidentKind is what goes wrong with a backend.
type IncidentKind int

// Incident kinds.
const (
	// FailFast answers 500 at once (the fast-failure trap), for a share
	// Rate of requests (1 if zero), or only Count requests when Count > 0.
	FailFast IncidentKind = iota + 1
	// Stall accepts requests and never answers; clients time out.
	Stall
	// Throttle answers 429 at once, with a retry hint (a quota), for a
	// share Rate of requests (or Count requests).
	Throttle
	// Slow multiplies the backend's times by Factor, reached linearly over
	// Ramp from From (a slow degradation when Ramp > 0).
	Slow
	// Drift changes the backend's artefact at From; the drift probe
	// detects it at To and the analyzer quarantines it (weight 0).
	Drift
	// Fast multiplies the backend's times by Factor < 1 from From (a
	// backend that becomes fast).
	Fast
	// ClientErrors answers Status (a 4xx; 404 if zero) at once for a share
	// Rate of requests (1 if zero), or only Count requests: a replica
	// serving another model, a revoked key, or, on every backend at once,
	// a flood of bad requests.
	ClientErrors
	// BareThrottle answers 429 at once without a retry hint, for a share
	// Rate of requests (1 if zero), or only Count requests: a server whose
	// admission limit refuses everything (text-generation-inference's
	// max_concurrent_requests, held by other clients), which the analyzer
	// never opens by default (analyzer.throttle_rate_counts: hinted) and
	// only down-weights.
	BareThrottle
)

func (k IncidentKind) String() string {
	switch k {
	case FailFast:
		return "fail-fast"
	case Stall:
		return "stall"
	case Throttle:
		return "throttle"
	case Slow:
		return "slow"
	case Drift:
		return "drift"
	case Fast:
		return "fast"
	case ClientErrors:
		return "client-errors"
	case BareThrottle:
		return "bare-throttle"
	}
	return "unknown"
}

// Incident is one change of a backend's behaviour between From and To (To
// zero: until the end).
type Incident struct {
	Backend  string
	Kind     IncidentKind
	From, To time.Duration
	Rate     float64
	Count    int
	Factor   float64
	Ramp     time.Duration
	Status   int // the answer of ClientErrors
}

func (in *Incident) active(t time.Duration) bool {
	return t >= in.From && (in.To == 0 || t < in.To)
}

// speedFactor is the Slow/Fast multiplier at t.
func (in *Incident) speedFactor(t time.Duration) float64 {
	if !in.active(t) {
		return 1
	}
	if in.Ramp > 0 && t < in.From+in.Ramp {
		frac := float64(t-in.From) / float64(in.Ramp)
		return 1 + (in.Factor-1)*frac
	}
	return in.Factor
}

// Shorten returns a copy of s running for d instead, with every incident
// time scaled by the same ratio. Tests use it to stay fast with the same
// code as the command.
// Scaled returns the scenario over k times its fleet at k times its rate:
// each backend gets k-1 copies (IDs "b0-1", "b0-2", ...; the original
// keeps its ID, so the scenario's incident, watched and quiet backend stay
// one backend). Incidents that name every backend (a fleet-wide incident:
// retry-storm, overload, bad-request-flood) are copied to the copies as
// well. The routers and the workload's shape are unchanged: the same
// traffic per backend over a larger pool. k <= 1, and a trace replay
// (whose fleet is its own), return s unchanged.
func (s Scenario) Scaled(k int) Scenario {
	if k <= 1 || s.Trace != nil {
		return s
	}
	named := map[string]bool{}
	for _, in := range s.Incidents {
		named[in.Backend] = true
	}
	fleetWide := len(s.Incidents) > 0
	for _, b := range s.Backends {
		fleetWide = fleetWide && named[b.ID]
	}
	orig := s.Backends
	s.Backends = slices.Clone(orig)
	s.Incidents = slices.Clone(s.Incidents)
	n := len(s.Incidents)
	for c := 1; c < k; c++ {
		for _, b := range orig {
			id := b.ID
			b.ID = fmt.Sprintf("%s-%d", id, c)
			s.Backends = append(s.Backends, b)
			if !fleetWide {
				continue
			}
			for _, in := range s.Incidents[:n] {
				if in.Backend == id {
					in.Backend = b.ID
					s.Incidents = append(s.Incidents, in)
				}
			}
		}
	}
	s.Workload.RatePerSec *= float64(k)
	return s
}

// WithPrefillBatchPenalty returns the scenario with every backend's
// PrefillBatchPenalty set to k (k <= 0: s unchanged).
func (s Scenario) WithPrefillBatchPenalty(k float64) Scenario {
	if k <= 0 {
		return s
	}
	s.Backends = slices.Clone(s.Backends)
	for i := range s.Backends {
		s.Backends[i].PrefillBatchPenalty = k
	}
	s.Description += fmt.Sprintf("; prefill slowed by 1 + %g x busy/slots", k)
	return s
}

// WithIncidentRate returns s with every FailFast, Throttle, BareThrottle
// and ClientErrors incident answering only the share rate of the
// backend's requests (a Count incident keeps its count); rate <= 0
// returns s unchanged. `fleetwatch sim --incident-rate` sets it: a backend
// that refuses part of its requests instead of all.
func (s Scenario) WithIncidentRate(rate float64) Scenario {
	if rate <= 0 {
		return s
	}
	s.Incidents = slices.Clone(s.Incidents)
	for i := range s.Incidents {
		in := &s.Incidents[i]
		switch in.Kind {
		case FailFast, Throttle, BareThrottle, ClientErrors:
			if in.Count == 0 {
				in.Rate = rate
			}
		}
	}
	s.Description += fmt.Sprintf("; incidents answer %g of the requests", rate)
	return s
}

func (s Scenario) Shorten(d time.Duration) Scenario {
	if d <= 0 || d >= s.Duration {
		return s
	}
	ratio := float64(d) / float64(s.Duration)
	scale := func(t time.Duration) time.Duration { return time.Duration(float64(t) * ratio) }
	s.Duration = d
	s.Incidents = append([]Incident(nil), s.Incidents...)
	for i := range s.Incidents {
		in := &s.Incidents[i]
		in.From, in.To, in.Ramp = scale(in.From), scale(in.To), scale(in.Ramp)
	}
	s.WatchFrom, s.WatchTo = scale(s.WatchFrom), scale(s.WatchTo)
	return s
}
