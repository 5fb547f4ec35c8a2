package fleetwatch

import "time"

// State is a backend's circuit-breaker state.
type State string

// Breaker states.
const (
	StateClosed   State = "closed"    // healthy
	StateOpen     State = "open"      // send nothing
	StateHalfOpen State = "half_open" // send a trickle, set by the weight
)

// Mode is how a router spreads a pool's traffic.
type Mode string

// Pool modes.
const (
	// ModeBalance spreads traffic by weight and score.
	ModeBalance Mode = "balance"
	// ModeFailover uses the lowest priority number that has a backend not
	// open, spreading only among equal priorities.
	ModeFailover Mode = "failover"
)

// AllOpen is what a router does when every backend of a pool is open.
type AllOpen string

// All-open policies.
const (
	AllOpenShed   AllOpen = "shed"   // fail fast, do not spin
	AllOpenSpread AllOpen = "spread" // ignore the breakers
)

// DriftStatus is a backend's artefact-drift status.
type DriftStatus string

// Drift statuses.
const (
	DriftUnknown DriftStatus = "unknown" // never probed
	DriftOK      DriftStatus = "ok"
	DriftSuspect DriftStatus = "suspect"
	DriftDrifted DriftStatus = "drifted"
)

// DefaultAffinityTolerance is the seed's affinity rule: keep a request on the
// backend holding its prefix while that backend's EWMA TTFT is below this
// multiple of the pool median. It is a policy choice (how much latency a cache
// hit is worth), not a discovered constant.
const DefaultAffinityTolerance = 2.5

// Snapshot is the full decision state of one pool, published on
// fw.decisions.<pool> and kept in the fw_decisions KV bucket.
type Snapshot struct {
	V       int     `json:"v"`
	Pool    string  `json:"pool"`
	Epoch   string  `json:"epoch"` // the analyzer instance that produced it
	Seq     uint64  `json:"seq"`   // +1 per snapshot within an epoch
	At      Time    `json:"at"`
	TTLMs   int64   `json:"ttl_ms"` // stale after At + TTLMs
	Mode    Mode    `json:"mode"`
	AllOpen AllOpen `json:"all_open"`
	// MedianEWMATTFTMs is the median ewma_ttft_ms over backends that have
	// one; nil when none has.
	MedianEWMATTFTMs  *float64  `json:"median_ewma_ttft_ms"`
	AffinityTolerance float64   `json:"affinity_tolerance"`
	Backends          []Backend `json:"backends"` // sorted by Backend

	// Truncated is true when the publisher left backends out because the
	// encoded snapshot exceeded the NATS server's max_payload (an
	// extension: omitted when false). It keeps open and half_open
	// backends first, then configured ones, then the busiest.
	Truncated bool `json:"truncated,omitempty"`
	// BackendsTotal is the pool's number of backends before truncation;
	// set only when Truncated (an extension).
	BackendsTotal int `json:"backends_total,omitempty"`

	// Routers is the number of distinct event sources that reported
	// outcomes for this pool in the window: an estimate of how many
	// routers share it, which a load-aware picker scales its own
	// in-flight change by (an extension, omitted when 0).
	Routers int `json:"routers,omitempty"`

	// RetryBudget is the pool's fleet-wide retry budget (an extension,
	// omitted when nil; see RetryBudget and analyzer.ComputeRetryBudget).
	RetryBudget *RetryBudget `json:"retry_budget,omitempty"`

	// Fence is the revision of the lease under which the publishing
	// instance owns the pool's partition (an extension for high
	// availability: omitted when 0, which a single instance without
	// JetStream publishes). A new owner's lease has a higher revision than
	// any earlier owner's, so a router drops a snapshot whose fence is
	// lower than the highest it has seen for the pool: a stale owner that
	// has not yet noticed it lost its lease cannot override the new one.
	Fence uint64 `json:"fence,omitempty"`

	// Shadow marks the decisions advisory (an extension, omitted when
	// off; see Shadow): a router that knows it follows only the breakers
	// ("breakers") or nothing ("observe") and counts what it would have
	// done differently; one that does not know it follows the decisions.
	Shadow Shadow `json:"shadow,omitempty"`
}

// Load is a backend's most recent load report (an extension of the
// protocol): how many requests it was running and queueing, and how full
// its KV cache was, as of AgeMs before the snapshot's At.
type Load struct {
	Running float64 `json:"running"` // requests running, >= 0
	Waiting float64 `json:"waiting"` // requests waiting in the backend's queue, >= 0
	// KVCacheUsage is the fraction of the KV cache in use, in [0, 1]; nil
	// when the report did not carry it.
	KVCacheUsage *float64 `json:"kv_cache_usage,omitempty"`
	// AgeMs is how old the report was when the snapshot was taken, >= 0.
	AgeMs int64 `json:"age_ms"`
	// Source names where the report came from: "event" (an outcome event's
	// load fields, for example copied from an ORCA header by a router) or
	// "metrics" (fleetwatch read the backend's Prometheus metrics).
	Source string `json:"source"`
}

