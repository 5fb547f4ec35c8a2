package collector

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// rejectLimiter is a token bucket per reject reason: a burst of notices is
// described at once, then at most rate per second, so that a proxy sending
// garbage at full speed cannot turn fw.rejects into a second firehose. It
// also remembers how many rejects each bucket suppressed since its last
// notice, so that the next notice can say so.
type rejectLimiter struct {
	rate  float64 // tokens per second
	burst float64

	// mu guards buckets.
	mu      sync.Mutex
	buckets map[fleetwatch.Reason]*rejectBucket
}

type rejectBucket struct {
	tokens     float64
	last       time.Time
	suppressed int64
}

func newRejectLimiter(rate, burst float64) *rejectLimiter {
	return &rejectLimiter{rate: rate, burst: burst, buckets: make(map[fleetwatch.Reason]*rejectBucket)}
}

// allow reports whether a notice for reason may be published at now, and
// if so, how many were suppressed since the previous one.
func (l *rejectLimiter) allow(reason fleetwatch.Reason, now time.Time) (ok bool, suppressed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[reason]
	if b == nil {
		b = &rejectBucket{tokens: l.burst, last: now}
		l.buckets[reason] = b
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+elapsed.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// refuse rejects a valid event the sink refused. Its subject is not known
// here (a batch gathers the events of many messages), so the notice's
// subject is empty.
func (c *Collector) refuse(ev *fleetwatch.Event, reason fleetwatch.Reason) {
	err := fleetwatch.ErrTooManyBackends
	if reason == fleetwatch.ReasonTooManyPools {
		err = fleetwatch.ErrTooManyPools
	}
	c.reject("", &pendingReject{err: err, reason: reason, source: ev.Source, event: ev})
}

// reject counts a rejected event and, within the rate limit, describes it on
// fw.rejects. It never blocks on the network beyond nats.go's buffered
// Publish and never fails the pipeline: a notice that cannot be published
// is only counted as suppressed.
func (c *Collector) reject(subject string, r *pendingReject) {
	// The per-source series first: a reader that sees the per-reason total
	// (Stats) then sees every source's share of it too.
	c.m.rejectBySource(r.reason, r.source).Inc()
	c.m.reject(r.reason).Inc()
	now := c.settings.Now()
	ok, suppressed := c.rejects.allow(r.reason, now)
	if !ok {
		c.m.rejectsSuppressed.Inc()
		return
	}
	if r.event != nil && r.sample == "" {
		sample := fleetwatch.AppendEvent(nil, r.event)
		r.sample = string(sample[:min(len(sample), fleetwatch.MaxSampleLen)])
	}
	notice := fleetwatch.Reject{
		V:          fleetwatch.ProtocolVersion,
		At:         fleetwatch.At(now),
		Reason:     r.err.Error(),
		Code:       r.reason,
		Subject:    subject,
		Source:     r.source,
		Sample:     r.sample,
		Suppressed: suppressed,
	}
	data, err := json.Marshal(&notice)
	if err == nil {
		err = c.nc.Publish(c.subjects.Rejects(), data)
	}
	if err != nil {
		c.m.rejectsSuppressed.Inc()
		return
	}
	c.m.rejectsPublished.Inc()
}
