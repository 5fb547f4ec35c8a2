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
// (extension)"). A pool this instance does not publish is ignored (its
// owner answers).
type resyncs struct {
	s    *Server
	mu   sync.Mutex
	last map[string]time.Time // per pool, the last request answered
}

// subscribe subscribes to every pool's resync subject.
func (r *resyncs) subscribe() (*nats.Subscription, error) {
	r.last = map[string]time.Time{}
	return r.s.nc.Subscribe(r.s.subj.ResyncWildcard(), func(m *nats.Msg) {
		pool, ok := r.s.subj.ResyncPool(m.Subject)
		if ok && r.due(pool, time.Now()) && r.s.pub.WantKey(pool) && r.s.an.Resync(pool) {
			r.s.m.resyncs.Inc()
			select { // the evaluation loop, at once
			case r.s.urgency.ch <- struct{}{}:
			default:
			}
		}
	})
}

// due reports whether pool's last request answered is resyncEvery old,
// and notes now as its last.
func (r *resyncs) due(pool string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last, ok := r.last[pool]; ok && now.Sub(last) < resyncEvery {
		return false
	}
	if len(r.last) > 100_000 { // invented pool names: start over
		clear(r.last)
	}
	r.last[pool] = now
	return true
}