// Load sources, Load.Source's values.
const (
	LoadSourceEvent   = "event"   // an outcome event's load fields
	LoadSourceMetrics = "metrics" // fleetwatch read the backend's metrics
)

// ManyRouters is the router count (Snapshot.Routers) beyond which a pool
// is shared by many routers: the picker's default choices drop from 3 to 2.
const ManyRouters = 16

// Total is the load a picker ranks by: requests running plus waiting.
func (l *Load) Total() float64 { return l.Running + l.Waiting }

// Backend is the decision for one backend of a pool.
type Backend struct {
	Backend  string  `json:"backend"`
	State    State   `json:"state"`
	Weight   float64 `json:"weight"` // in [0, 1]
	Priority int     `json:"priority"`

	EWMATTFTMs  *float64 `json:"ewma_ttft_ms"` // nil when no sample yet
	P50TTFTMs   *float64 `json:"p50_ttft_ms"`  // over the window; nil when empty
	P95TTFTMs   *float64 `json:"p95_ttft_ms"`
	SuccessRate *float64 `json:"success_rate"` // ok / (ok + error + timeout)
	Rate429     *float64 `json:"rate_429"`     // throttled / (ok + error + timeout + throttled)
	Requests    int64    `json:"requests"`     // all outcomes in the window
	WindowMs    int64    `json:"window_ms"`

	OpenUntil   *Time       `json:"open_until"` // nil unless open
	Reason      string      `json:"reason"`
	Drift       DriftStatus `json:"drift"`
	CostPerMTok *float64    `json:"cost_per_mtok"`

	// Since is when the backend entered its current state (an extension
	// of the protocol, omitted when unknown).
	Since *Time `json:"since,omitempty"`
	// Trips counts the consecutive times the breaker opened since the
	// backend last closed; the open time grows with it (an extension of
	// the protocol, omitted when 0). A restarted analyzer restores it.
	Trips int `json:"trips,omitempty"`
	// Load is the backend's most recent load report; nil when none is
	// fresh enough to publish (an extension, omitted when nil).
	Load *Load `json:"load,omitempty"`
	// P50TPOTMs and P95TPOTMs are the median and p95 time per output
	// token over the window, in ms: (duration_ms - ttft_ms) /
	// (output_tokens - 1) of the ok, non-cold events with both times and
	// at least two output tokens (an extension, omitted when the window
	// has no such event). Informational: no breaker rule reads them.
	P50TPOTMs *float64 `json:"p50_tpot_ms,omitempty"`
	P95TPOTMs *float64 `json:"p95_tpot_ms,omitempty"`
	// Override is the operator override in force on the backend, which
	// the published state and weight already reflect (an extension,
	// omitted when none).
	Override *Override `json:"override,omitempty"`
	// QuotaUntil is set on an open backend that is out of quota: its
	// provider said (quota_reset_ms) that it resets then, and open_until is
	// that time (an extension, omitted when none; docs/PROTOCOL.md
	// "Quotas and sheds").
	QuotaUntil *Time `json:"quota_until,omitempty"`
}

// Find returns the decision for backend id, or nil.
func (s *Snapshot) Find(id string) *Backend {
	for i := range s.Backends {
		if s.Backends[i].Backend == id {
			return &s.Backends[i]
		}
	}
	return nil
}

// NewerThan reports whether s should replace prev at a router: prev is nil;
// or, when both carry a fence and the fences differ, s.Fence > prev.Fence;
// or, within one epoch, s.Seq > prev.Seq; or, across epochs, s.At is not
// before prev.At. A different epoch is a restarted or failed-over analyzer
// whose seq starts again, so seq says nothing across epochs and the
// snapshot replaces the old one when it is at least as recent; a late
// snapshot of an older epoch is dropped. A higher fence is a newer owner
// of the pool's partition, whatever the clocks say; a lower one is a stale
// owner, dropped however recent its at.
func (s *Snapshot) NewerThan(prev *Snapshot) bool {
	if prev == nil {
		return true
	}
	if s.Fence != 0 && prev.Fence != 0 && s.Fence != prev.Fence {
		return s.Fence > prev.Fence
	}
	if s.Epoch == prev.Epoch {
		return s.Seq > prev.Seq
	}
	return !s.At.Before(prev.At.Time)
}

// DefaultSnapshotTTL is how long a snapshot without ttl_ms (0) stays
// fresh: the analyzer's default ttl (PROTOCOL.md, fleetwatch's choice for
// a zero ttl_ms).
const DefaultSnapshotTTL = 5 * time.Second

// StaleAt is when s goes stale: at + ttl_ms, or at + DefaultSnapshotTTL
// when ttl_ms is 0. The one staleness rule of the feed watcher, the picker
// and fleetwatch watch.
func (s *Snapshot) StaleAt() time.Time {
	ttl := time.Duration(s.TTLMs) * time.Millisecond
	if ttl <= 0 {
		ttl = DefaultSnapshotTTL
	}
	return s.At.Add(ttl)
}

// Stale reports whether s is stale at now (after StaleAt). A nil snapshot
// is stale.
func (s *Snapshot) Stale(now time.Time) bool {
	return s == nil || now.After(s.StaleAt())
}
