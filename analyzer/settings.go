package analyzer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Sentinel errors. Validation errors are *SettingError values that wrap one
// of them, so callers branch with errors.Is.
var (
	// ErrInvalidSettings is wrapped by every error about a Settings field.
	ErrInvalidSettings = errors.New("analyzer: invalid settings")
	// ErrInvalidConfig is wrapped by every error about a pool or backend of
	// the Config.
	ErrInvalidConfig = errors.New("analyzer: invalid config")
)

// SettingError names the configuration key that is wrong, its value and why,
// in the style of the YAML file: "analyzer.window = -5s: must be > 0".
type SettingError struct {
	Key     string // the YAML path, for example "analyzer.window" or "pools[2].analyzer.min_requests"
	Value   string // the offending value as written
	Problem string // what it must be
	Err     error  // ErrInvalidSettings or ErrInvalidConfig
}

func (e *SettingError) Error() string {
	return fmt.Sprintf("%s = %s: %s", e.Key, e.Value, e.Problem)
}

// Unwrap returns the sentinel error.
func (e *SettingError) Unwrap() error { return e.Err }

// The values of Settings.ThrottledRunCounts and ThrottleRateCounts.
const (
	RunCountsHinted = "hinted" // 429s with a retry hint
	RunCountsAll    = "all"    // every 429
)

// Defaults of DESIGN.md "Configuration", analyzer block.
const (
	DefaultWindow               = 30 * time.Second
	DefaultBucket               = time.Second
	DefaultMinRequests          = 20
	DefaultFailureRate          = 0.5
	DefaultConsecutiveFailures  = 5
	DefaultConsecutiveStalls    = 2
	DefaultConsecutiveThrottled = 5
	DefaultThrottleRate         = 0.5
	DefaultSlowFactor           = 5.0
	DefaultEWMAAlpha            = 0.2
	DefaultIdleGap              = 5 * time.Minute
	DefaultOpenBase             = 30 * time.Second
	DefaultOpenMax              = 5 * time.Minute
	DefaultHalfOpenWeight       = 0.05
	DefaultHalfOpenSuccesses    = 5
	DefaultMaxOpenFraction      = 0.5
	DefaultHeartbeat            = time.Second
	// DefaultLoadBeat is Settings.LoadBeat's default.
	DefaultLoadBeat           = 250 * time.Millisecond
	DefaultTTL                = 5 * time.Second
	DefaultExpiry             = 10 * time.Minute
	DefaultMaxWeightStep      = 0.25
	DefaultOpenJitter         = 0.1
	DefaultThrottledRunCounts = RunCountsHinted
	DefaultThrottleRateCounts = RunCountsHinted
	DefaultThrottleRefuseRate = 0.9
	DefaultRecentMinRequests  = 10
	DefaultPoolThrottleHold   = 0.25
	DefaultLoadMaxAge         = 3 * time.Second
	DefaultClientErrorRate    = 0.5
	DefaultClientErrorMargin  = 0.4
)

// maxBucketsPerWindow bounds Window/Bucket so that a typo cannot allocate a
// million buckets per backend.
const maxBucketsPerWindow = 3600

