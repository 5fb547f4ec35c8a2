package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// eventKind is what a scheduled event does.
type eventKind uint8

const (
	evArrival    eventKind = iota + 1 // a new request reaches a router
	evAnswer                          // a backend answers an attempt at once (error or 429)
	evFirstToken                      // an attempt's first token
	evDone                            // an attempt's last token
	evTimeout                         // the client gives up waiting for a first token
	evHeartbeat                       // analyzer evaluation, snapshots to routers, sampling
	evUrgent                          // an evaluation asked for by Observe
	evSample                          // occupancy sampling
	evDrift                           // the drift probe detects a changed artefact
	evStall                           // the router's first-token deadline (stall.go)
	evScrape                          // a read of backend b's load (Scenario.ScrapeInterval)
)

// event is one entry of the event queue; ties in time go by seq, so a run
// is deterministic for a seed.
type event struct {
	at   float64 // virtual ms
	seq  uint64
	kind eventKind
	att  *attempt
	req  *request
	b    int
}

// eventQueue is a binary min-heap of events by (at, seq).
type eventQueue struct{ items []event }

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *eventQueue) push(e event) {
	q.items = append(q.items, e)
	i := len(q.items) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

func (q *eventQueue) pop() event {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items = q.items[:last]
	i := 0
	for {
		l, r, small := 2*i+1, 2*i+2, i
		if l < last && q.less(l, small) {
			small = l
		}
		if r < last && q.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		q.items[i], q.items[small] = q.items[small], q.items[i]
		i = small
	}
	return top
}

// request is one client request; it may make several attempts.
type request struct {
	id           int
	router       int
	arrival      float64
	promptTokens int
	outputTokens int
	prefix       uint64
	hasPrefix    bool
	blocks       []uint64 // the prompt's KV blocks as prefix keys (a trace's), nil for none
	attempts     int
	finished     bool
}

// attempt is one try of a request on one backend.
type attempt struct {
	req        *request
	backend    int
	sent       float64
	firstToken float64
	gotFirst   bool
	done       bool
	inSlot     bool // holds a slot (started), as opposed to waiting or answered
	queued     bool
	cacheHit   bool
	stalled    bool
	quota      bool // a 429 of a Throttle incident (a quota, with a retry hint), not of a full queue
	status     int
	outcome    fleetwatch.Outcome
}

// backend is a simulated server's state.
type backend struct {
	spec        BackendSpec
	busy        int
	queue       []*attempt // FIFO; entries that timed out are skipped
	queueHead   int
	waiting     int // queued attempts still waiting
	cache       lru
	kv          *blockCache // nil without KVBlocks
	lastServed  float64
	served      bool
	fingerprint string
	// incidents of this backend, in scenario order.
	incidents []*Incident
	counted   []int // per incident, requests affected so far (Count)
}

// lru is a small least-recently-used set of prefix hashes.
type lru struct {
	keys []uint64 // most recent last
	size int
}

// touch reports whether key was present and makes it the most recent.
func (c *lru) touch(key uint64) bool {
	for i, k := range c.keys {
		if k == key {
			copy(c.keys[i:], c.keys[i+1:])
			c.keys[len(c.keys)-1] = key
			return true
		}
	}
	if len(c.keys) >= c.size {
		copy(c.keys, c.keys[1:])
		c.keys = c.keys[:len(c.keys)-1]
	}
	c.keys = append(c.keys, key)
	return false
}

// drawLogNormal draws from d with rng.
func drawLogNormal(rng *rand.Rand, d Dist) int {
	v := d.Median * math.Exp(d.Sigma*rng.NormFloat64())
	v = math.Max(d.Min, math.Min(d.Max, v))
	return int(math.Round(v))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func dur(msf float64) time.Duration { return time.Duration(msf * float64(time.Millisecond)) }
