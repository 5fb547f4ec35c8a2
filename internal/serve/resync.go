package serve

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// resyncEvery is how often a pool answers resync requests: a snapshot
// (JSON and key frame) at most once a second, however many routers ask.
const resyncEvery = time.Second

// resyncs answers fw.resync.<pool>: a router that missed frames of the
// compact feed (a reconnect, a gap) asks for a decision snapshot now,
// whose key frame brings every load again (docs/PROTOCOL.md "Compact feed
// (extension)"). A pool answers at once when its last answer is a second
// old, and otherwise once it is, one answer for every request of that
// second: the routers of a lost node reconnect over a second or so, and
// one that reconnected after an answer's key frame went out still gets
// one. A pool this instance does not publish is ignored (its owner
// answers), and leaves nothing behind.
type resyncs struct {
	s       *Server
	mu      sync.Mutex             // guards the rest
	last    map[string]time.Time   // per pool, when a request was last answered
	later   map[string]*time.Timer // per pool, an answer due when its second is over
	stopped bool
}

// subscribe subscribes to every pool's resync subject.
func (r *resyncs) subscribe() (*nats.Subscription, error) {
	r.last, r.later = map[string]time.Time{}, map[string]*time.Timer{}
	return r.s.nc.Subscribe(r.s.subj.ResyncWildcard(), func(m *nats.Msg) {
		if pool, ok := r.s.subj.ResyncPool(m.Subject); ok {
			r.request(pool, time.Now())
		}
	})
}

// request answers pool's request now, or when its last answer is
// resyncEvery old.
func (r *resyncs) request(pool string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.later[pool] != nil {
		return
	}
	last, ok := r.last[pool]
	if !ok || now.Sub(last) >= resyncEvery {
		r.answerLocked(pool, now)
		return
	}
	r.later[pool] = time.AfterFunc(last.Add(resyncEvery).Sub(now), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.later, pool)
		if !r.stopped {
			r.answerLocked(pool, time.Now())
		}
	})
}

// answerLocked asks for pool's snapshot and key frame at the next
// evaluation, and wakes the evaluation loop. Only a pool this instance
// publishes is remembered (invented pool names leave no entry).
func (r *resyncs) answerLocked(pool string, now time.Time) {
	if !r.s.pub.WantKey(pool) || !r.s.an.Resync(pool) {
		return
	}
	r.last[pool] = now
	r.s.m.resyncs.Inc()
	select { // the evaluation loop, at once
	case r.s.urgency.ch <- struct{}{}:
	default:
	}
}

// stop ends the answers due later.
func (r *resyncs) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, t := range r.later {
		t.Stop()
	}
}