// Settings are the analyzer rules' parameters (DESIGN.md "Configuration",
// the analyzer block). The zero value works: every zero field takes its
// default, applied by WithDefaults inside New. A pool's Settings override
// the global ones field by field (Override).
type Settings struct {
	// Window is the sliding window of the rates and quantiles. If zero, 30s
	// is used. It must be a multiple of Bucket.
	Window time.Duration
	// Bucket is the granularity of the window. If zero, 1s is used.
	Bucket time.Duration
	// MinRequests is how many counted requests (ok, error, timeout,
	// throttled) the window must hold before a rate-based rule may open a
	// breaker. If zero, 20 is used.
	MinRequests int
	// FailureRate opens a breaker when failures / (ok + failures) >= it. If
	// zero, 0.5 is used.
	FailureRate float64
	// ConsecutiveFailures opens a breaker after this many failures in a
	// row, at any volume. If zero, 5 is used.
	ConsecutiveFailures int
	// ConsecutiveStalls opens a breaker after this many stalled outcomes
	// in one run of failures (an ok ends the run), at any volume: a
	// router's first-token deadline is at least 4 x the slowest healthy
	// backend's p95 TTFT and 10 s, so a stall is stronger evidence than an
	// error, and each one costs its client the whole deadline. If zero, 2
	// is used; it only ever opens sooner than ConsecutiveFailures.
	ConsecutiveStalls int
	// ConsecutiveThrottled, when positive, opens a breaker ("throttled")
	// after this many 429s in a row that carry a retry hint (retry_after_ms
	// > 0; see ThrottledRunCounts) once the backend has MinRequests counted
	// requests, unless a peer answered 429s over the newest two buckets (at
	// least PoolThrottleHold/5 of its requests). An ok or a 429 without a
	// hint ends the run; errors and client errors neither end nor extend
	// it. One backend out of quota is out at once instead of after the
	// newest quarter fills with requests, which at a few requests per
	// second per backend takes seconds. Only hinted 429s count by default
	// because they are the two kinds a pool sees: a quota (hosted APIs
	// send Retry-After, retry-after-ms or x-ratelimit-reset-* with it) and
	// a full queue (an inference server's admission limit, such as text-
	// generation-inference's max_concurrent_requests, answers a bare 429).
	// At the start of a pool-wide overload the first backends whose queues
	// fill answer runs of bare 429s before any peer does; counting those
	// opened 0-6 backends per seed in the simulator's overload
	// (docs/EVALUATION.md "The 429 breaker"). If zero, 5 is used; a negative
	// value turns the rule off.
	ConsecutiveThrottled int
	// ThrottledRunCounts says which 429s make the run of
	// ConsecutiveThrottled: RunCountsHinted (those with a retry hint; a
	// bare 429 ends the run) or RunCountsAll (every 429, for pools whose
	// 429s are always quotas but whose events carry no hint, such as
	// access logs). If empty, RunCountsHinted is used.
	ThrottledRunCounts string
	// ThrottleRate opens a breaker ("throttled") when the 429 rate >= it
	// (the 429s ThrottleRateCounts names); below it the 429 rate (of every
	// 429) lowers the weight. If zero, 0.5 is used.
	ThrottleRate float64
	// ThrottleRateCounts says which 429s the rate that opens a breaker
	// counts: RunCountsHinted (those with a retry hint: a quota) or
	// RunCountsAll (every 429). A bare 429 is what a full queue answers;
	// in an overloaded fleet of unequal backends the slower ones' queues
	// fill first, and opening them took capacity from a saturated fleet
	// (docs/EVALUATION.md "A fleet of unequal backends"). Every 429 still
	// lowers the weight, down to HalfOpenWeight at ThrottleRate. Pools
	// whose 429s are quotas but whose events carry no hint (access logs)
	// set it, and ThrottledRunCounts, to RunCountsAll. If empty,
	// RunCountsHinted is used.
	ThrottleRateCounts string
	// ThrottleRefuseRate opens a breaker ("throttled") on 429s of every
	// kind, bare ones included, when they are at least this share of the
	// newest quarter of the window's counted requests, with at least
	// RecentMinRequests of them there (and MinRequests in the window, as
	// for every rate rule), unless a peer (another backend not open)
	// answered 429s to PoolThrottleHold/5 or more of its requests over
	// that quarter: the run's strict hold rather than the median's. It
	// is the one rule that opens on bare 429s under the default
	// ThrottleRateCounts: a backend refusing nearly every request while
	// its peers serve is not a full queue in an overload (there the peers
	// answer 429s too, and a queue that drains admits some requests) but
	// a backend that cannot serve: one held by other clients, or failing
	// behind an instant 429. Down-weighted only, such a backend kept 2-12%
	// of the attempts in the simulator (its instant answers leave it no
	// requests in flight, so it wins every comparison it joins; docs/
	// EVALUATION.md "A backend that refuses everything"). If zero, 0.9 is
	// used; a negative value turns the rule off.
	ThrottleRefuseRate float64
	// SlowFactor opens a breaker when a backend's EWMA TTFT exceeds this
	// multiple of the median EWMA of the pool's other backends. If zero, 5
	// is used.
	SlowFactor float64
	// EWMAAlpha is the weight of the newest TTFT sample. If zero, 0.2 (the
	// seed's ALPHA) is used.
	EWMAAlpha float64
	// IdleGap: the first event after this much silence is a cold start and
	// gives no latency sample. If zero, 5m is used.
	IdleGap time.Duration
	// OpenBase is the open time of the first trip; the n-th consecutive
	// trip stays open n x OpenBase. If zero, 30s is used.
	OpenBase time.Duration
	// OpenMax caps the open time. If zero, 5m is used.
	OpenMax time.Duration
	// OpenJitter is the relative jitter of the open time (0.1 = +-10%),
	// drawn from Config.Seed, so that backends tripped together do not all
	// half-open in the same second. If zero, 0.1 is used; a negative value
	// disables jitter.
	OpenJitter float64
	// HalfOpenWeight is the weight of a half-open backend, and of a backend
	// that the ejection cap keeps closed. If zero, 0.05 is used.
	HalfOpenWeight float64
	// HalfOpenSuccesses ok events in a row close a half-open breaker. If
	// zero, 5 is used.
	HalfOpenSuccesses int
	// MaxOpenFraction is the largest share of a pool that may be open at
	// once; one backend may always be opened. If zero, 0.5 is used.
	MaxOpenFraction float64
	// Heartbeat is the longest time between two snapshots of a pool, and
	// the unit of the weight damping. If zero, 1s is used.
	Heartbeat time.Duration
	// LoadBeat is how often a pool's loads go out between its snapshots,
	// when it is shorter than Heartbeat: Evaluate lists the pool in
	// Evaluation.Loads, for the compact feed's load frames. The published
	// loads are most of what each of many routers knows, and their age is
	// what routers herd on (docs/EVALUATION.md, "The steady-state cells").
	// If zero, 250ms is used; a negative value sends loads with the
	// snapshots only.
	LoadBeat time.Duration
	// TTL is the snapshot's ttl_ms. If zero, 5s is used.
	TTL time.Duration
	// Expiry drops a backend that is not configured after this long without
	// an event. If zero, 10m is used.
	Expiry time.Duration
	// MaxWeightStep is the largest change of a backend's weight per
	// Heartbeat (damping against the herd); opening, quarantine and the
	// ejection cap still lower a weight at once. If zero, 0.25 is used, so
	// a backend that closes after half-open is back to full weight in
	// about four heartbeats.
	MaxWeightStep float64
	// RecentMinRequests lets the failure-rate and 429 rules trip on the
	// newest quarter of the window alone: when that quarter holds at
	// least this many counted requests and its rate is at or past the
	// threshold, and the whole window's rate (for the 429 rule, the rate
	// of the newest half of the window) is at least half the threshold,
	// the backend opens without waiting for the incident to fill the
	// window (a backend that starts answering 90% 429s opens in 3-6 s at
	// 4 and 16 routers instead of 18-24 s; docs/EVALUATION.md). The
	// min_requests gate still applies to the whole window. If zero, 10 is
	// used; a negative value turns the quarter trip off.
	RecentMinRequests int
	// PoolThrottleHold holds a closed backend's 429 trip while the median
	// 429 rate of its peers (the other backends not open) over the newest
	// quarter of the window is at least this: when the whole pool answers
	// 429 it is saturated, and opening one backend only moves its load
	// onto the others. The backend's weight still falls with its 429
	// rate. If zero, 0.25 is used; a negative value turns the hold off.
	PoolThrottleHold float64
	// LoadMaxAge is how long a backend's load report (from an event's
	// load fields or its metrics) is published in the snapshots: an older
	// one is left out (load: null), so that a picker never ranks by a
	// queue that emptied long ago. If zero, 3s (three default heartbeats)
	// is used.
	LoadMaxAge time.Duration
	// ClientErrorRate opens a breaker ("client_error_rate") when a
	// backend's client-error rate, client_error / (counted + client_error),
	// is at least this and at least ClientErrorMargin above the median rate
	// of its peers (the other backends not open with MinRequests answered
	// requests; at least one is needed), over the window and over its
	// newest quarter (clienterr.go): a backend that answers 4xx to requests
	// its peers serve is at fault, while a pool that answers them alike
	// sees bad requests and opens nothing. The gate counts the client
	// errors with the counted requests for this rule. If zero, 0.5 is
	// used; a negative value turns the rule off (client_error then never
	// counts, as in the base protocol).
	ClientErrorRate float64
	// ClientErrorMargin is how far a backend's client-error rate must be
	// above its peers' median for ClientErrorRate to open it. If zero, 0.4
	// is used.
	ClientErrorMargin float64
}

