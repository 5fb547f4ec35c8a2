package sim

import (
	"fmt"
	"slices"
	"time"
)

// Scenario names.
const (
	MixedEqual     = "mixed-equal"
	MixedUnequal   = "mixed-unequal"
	FastFailure    = "fast-failure"
	Herd           = "herd"
	ColdStart      = "cold-start"
	SharedPrompt   = "shared-prompt"
	RetryStorm     = "retry-storm"
	LowTraffic     = "low-traffic"
	StallScenario  = "stall"
	Saturation     = "saturation-429"
	Refusing       = "bare-429"
	Degradation    = "degradation"
	ArtefactChange = "artefact-change"
	Overload       = "overload"
	WrongModel     = "wrong-model"
	BadRequests    = "bad-request-flood"
)

// chatWorkload is mixed-cost chat traffic: prompts around 500 tokens and
// outputs around 100, both log-normal and clamped, so a request's cost spans
// about three orders of magnitude (5 to 8,000 output tokens).
func chatWorkload(rate float64) Workload {
	return Workload{
		RatePerSec:   rate,
		PromptTokens: Dist{Median: 500, Sigma: 1.0, Min: 20, Max: 16000},
		OutputTokens: Dist{Median: 100, Sigma: 1.3, Min: 5, Max: 8000},
	}
}

func fleet(n int) []BackendSpec {
	bs := make([]BackendSpec, n)
	for i := range bs {
		bs[i] = BackendSpec{ID: fmt.Sprintf("b%d", i), DecodePerTokenMs: 5}
	}
	return bs
}

// Scenarios returns every scenario, in report order.
func Scenarios() []Scenario {
	return slices.Concat(steadyScenarios(), incidentScenarios(), faultScenarios(), clientErrorScenarios())
}

// steadyScenarios are the steady states, the fast-failure trap, the herd,
// the cold start and the shared prompt.
func steadyScenarios() []Scenario {
	var out []Scenario

	// About 75% of the capacity of four backends of 8 slots, Poisson.
	out = append(out, Scenario{
		Name:        MixedEqual,
		Description: "mixed-cost steady state, 4 equal backends of 8 slots, 4 routers, Poisson arrivals at about 75% load",
		Duration:    10 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(15),
		Policies:    append(append([]string{}, StandardPolicies...), FWSeed, FWSqrt),
	})
	unequal := fleet(4)
	unequal[2].Speed, unequal[3].Speed = 2, 2
	out = append(out, Scenario{
		Name:        MixedUnequal,
		Description: "mixed-cost steady state, 2 fast and 2 half-speed backends, 4 routers, bursty arrivals at about 75% of the total capacity",
		Duration:    10 * time.Minute,
		Routers:     4,
		Backends:    unequal,
		Workload:    withBursts(chatWorkload(11)),
		Policies:    append(append([]string{}, StandardPolicies...), FWSeed, FWSqrt),
	})
	out = append(out, Scenario{
		Name:        FastFailure,
		Description: "fast-failure trap: b3 answers every request with an instant 500 from 60 s on",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: FailFast, From: time.Minute}},
		Watch:       "b3", WatchFrom: time.Minute,
	})
	herd := fleet(4)
	for i := range herd {
		herd[i].Slots = 32
		herd[i].Queue = 10000 // no 429s: the herd shows as queueing
	}
	out = append(out, Scenario{
		Name:        Herd,
		Description: "herd: 16 routers, 4 backends of 32 slots at about 75% load; b0 becomes 2.5x faster at 60 s",
		Duration:    4 * time.Minute,
		Routers:     16,
		Backends:    herd,
		Workload:    chatWorkload(64),
		Incidents:   []Incident{{Backend: "b0", Kind: Fast, From: time.Minute, Factor: 0.4}},
		Watch:       "b0", WatchFrom: time.Minute,
	})
	cold := fleet(4)
	cold[3].StartsCold, cold[3].ColdMs, cold[3].ColdIdle = true, 15000, 5*time.Minute
	out = append(out, Scenario{
		Name:        ColdStart,
		Description: "cold start: b3 is scaled to zero at the start, its first request takes 15 s more (not marked cold by the proxy)",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    cold,
		Workload:    chatWorkload(14),
		Watch:       "b3",
	})
	shared := fleet(4)
	for i := range shared {
		shared[i].PrefillPerTokenMs = 0.25
		shared[i].CacheSize = 24
	}
	sharedLoad := chatWorkload(10)
	sharedLoad.Prefixes, sharedLoad.PrefixTokens = 32, 2000
	out = append(out, Scenario{
		Name:        SharedPrompt,
		Description: "shared system prompts (32 prefixes of 2,000 tokens, LRU of 24 per backend); b0 becomes 5x slower at 60 s",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    shared,
		Workload:    sharedLoad,
		Incidents:   []Incident{{Backend: "b0", Kind: Slow, From: time.Minute, Factor: 5}},
		Policies:    append(append([]string{}, StandardPolicies...), AlwaysSticky),
		Watch:       "b0", WatchFrom: time.Minute,
	})
	return out
}

