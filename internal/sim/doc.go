// Package sim is a deterministic discrete-event simulator of a fleet of LLM
// inference backends and the routers in front of them, used to compare
// routing policies (fleetwatch sim, docs/EVALUATION.md) and to choose the
// picker's defaults.
//
// The simulation is a classic event-scheduling loop: one virtual clock, a
// binary heap of events ordered by (time, sequence number), and PCG
// generators seeded per run, so a (scenario, policy, seed) always gives the
// same Result. Backends batch continuously: up to Slots sequences run at
// once, the rest wait in a bounded FIFO queue, and a full queue answers 429;
// time to first token is the queue wait plus a prefill that grows with the
// prompt tokens not found in the backend's prefix cache (an LRU of prefix
// hashes), and decode time grows with the output tokens and the batch
// occupancy. Request sizes are log-normal and heavy-tailed; arrivals are
// Poisson or a two-state modulated Poisson process. Incidents script
// fast failures, stalls, 429 saturation, cold starts, slow degradation,
// speed-ups, artefact changes and client errors (a backend answering a 4xx
// to a share of requests: one wrong-model replica, or every backend at
// once for a flood of bad requests).
//
// The fleetwatch policies run the real analyzer and the real feed/p2c
// picker unchanged: every finished attempt becomes a fleetwatch.Event for
// analyzer.Observe, and every virtual second (and at once when Observe says
// a transition is urgent) analyzer.Evaluate's snapshots go to each router's
// Picker.Update. The other policies (round-robin, random, least
// connections, latency-greedy, the seed's local p2c, LiteLLM's cooldowns,
// always-sticky) are re-implementations of their described behaviour.
//
// The fleet-load policies (fl-load*, policy_fleetload.go) are variants of
// the picker's load score (p2c.LoadScore: each backend's load as the
// snapshot publishes it plus R times the router's own change since the
// snapshot) and of the snapshot's fleet-wide retry budget; most run the
// real picker, three are simulator-local for comparison. This tree's
// analyzer does not fill the snapshots' load, routers and retry_budget
// yet, so the simulator computes them from the same outcome events the
// analyzer sees (fleetfeed.go) and lays them over its snapshots; see
// docs/EVALUATION.md, "Fleet-wide load (experiment)".
//
// A Scenario with a Trace replays recorded requests instead of the
// generated workload (trace.go reads Azure CSV, Mooncake JSONL, outcome
// events and nginx JSON logs): each backend then has a KV cache of
// 512-token blocks (kvcache.go, LRU) and a request pays prefill only after
// its leading cached blocks; the prefix policies (policy_prefix.go) are a
// perfect-knowledge precise-prefix scorer and an SGLang-style approximate
// cache-aware router. See docs/EVALUATION.md, "Real traces".
package sim