// WithDefaults returns s with every zero field set to its default.
func (s Settings) WithDefaults() Settings {
	return Settings{}.defaults().Override(s)
}

func (Settings) defaults() Settings {
	return Settings{
		Window:               DefaultWindow,
		Bucket:               DefaultBucket,
		MinRequests:          DefaultMinRequests,
		FailureRate:          DefaultFailureRate,
		ConsecutiveFailures:  DefaultConsecutiveFailures,
		ConsecutiveStalls:    DefaultConsecutiveStalls,
		ConsecutiveThrottled: DefaultConsecutiveThrottled,
		ThrottledRunCounts:   DefaultThrottledRunCounts,
		ThrottleRateCounts:   DefaultThrottleRateCounts,
		ThrottleRefuseRate:   DefaultThrottleRefuseRate,
		ThrottleRate:         DefaultThrottleRate,
		SlowFactor:           DefaultSlowFactor,
		EWMAAlpha:            DefaultEWMAAlpha,
		IdleGap:              DefaultIdleGap,
		OpenBase:             DefaultOpenBase,
		OpenMax:              DefaultOpenMax,
		OpenJitter:           DefaultOpenJitter,
		HalfOpenWeight:       DefaultHalfOpenWeight,
		HalfOpenSuccesses:    DefaultHalfOpenSuccesses,
		MaxOpenFraction:      DefaultMaxOpenFraction,
		Heartbeat:            DefaultHeartbeat,
		LoadBeat:             DefaultLoadBeat,
		TTL:                  DefaultTTL,
		Expiry:               DefaultExpiry,
		MaxWeightStep:        DefaultMaxWeightStep,
		RecentMinRequests:    DefaultRecentMinRequests,
		PoolThrottleHold:     DefaultPoolThrottleHold,
		LoadMaxAge:           DefaultLoadMaxAge,
		ClientErrorRate:      DefaultClientErrorRate,
		ClientErrorMargin:    DefaultClientErrorMargin,
	}
}