// incidentScenarios are the retry storm, the overload and low traffic.
func incidentScenarios() []Scenario {
	var out []Scenario
	storm := fleet(4)
	for i := range storm {
		storm[i].Slots = 32
	}
	stormLoad := chatWorkload(150)
	stormLoad.OutputTokens = Dist{Median: 20, Sigma: 1.0, Min: 1, Max: 2000}
	out = append(out, Scenario{
		Name:        RetryStorm,
		Description: "incident with retries: every backend fails 40% of requests (instant 500) from 30 s to 90 s; clients retry up to 3 times; 2 routers at 150 req/s",
		Duration:    2 * time.Minute,
		Routers:     2,
		Backends:    storm,
		Workload:    stormLoad,
		Retries:     3,
		Incidents: []Incident{
			{Backend: "b0", Kind: FailFast, From: 30 * time.Second, To: 90 * time.Second, Rate: 0.4},
			{Backend: "b1", Kind: FailFast, From: 30 * time.Second, To: 90 * time.Second, Rate: 0.4},
			{Backend: "b2", Kind: FailFast, From: 30 * time.Second, To: 90 * time.Second, Rate: 0.4},
			{Backend: "b3", Kind: FailFast, From: 30 * time.Second, To: 90 * time.Second, Rate: 0.4},
		},
		Policies: []string{Random, LeastConn, LiteLLM, Fleetwatch, FWUnbudgeted},
		// Every backend is "broken": WatchShare is 1; the window sets the
		// incident's load figures.
		Watch: "", WatchFrom: 30 * time.Second, WatchTo: 90 * time.Second,
	})
	// overload: the retry-storm fleet at twice its rate (about 76% of the
	// slots busy), then every backend 2.5x slower for 60 s: the offered
	// load is about 190% of what the pool can serve, queues fill, the
	// backends answer 429 and clients retry. Retrying cannot help here;
	// a budget must keep the retries from adding to the load.
	overloadLoad := stormLoad
	overloadLoad.RatePerSec = 300
	var slowAll []Incident
	for _, b := range storm {
		slowAll = append(slowAll, Incident{Backend: b.ID, Kind: Slow, From: 30 * time.Second, To: 90 * time.Second, Factor: 2.5})
	}
	out = append(out, Scenario{
		Name:        Overload,
		Description: "overload with retries: the retry-storm fleet at 300 req/s (about 76% busy); every backend 2.5x slower from 30 s to 90 s (about 190% load); clients retry up to 3 times; 4 routers",
		Duration:    2 * time.Minute,
		Routers:     4,
		Backends:    storm,
		Workload:    overloadLoad,
		Retries:     3,
		Incidents:   slowAll,
		Policies:    []string{Random, LeastConn, Fleetwatch, FWUnbudgeted, FLoad3, FLoad3Fleet, FLoad3Fleet25, FLoad3NoBudget},
		Watch:       "", WatchFrom: 30 * time.Second, WatchTo: 90 * time.Second,
	})
	out = append(out, Scenario{
		Name:        LowTraffic,
		Description: "low traffic (0.5 req/s over 3 backends): b2 answers one 500 at 60 s and one 429 at 150 s",
		Duration:    5 * time.Minute,
		Routers:     1,
		Backends:    fleet(3),
		Workload:    chatWorkload(0.5),
		Incidents: []Incident{
			{Backend: "b2", Kind: FailFast, From: time.Minute, Count: 1},
			{Backend: "b2", Kind: Throttle, From: 150 * time.Second, Count: 1},
		},
		Quiet: "b2",
		Watch: "b2", WatchFrom: time.Minute,
	})
	return out
}

