// Package analyzer turns outcome events into per-pool decision snapshots: it
// keeps sliding windows per backend, an EWMA of time to first token, TTFT
// histograms, a circuit breaker per backend with a min-requests gate and an
// ejection cap, and the weights routers sample by (DESIGN.md "Analyzer rules",
// PROTOCOL.md "Decision snapshot").
//
// It is pure logic: no I/O, no goroutines, no clock. Observe(batch) counts
// events; Evaluate(now) applies the rules at the given time and returns the
// snapshots to publish and the transitions made; the caller owns ticking and
// publishing. One mutex guards the whole Analyzer, so a collector goroutine
// may Observe while a ticker Evaluates; nothing is called while it is held.
//
// # Algorithms and their sources
//
//   - EWMA of TTFT, the seed article's observe(): the first sample sets it,
//     then ewma = alpha*x + (1-alpha)*ewma with alpha 0.2. Only ok events
//     with a TTFT feed it (the seed's "fast failure trap": an instant 500
//     never looks fast), and not cold ones: an event marked cold, the first
//     event of a backend never seen and the first event after IdleGap of
//     silence give no latency sample (their outcome still counts).
//   - Sliding windows (window.go): a ring of Window/Bucket buckets keyed by
//     the event's time, with running totals that are updated when an event
//     is added and when a bucket leaves the window (gobreaker's rolling
//     counts, grpc-go outlier detection's callcounter). Each bucket holds
//     counts by outcome, the largest retry_after_ms, the TTFT samples, and
//     the answered requests and client errors by when they were sent.
//   - TTFT histogram (histogram.go): log-linear (HDR layout), 16 bins per
//     power of two from 0.25 ms to 2^22 ms, 385 bins; quantiles by nearest
//     rank on the window's merged histogram report the point of a bin at
//     equal relative distance from both its ends, so p50 and p95 are within
//     1/33 (3.03%) of the true sample at that rank (0.125 ms absolute below
//     0.25 ms).
//   - Circuit breaker (rules.go, backend.go), after sony/gobreaker: closed,
//     open, half_open, with a generation per transition; a late event from
//     an older generation (its ts before the transition) is dropped, so the
//     counts that opened a backend can never re-trip or close it afterwards.
//   - Ejection cap, after grpc-go's outlier detection
//     (max_ejection_percent): at most MaxOpenFraction of a pool open, with
//     the held-back trips counted, like grpc-go's unenforced ejections.
//   - Relative slowness: the backend's EWMA against the median EWMA of its
//     peers, as the seed's affinity rule compares a backend with the pool
//     median.
//
// # Rules
//
// Failures are error, timeout and stalled (a router's first-token deadline
// ended the attempt: a timeout by another name, docs/PROTOCOL.md); throttled
// has its own rate (rate_429 = throttled / (ok + error + timeout + stalled +
// throttled)); canceled is counted in requests only, and client_error counts
// only in the client-error rule (5), against the peers. A closed backend
// opens on the first rule that fires, in this order:
//
//  1. consecutive: ConsecutiveFailures (5) failures in a row, at any volume,
//     or ConsecutiveStalls (2) stalled outcomes within such a run.
//     ok resets the run; throttled, canceled and client_error neither extend
//     nor reset it. The run is latched when it reaches the threshold, so an
//     ok arriving before the next Evaluate does not undo the trip.
//  2. failure_rate: failures / (ok + failures) >= FailureRate (0.5).
//  3. throttled: rate_429 >= ThrottleRate (0.5), counting in rate_429 only
//     the throttled events with a retry hint unless ThrottleRateCounts is
//     "all" (a bare 429 is a full queue: it lowers the weight, below, but
//     opens nothing by this rate); the open time is at least the largest
//     retry_after_ms in the window (honoured up to one hour). Also
//     throttled, whatever the hints: every 429 at ThrottleRefuseRate (0.9)
//     of the newest quarter's counted requests, with RecentMinRequests (10)
//     of them there, unless a peer answered 429s to PoolThrottleHold/5 or
//     more of its requests over that quarter: a backend that refuses
//     nearly everything while its peers serve, which down-weighting alone
//     left 2-12% of the attempts (its instant 429s leave it idle in every
//     comparison a router's scan lets it join; docs/EVALUATION.md "A
//     backend that refuses everything").
//  4. slow: EWMA > SlowFactor (5) x the median EWMA of the pool's other
//     backends that have one and are not open, confirmed by the window's
//     median TTFT > SlowFactor x the median of the other backends' window
//     medians. One peer suffices (in a pool of two, two backends cannot
//     each be five times slower than the other); a pool that slows down
//     together trips nothing.
//  5. client_error_rate (clienterr.go): the client-error rate
//     client_error / (counted + client_error) >= ClientErrorRate (0.5) and
//     >= ClientErrorMargin (0.4) above the median rate of the peers (the
//     other backends not open with MinRequests answered requests; at least
//     one), confirmed on the newest quarter second by second of sending
//     time (ts - duration_ms): there the backend's rate must be past both
//     against the rate it would have at its peers' pooled rate of each
//     bucket, which a share of traffic moving between backends as a flood
//     of bad requests starts does not fake. A wrong-model replica (404 to
//     everything its peers serve) opens; a pool answering 4xx alike, or a
//     pool of one, opens nothing. The reason names the dominant status
//     class (400, 401, 403, 404, 405, 413, 422, other; counted per bucket
//     in a side array allocated at a window's first client error). A
//     backend it opened reopens while half-open on HalfOpenSuccesses
//     client errors before as many ok in a row (half_open_client_error).
//     A negative ClientErrorRate turns it off.
//
// Rules 2 and 3 must also hold on the newest quarter of the window when it
// has counted requests, so a backend that has recovered is not opened on a
// history the window keeps for up to a window length (Stats.HeldByRecency).
// With RecentMinRequests they may also trip on that quarter alone, when the
// whole window (for rule 3, its newest half) is at least half the threshold.
// Rule 4 confirms the EWMA with medians because TTFT is heavy-tailed: a
// request queued behind a 10,000-token generation moves an EWMA with alpha
// 0.2 by a fifth of its size, and the simulator (docs/EVALUATION.md) showed
// the EWMA rule alone opening healthy backends many times an hour under
// mixed-cost traffic; a median moves only when most requests are slow
// (Stats.HeldByMedian counts the screens it overruled).
//
// Rules 2 to 5 are gated: they need MinRequests (20) counted requests in the
// window (rule 5: answered requests, the client errors counted too, so a
// backend answering nothing but 4xx is evaluated). Below it a backend is "not evaluated", which is not healthy; a rule
// that would have fired is counted in Stats.HeldByGate, once per episode. A
// single failure on a quiet backend therefore never opens it.
//
// An open backend stays open OpenBase x n (n = consecutive trips, 30s, 60s,
// 90s, ...), jittered by +-OpenJitter (10%, from Config.Seed) and capped at
// OpenMax (5m). n resets once the backend has stayed closed for a whole Window
// after closing; a backend that trips again within a window of closing (it
// flaps) continues to 4 x 30s and so on. When the open time is over, the
// backend is half_open with weight HalfOpenWeight and an empty window (its
// probe is judged on its own traffic); HalfOpenSuccesses (5) ok events in a
// row close it, and an error, a timeout or a 429 reopens it with the next n
// (a 429 says it is not ready for traffic; its retry-after is honoured). The
// first decisive event wins until Evaluate applies it; Observe returns urgent
// so the caller can Evaluate at once.
//
// The ejection cap: a backend may open only while the pool keeps at least
// 1 - MaxOpenFraction of its backends not open (half-open counts as not open;
// the pool is every backend in its snapshot, quiet configured ones included),
// and one backend may always open: at most max(1, floor(MaxOpenFraction x n))
// are open. The cap is checked when a backend would open; a pool that shrinks
// (expiry) does not close open backends early. When several trip at once the
// worst (by how far past its threshold) open first. A held closed backend
// stays closed with weight HalfOpenWeight and a reason
// "ejection cap held: 3 of 6 already open
// (max_open_fraction 0.50); <the rule's reason>" written when the hold starts
// and kept while it lasts (so the snapshot does not churn with the numbers); a
// held half-open backend stays half-open and starts its probe over.
//
// # Weights
//
// Open, and drifted with Config.Quarantine: 0, at once. Half-open and held by
// the cap: HalfOpenWeight, at once. Closed: the observed weight
// 1 - rate_429/ThrottleRate (clipped to [0, 1]) shrunk toward the pool prior,
// w = (n*w_obs + k*prior) / (n + k), n the counted requests in the window,
// k = max(1, MinRequests/4), prior the mean observed weight of the pool's
// closed backends with at least MinRequests counted requests (1 when none),
// floored at HalfOpenWeight so a throttled backend keeps a trickle to show its
// recovery. A backend's first weight is its target; afterwards a closed
// backend's weight moves toward its target on the pool's heartbeat (however
// often Evaluate runs), by MaxWeightStep (0.25) per Heartbeat of time elapsed
// since it last moved, whatever the pool's beat, so a recovered backend ramps
// up over about four seconds
// instead of drawing every router at once. Weights are rounded to 4 decimals.
// A backend not evaluated yet is published with weight 1.
//
// # Snapshots
//
// Evaluate returns a snapshot of every pool whose decisions (the set of
// backends, a state, weight, reason, drift status or open_until) changed, and
// of every pool whose heartbeat is due. A pool's first snapshot comes at its
// first Evaluate (t); its heartbeats are anchored a phase earlier (t-ph+hb,
// t-ph+2hb, ..., ph a hash of the pool id below the heartbeat, so that pools
// that appear together beat apart) and may come a tenth of a heartbeat
// early, so a caller ticking every 100 ms gets exactly one beat per heartbeat
// whatever the jitter of its ticks; a caller more than two heartbeats late
// re-anchors. So no snapshot of a pool is ever more than a heartbeat (plus the
// caller's tick) older than the previous one. Between snapshots, a pool's
// loads go out every LoadBeat (250 ms; Evaluation.Loads, for the compact
// feed's load frames, with the last snapshot's seq), on the heartbeat's grid.
// EvaluateDue evaluates only the pools whose beat (of either kind) is due,
// or a rule tick without load beats (RuleTick): a caller ticking every tenth
// of the load beat takes each pool on its own phase, so the pools publish
// across the beat instead of at one instant. Damped weights move on both
// beats, by MaxWeightStep per Heartbeat elapsed. Seq starts at 1
// and grows by one per returned snapshot of a pool; Snapshots and Snapshot
// return the current state with the last seq. Reasons
// are the last state change's, or the ejection cap's while it holds a backend;
// a closed backend's reason goes on with "not evaluated: n of m requests"
// below the gate and with what lowers its weight (explain.go; only the first
// part makes a snapshot "changed"). Explain runs evaluatePool on a copy of a
// pool to say what an evaluation now decides and why.
// Since is when the backend entered its state (the first Evaluate for a
// backend that never changed).
//
// # Load and routers
//
// An extension (load.go, docs/DECISIONS.md "Backend load"): each backend
// keeps its latest load report, from events that carry running, waiting or
// kv_cache_usage (source "event") and from ObserveLoad (its metrics, source
// "metrics"). The newest report wins whatever its source; each field keeps
// the time of the newest report that carried it, and a field older than
// LoadMaxAge (3s) is left out (running and waiting as 0, kv_cache_usage
// null). The snapshot's load carries the newest report's age at the
// snapshot's time and its source, and is nil once the newest report is
// older than LoadMaxAge. Load never changes a decision and never triggers
// a snapshot: it rides on the heartbeat. Routers counts the distinct event
// sources of the pool seen within the window, up to MaxRouters (4,096): a
// new source costs a slot and a map entry, every other event none.
//
// # Time
//
// Windows are keyed by event time. Events older than their backend's window
// are dropped and counted (Stats.DroppedOld). An event more than two
// heartbeats ahead of the latest Evaluate's now (upstream already replaces ts
// beyond 5 minutes of skew) is counted in the bucket two heartbeats ahead
// (Stats.ClampedFuture), so a skewed proxy cannot push a window forward and
// evict good data. Before the first Evaluate nothing is clamped.
//
// A backend that is not configured and sent no event for longer than Expiry is
// dropped (a transition with cause expired and To ""); a pool that is not
// configured and has no backend left gets one last, empty snapshot and is
// forgotten, except for its seq: if it comes back, its seq continues, so
// routers that hold its last snapshot accept the new ones. SetDrift ignores
// pools and backends the analyzer does not know. An event without a TS is
// counted at the latest Evaluate's now, or dropped (Stats.DroppedNoTime)
// before the first Evaluate.
//
// # Decisions where DESIGN.md is silent
//
//   - The consecutive run: ok resets it; throttled, canceled and
//     client_error neither extend nor reset it; a run that reached the
//     threshold is latched until Evaluate.
//   - The gate counts ok + error + timeout + throttled (for the
//     client-error rule, client_error too). A reason's "over N requests"
//     is the denominator of the rate it quotes.
//   - client_error counts against a backend only relative to its peers
//     (rule 5); there is no retry evidence to weigh, because the router
//     never retries a 4xx and events carry no attempt id
//     (docs/PROTOCOL.md "Client errors against the peers").
//   - Slowness compares with the median of the other backends that are not
//     open; one such peer suffices; the backend itself is left out.
//   - Order of rules and of openings under the cap: consecutive,
//     failure_rate, throttled, slow, client_error_rate for one backend; the worst first across
//     backends (how far past its threshold, then id).
//   - Half-open: the window restarts empty; a 429 reopens like a failure;
//     the first decisive event wins; the cap also holds a reopening.
//   - Open time: jitter +-10% (OpenJitter, from Config.Seed) then the cap
//     at OpenMax; the trip count resets after a healthy window once closed;
//     retry-after honoured up to one hour.
//   - Weights: shrinkage k = MinRequests/4; prior = mean observed weight of
//     the pool's evaluated closed backends; floor HalfOpenWeight for closed
//     backends; held by the cap = HalfOpenWeight at once; MaxWeightStep 0.25
//     per heartbeat on the pool's beat; rounded to 4 decimals; quarantine
//     applies to drifted only (not suspect).
//   - Generations: an event whose ts is before its backend's last
//     transition is dropped (Stats.StaleGeneration).
//   - Time: future events clamped to two heartbeats past the latest
//     Evaluate; events older than the window dropped before they touch
//     anything; events without ts counted at the latest Evaluate.
//   - Heartbeats anchored per pool with a tenth of a heartbeat of early
//     tolerance; Seq continues for a pool that is forgotten and comes back.
//   - Epoch: ULID layout from the first Evaluate's now and Config.Seed.
//   - Observe's urgent: a consecutive-failure latch (unless the cap holds
//     the backend) or a half-open verdict; rate-based trips wait for the
//     caller's next Evaluate.
package analyzer