// Override returns s with every non-zero field of pool replacing s's: a
// pool's Settings with zero fields inherit the global ones.
func (s Settings) Override(pool Settings) Settings {
	pick(&s.Window, pool.Window)
	pick(&s.Bucket, pool.Bucket)
	pick(&s.MinRequests, pool.MinRequests)
	pick(&s.FailureRate, pool.FailureRate)
	pick(&s.ConsecutiveFailures, pool.ConsecutiveFailures)
	pick(&s.ConsecutiveStalls, pool.ConsecutiveStalls)
	pick(&s.ConsecutiveThrottled, pool.ConsecutiveThrottled)
	pick(&s.ThrottledRunCounts, pool.ThrottledRunCounts)
	pick(&s.ThrottleRateCounts, pool.ThrottleRateCounts)
	pick(&s.ThrottleRefuseRate, pool.ThrottleRefuseRate)
	pick(&s.ThrottleRate, pool.ThrottleRate)
	pick(&s.SlowFactor, pool.SlowFactor)
	pick(&s.EWMAAlpha, pool.EWMAAlpha)
	pick(&s.IdleGap, pool.IdleGap)
	pick(&s.OpenBase, pool.OpenBase)
	pick(&s.OpenMax, pool.OpenMax)
	pick(&s.OpenJitter, pool.OpenJitter)
	pick(&s.HalfOpenWeight, pool.HalfOpenWeight)
	pick(&s.HalfOpenSuccesses, pool.HalfOpenSuccesses)
	pick(&s.MaxOpenFraction, pool.MaxOpenFraction)
	pick(&s.Heartbeat, pool.Heartbeat)
	pick(&s.LoadBeat, pool.LoadBeat)
	pick(&s.TTL, pool.TTL)
	pick(&s.Expiry, pool.Expiry)
	pick(&s.MaxWeightStep, pool.MaxWeightStep)
	pick(&s.RecentMinRequests, pool.RecentMinRequests)
	pick(&s.PoolThrottleHold, pool.PoolThrottleHold)
	pick(&s.LoadMaxAge, pool.LoadMaxAge)
	pick(&s.ClientErrorRate, pool.ClientErrorRate)
	pick(&s.ClientErrorMargin, pool.ClientErrorMargin)
	return s
}