// faultScenarios are one backend's faults: a stall, 429 saturation, a
// backend refusing everything with bare 429s, a slow degradation, an
// artefact change.
func faultScenarios() []Scenario {
	var out []Scenario
	out = append(out, Scenario{
		Name:        StallScenario,
		Description: "stall: b3 accepts requests and never answers from 60 s to 150 s (clients time out after 30 s)",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: Stall, From: time.Minute, To: 150 * time.Second}},
		Watch:       "b3", WatchFrom: time.Minute, WatchTo: 150 * time.Second,
	})
	out = append(out, Scenario{
		Name:        Saturation,
		Description: "429 saturation: b3 throttles 90% of requests from 60 s to 180 s",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: Throttle, From: time.Minute, To: 3 * time.Minute, Rate: 0.9}},
		Watch:       "b3", WatchFrom: time.Minute, WatchTo: 3 * time.Minute,
	})
	out = append(out, Scenario{
		Name:        Refusing,
		Description: "a backend that refuses everything: b3 answers every request with an instant bare 429 (no retry hint, as a full queue's) from 60 s on",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: BareThrottle, From: time.Minute}},
		Policies:    []string{Random, LeastConn, Fleetwatch, FWNoRefuse},
		Watch:       "b3", WatchFrom: time.Minute,
	})
	out = append(out, Scenario{
		Name:        Degradation,
		Description: "slow degradation: b3 slows down to 6x over two minutes from 60 s",
		Duration:    5 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: Slow, From: time.Minute, Ramp: 2 * time.Minute, Factor: 6}},
		Watch:       "b3", WatchFrom: 3 * time.Minute,
	})
	out = append(out, Scenario{
		Name:        ArtefactChange,
		Description: "artefact change: b3 starts serving a different build at 60 s; the drift probe flags it at 90 s (quarantine on)",
		Duration:    3 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: Drift, From: time.Minute, To: 90 * time.Second}},
		Watch:       "b3", WatchFrom: 90 * time.Second,
	})
	return out
}

// clientErrorScenarios are the two sides of client errors.
func clientErrorScenarios() []Scenario {
	var out []Scenario
	// The two sides of client errors (docs/DECISIONS.md "Backend faults
	// versus request faults"): one backend answering 404 to requests its
	// peers serve is at fault and must open; every backend answering the
	// same share of 400s sees bad requests and must open nothing.
	out = append(out, Scenario{
		Name:        WrongModel,
		Description: "wrong-model replica: b3 restarts with another model at 60 s and answers every request with an instant 404 (model not found)",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   []Incident{{Backend: "b3", Kind: ClientErrors, Status: 404, From: time.Minute}},
		Policies:    []string{Random, LeastConn, Fleetwatch},
		Watch:       "b3", WatchFrom: time.Minute,
	})
	var flood []Incident
	for _, b := range fleet(4) {
		flood = append(flood, Incident{Backend: b.ID, Kind: ClientErrors, Status: 400, Rate: 0.7, From: time.Minute, To: 3 * time.Minute})
	}
	out = append(out, Scenario{
		Name:        BadRequests,
		Description: "bad-request flood: from 60 s to 180 s, 70% of requests are malformed and every backend answers them with an instant 400",
		Duration:    4 * time.Minute,
		Routers:     4,
		Backends:    fleet(4),
		Workload:    chatWorkload(12),
		Incidents:   flood,
		Policies:    []string{Random, LeastConn, Fleetwatch},
		Watch:       "", WatchFrom: time.Minute, WatchTo: 3 * time.Minute,
	})
	return out
}

func withBursts(w Workload) Workload {
	w.Bursty, w.BurstFactor, w.BurstOn, w.BurstOff = true, 2, 5*time.Second, 15*time.Second
	return w
}

// ScenarioByName returns the scenario called name.
func ScenarioByName(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// PoliciesOf returns the policies a scenario compares.
func PoliciesOf(s Scenario) []string {
	if len(s.Policies) > 0 {
		return s.Policies
	}
	return StandardPolicies
}
