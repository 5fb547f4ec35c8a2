package sim

import (
	"math/rand/v2"

	"github.com/fleetwatch/fleetwatch"
)

// Prefix-cache policies for trace replays with KV blocks (docs/EVALUATION.md,
// "Real traces").
const (
	// PrecisePrefix is a perfect-knowledge precise-prefix scorer in the
	// style of llm-d's scheduler with exact cache state: every backend is
	// scored PrefixWeight x (the request's leading blocks cached there /
	// its blocks) + QueueWeight x (maxLoad - load) / (maxLoad - minLoad),
	// load being the backend's true running + waiting requests, and the
	// best score wins (ties at random).
	PrecisePrefix = "precise-prefix"
	// SGLangCache is an approximate cache-aware router in the style of
	// SGLang's: each router keeps, per backend, an LRU tree (a set of
	// prefix keys) of the blocks it sent there, and its own in-flight
	// counts. When its loads are imbalanced (max - min > SGLangAbsThreshold
	// and max > SGLangRelThreshold x min) it sends to its least loaded
	// backend; otherwise to the backend with the longest prefix match when
	// the match covers more than SGLangCacheThreshold of the request's
	// blocks, else to the backend with the smallest tree. The chosen
	// backend's tree gets the request's blocks.
	SGLangCache = "sglang-cache"
)

// The precise-prefix scorer's weights: after llm-d's example configuration
// of its prefix-cache and queue scorers (3 and 2).
const (
	PrefixWeight = 3.0
	QueueWeight  = 2.0
)

// The SGLang-style router's thresholds: its cache threshold and relative
// balance threshold as sgl-router's defaults (0.3, 1.5); the absolute
// threshold (64 requests there, for servers with hundreds of running
// sequences) scaled to the simulated backends: 8, one backend's slots.
const (
	SGLangCacheThreshold = 0.3
	SGLangAbsThreshold   = 8
	SGLangRelThreshold   = 1.5
)

// TracePolicies are compared on a trace replay unless --policies says
// otherwise.
var TracePolicies = []string{RoundRobin, LeastConn, Fleetwatch, PrecisePrefix, SGLangCache}

func init() {
	PolicyDescriptions[PrecisePrefix] = "perfect knowledge: 3 x cached leading-block share + 2 x normalised spare queue (true running + waiting), best wins (llm-d's precise prefix scorer with exact cache state)"
	PolicyDescriptions[SGLangCache] = "per-router LRU tree of the blocks it sent per backend; own least-loaded when imbalanced (> 8 and > 1.5x), else the longest match above 30% of the blocks, else the smallest tree (SGLang's cache-aware router)"
}

// newPrefixRouter returns the router of a prefix-cache policy, or nil.
func newPrefixRouter(name string, e env) router {
	n := len(e.ids)
	switch name {
	case PrecisePrefix:
		return &precisePrefix{backends: e.backends, rng: e.rng, score: make([]float64, n)}
	case SGLangCache:
		p := &sglangCache{inFlight: make([]int, n), rng: e.rng}
		for _, be := range e.backends {
			// The tree holds what the backend's cache could: its KV
			// capacity (sgl-router bounds its tree by size too).
			p.trees = append(p.trees, newBlockCache(max(be.spec.KVBlocks, 1)))
		}
		return p
	}
	return nil
}

type precisePrefix struct {
	backends []*backend
	rng      *rand.Rand
	score    []float64
}

func (p *precisePrefix) pick(req *request, exclude int) (int, error) {
	n := len(p.backends)
	lo, hi := -1, -1
	for b, be := range p.backends {
		if b == exclude && n > 1 {
			continue
		}
		l := be.busy + be.waiting
		if lo < 0 || l < lo {
			lo = l
		}
		hi = max(hi, l)
	}
	best, ties := -1, 0
	for b, be := range p.backends {
		if b == exclude && n > 1 {
			continue
		}
		prefix := 0.0
		if len(req.blocks) > 0 && be.kv != nil {
			prefix = float64(be.kv.leading(req.blocks)) / float64(len(req.blocks))
		}
		queue := 1.0
		if hi > lo {
			queue = float64(hi-(be.busy+be.waiting)) / float64(hi-lo)
		}
		s := PrefixWeight*prefix + QueueWeight*queue
		switch {
		case best < 0 || s > p.score[best]:
			best, ties = b, 1
		case s == p.score[best]:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = b
			}
		}
		p.score[b] = s
	}
	return best, nil
}
func (p *precisePrefix) start(int)                   {}
func (p *precisePrefix) finish(*attempt, float64)    {}
func (p *precisePrefix) update(*fleetwatch.Snapshot) {}

type sglangCache struct {
	inFlight []int
	trees    []*blockCache
	rng      *rand.Rand
}

func (p *sglangCache) pick(req *request, exclude int) (int, error) {
	n := len(p.inFlight)
	skip := func(b int) bool { return b == exclude && n > 1 }
	lo, hi := -1, -1
	for b, l := range p.inFlight {
		if skip(b) {
			continue
		}
		if lo < 0 || l < lo {
			lo = l
		}
		hi = max(hi, l)
	}
	imbalanced := hi-lo > SGLangAbsThreshold && float64(hi) > SGLangRelThreshold*float64(lo)
	var b int
	switch {
	case imbalanced || len(req.blocks) == 0:
		b = p.argmin(skip, func(b int) int { return p.inFlight[b] })
	default:
		match, best, ties := -1, -1, 0
		for c, t := range p.trees {
			if skip(c) {
				continue
			}
			switch m := t.leading(req.blocks); {
			case m > match:
				match, best, ties = m, c, 1
			case m == match:
				ties++ // a prefix several backends hold: any of them
				if p.rng.IntN(ties) == 0 {
					best = c
				}
			}
		}
		if float64(match)/float64(len(req.blocks)) > SGLangCacheThreshold {
			b = best
		} else {
			b = p.argmin(skip, func(b int) int { return p.trees[b].size() })
		}
	}
	if len(req.blocks) > 0 {
		p.trees[b].use(req.blocks)
	}
	return b, nil
}

// argmin is the backend with the least v, ties at random.
func (p *sglangCache) argmin(skip func(int) bool, v func(int) int) int {
	best, ties := -1, 0
	for b := range p.inFlight {
		if skip(b) {
			continue
		}
		switch {
		case best < 0 || v(b) < v(best):
			best, ties = b, 1
		case v(b) == v(best):
			ties++
			if p.rng.IntN(ties) == 0 {
				best = b
			}
		}
	}
	return best
}

func (p *sglangCache) start(b int)                  { p.inFlight[b]++ }
func (p *sglangCache) finish(a *attempt, _ float64) { p.inFlight[a.backend]-- }
func (p *sglangCache) update(*fleetwatch.Snapshot)  {}