func pick[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// Validate reports the first field of s (after defaults) that is out of
// range, as a *SettingError wrapping ErrInvalidSettings whose key is the
// YAML key under "analyzer".
func (s Settings) Validate() error { return s.WithDefaults().validate("analyzer") }

// validate checks settings whose defaults are already applied; prefix is the
// YAML path of the block ("analyzer", "pools[1].analyzer").
func (s Settings) validate(prefix string) error {
	durPositive := func(key string, d time.Duration) error { return durPositive(prefix, key, d) }
	fraction := func(key string, v float64, zeroOK bool) error { return fraction(prefix, key, v, zeroOK) }
	atLeastOne := func(key string, n int) error {
		if n < 1 {
			return settingErr(prefix, key, fmt.Sprint(n), "must be >= 1")
		}
		return nil
	}
	checks := []func() error{
		func() error { return durPositive("window", s.Window) },
		func() error { return durPositive("bucket", s.Bucket) },
		func() error { return s.validateBuckets(prefix) },
		func() error { return atLeastOne("min_requests", s.MinRequests) },
		func() error { return fraction("failure_rate", s.FailureRate, false) },
		func() error { return atLeastOne("consecutive_failures", s.ConsecutiveFailures) },
		func() error { return atLeastOne("consecutive_stalls", s.ConsecutiveStalls) },
		func() error { return fraction("throttle_rate", s.ThrottleRate, false) },
		func() error {
			if !(s.SlowFactor > 1) || math.IsInf(s.SlowFactor, 0) {
				return settingErr(prefix, "slow_factor", fmtFloat(s.SlowFactor), "must be > 1")
			}
			return nil
		},
		func() error { return fraction("ewma_alpha", s.EWMAAlpha, false) },
		func() error { return durPositive("idle_gap", s.IdleGap) },
		func() error { return durPositive("open_base", s.OpenBase) },
		func() error {
			if s.OpenMax < s.OpenBase {
				return settingErr(prefix, "open_max", s.OpenMax.String(), "must be >= open_base ("+s.OpenBase.String()+")")
			}
			return nil
		},
		func() error {
			if math.IsNaN(s.OpenJitter) || s.OpenJitter > 0.5 {
				return settingErr(prefix, "open_jitter", fmtFloat(s.OpenJitter), "must be <= 0.5 (negative disables jitter)")
			}
			return nil
		},
		func() error { return fraction("half_open_weight", s.HalfOpenWeight, false) },
		func() error { return atLeastOne("half_open_successes", s.HalfOpenSuccesses) },
		func() error { return fraction("max_open_fraction", s.MaxOpenFraction, false) },
		func() error { return durPositive("heartbeat", s.Heartbeat) },
		func() error {
			if s.TTL < s.Heartbeat {
				return settingErr(prefix, "ttl", s.TTL.String(), "must be >= heartbeat ("+s.Heartbeat.String()+")")
			}
			return nil
		},
		func() error {
			if s.Expiry < s.Window {
				return settingErr(prefix, "expiry", s.Expiry.String(), "must be >= window ("+s.Window.String()+")")
			}
			return nil
		},
		func() error { return s.validateLater(prefix) },
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateLater checks the settings added after the design's (weights,
// loads, the pool hold, client errors, what the 429 rules count), in
// validate's order.
func (s Settings) validateLater(prefix string) error {
	checks := []func() error{
		func() error { return fraction(prefix, "max_weight_step", s.MaxWeightStep, false) },
		func() error { return durPositive(prefix, "load_max_age", s.LoadMaxAge) },
		func() error { return atMostOne(prefix, "pool_throttle_hold", s.PoolThrottleHold, "the hold") },
		func() error { return atMostOne(prefix, "client_error_rate", s.ClientErrorRate, "the rule") },
		func() error { return atMostOne(prefix, "throttle_refuse_rate", s.ThrottleRefuseRate, "the rule") },
		func() error { return fraction(prefix, "client_error_margin", s.ClientErrorMargin, false) },
		func() error {
			if s.ThrottledRunCounts != RunCountsHinted && s.ThrottledRunCounts != RunCountsAll {
				return settingErr(prefix, "throttled_run_counts", s.ThrottledRunCounts, "must be "+RunCountsHinted+" or "+RunCountsAll)
			}
			return nil
		},
		func() error {
			if s.ThrottleRateCounts != RunCountsHinted && s.ThrottleRateCounts != RunCountsAll {
				return settingErr(prefix, "throttle_rate_counts", s.ThrottleRateCounts, "must be "+RunCountsHinted+" or "+RunCountsAll)
			}
			return nil
		},
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// durPositive checks that the duration setting key is positive.
func durPositive(prefix, key string, d time.Duration) error {
	if d <= 0 {
		return settingErr(prefix, key, d.String(), "must be > 0")
	}
	return nil
}

// fraction checks that the setting key is in (0, 1], or [0, 1] with
// zeroOK.
func fraction(prefix, key string, v float64, zeroOK bool) error {
	if math.IsNaN(v) || v > 1 || v < 0 || (v == 0 && !zeroOK) {
		if zeroOK {
			return settingErr(prefix, key, fmtFloat(v), "must be in [0, 1]")
		}
		return settingErr(prefix, key, fmtFloat(v), "must be in (0, 1]")
	}
	return nil
}

// atMostOne checks a rate or share whose negative values turn off what
// names.
func atMostOne(prefix, key string, v float64, what string) error {
	if math.IsNaN(v) || v > 1 {
		return settingErr(prefix, key, fmtFloat(v), "must be <= 1 (negative disables "+what+")")
	}
	return nil
}

func (s Settings) validateBuckets(prefix string) error {
	if s.Bucket > s.Window {
		return settingErr(prefix, "bucket", s.Bucket.String(), "must be <= window ("+s.Window.String()+")")
	}
	if s.Window%s.Bucket != 0 {
		return settingErr(prefix, "window", s.Window.String(), "must be a multiple of bucket ("+s.Bucket.String()+")")
	}
	if s.Window/s.Bucket > maxBucketsPerWindow {
		return settingErr(prefix, "window", s.Window.String(), fmt.Sprintf("must be at most %d buckets of %s", maxBucketsPerWindow, s.Bucket))
	}
	return nil
}

func settingErr(prefix, key, value, problem string) error {
	return &SettingError{Key: prefix + "." + key, Value: value, Problem: problem, Err: ErrInvalidSettings}
}

func configErr(key, value, problem string) error {
	return &SettingError{Key: key, Value: value, Problem: problem, Err: ErrInvalidConfig}
}

func fmtFloat(v float64) string { return fmt.Sprint(v) }

// BackendConfig is a configured backend of a pool.
type BackendConfig struct {
	ID          string   // required, unique within the pool
	Priority    int      // the snapshot's priority (failover order; lower first)
	CostPerMTok *float64 // the snapshot's cost_per_mtok; nil = null
}

// PoolConfig is a configured pool. Pools and backends that are not
// configured are still tracked from their events with the global Settings.
type PoolConfig struct {
	ID string // required, unique
	// Mode is the snapshot's mode. If empty, balance is used.
	Mode fleetwatch.Mode
	// AllOpen is the snapshot's all_open. If empty, shed is used.
	AllOpen fleetwatch.AllOpen
	// Shadow is the snapshot's shadow mode (analyzer/shadow.go): breakers
	// or observe publish the decisions marked advisory. If empty (or
	// "off"), the decisions are in force.
	Shadow fleetwatch.Shadow
	// AffinityTolerance is the snapshot's affinity_tolerance. If zero, 2.5
	// (fleetwatch.DefaultAffinityTolerance) is used; otherwise it must be at
	// least 1.
	AffinityTolerance float64
	// Settings override the global Settings for this pool only; zero fields
	// inherit.
	Settings Settings
	// Backends are tracked from the start and never expire.
	Backends []BackendConfig
}

// Config configures an Analyzer. The zero value works: global defaults, no
// configured pools.
type Config struct {
	// Settings are the global rules' parameters; zero fields take defaults.
	Settings Settings
	// Pools are the configured pools.
	Pools []PoolConfig
	// Limits bound the pools and backends tracked from events (see
	// Limits); zero fields take their defaults.
	Limits Limits
	// Quarantine gives a backend whose drift status is drifted weight 0.
	Quarantine bool
	// Epoch names this analyzer instance in its snapshots. If empty, a
	// time-sortable id (ULID layout: 48-bit milliseconds of the first
	// Evaluate's now, 80 bits from Seed) is generated.
	Epoch string
	// Seed drives the open-time jitter and the generated epoch
	// (math/rand/v2 PCG); the same seed and inputs give the same outputs.
	// Give each process its own seed (for example from crypto/rand) so
	// that two analyzers started in the same millisecond differ.
	Seed uint64
}

// validate checks the pools and backends and the merged settings of each.
func (c *Config) validate(global Settings) error {
	if err := global.validate("analyzer"); err != nil {
		return err
	}
	seen := make(map[string]bool, len(c.Pools))
	for i, p := range c.Pools {
		key := fmt.Sprintf("pools[%d]", i)
		if err := fleetwatch.ValidatePoolID(p.ID); err != nil {
			return configErr(key+".id", fmt.Sprintf("%q", p.ID), "a pool id matches ^[-/_=.a-zA-Z0-9]{1,256}$ with no leading, trailing or double '.'")
		}
		if seen[p.ID] {
			return configErr(key+".id", fmt.Sprintf("%q", p.ID), "duplicate pool id")
		}
		seen[p.ID] = true
		switch p.Mode {
		case "", fleetwatch.ModeBalance, fleetwatch.ModeFailover:
		default:
			return configErr(key+".mode", string(p.Mode), "must be balance or failover")
		}
		switch p.AllOpen {
		case "", fleetwatch.AllOpenShed, fleetwatch.AllOpenSpread:
		default:
			return configErr(key+".all_open", string(p.AllOpen), "must be shed or spread")
		}
		if err := validateShadow(key, p.Shadow); err != nil {
			return err
		}
		// Below 1 a sticky backend would be left while it is no slower than
		// the pool's median, which defeats affinity; 0 means the default.
		if t := p.AffinityTolerance; t != 0 && !(t >= 1 && !math.IsInf(t, 0)) {
			return configErr(key+".affinity_tolerance", fmtFloat(t), "must be >= 1")
		}
		if err := global.Override(p.Settings).validate(key + ".analyzer"); err != nil {
			return err
		}
		ids := make(map[string]bool, len(p.Backends))
		for j, b := range p.Backends {
			bkey := fmt.Sprintf("%s.backends[%d]", key, j)
			if err := fleetwatch.ValidateBackendID(b.ID); err != nil {
				return configErr(bkey+".id", fmt.Sprintf("%q", b.ID), fmt.Sprintf("must be 1 to %d printable bytes", fleetwatch.MaxIDLen))
			}
			if ids[b.ID] {
				return configErr(bkey+".id", fmt.Sprintf("%q", b.ID), "duplicate backend id in pool "+p.ID)
			}
			ids[b.ID] = true
			if b.Priority < 0 {
				return configErr(bkey+".priority", fmt.Sprint(b.Priority), "must be >= 0")
			}
			if c := b.CostPerMTok; c != nil && (math.IsNaN(*c) || math.IsInf(*c, 0) || *c < 0) {
				return configErr(bkey+".cost_per_mtok", fmtFloat(*c), "must be >= 0")
			}
		}
	}
	return nil
}
