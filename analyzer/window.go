package analyzer

import (
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// window is a sliding window over event time: a ring of buckets, each
// covering one Bucket of time (gobreaker's rolling counts, grpc-go's
// callcounter). Bucket number n covers [n*bucket, (n+1)*bucket) since the Unix
// epoch; the window holds the buckets (head-size, head].
//
// The hot path (add) touches one bucket and the running totals; the totals
// are kept equal to the sum of the live buckets by subtracting a bucket when
// it leaves the window, so evaluation reads them in O(1) (the TTFT histogram
// in O(bins)).
//
// Latency samples of a bucket are kept as a list of bin numbers (2 bytes per
// sample) until the bucket holds denseAfter of them, and as a dense histogram
// after that; either way the bucket can be subtracted exactly when it
// expires. A quiet backend so costs a few bytes per sample, a busy one at
// most one dense histogram per bucket.
type window struct {
	bucketNanos int64
	buckets     []bucket
	head        int64 // newest bucket number; valid only when started
	started     bool

	counts [fleetwatch.NumOutcomes]uint64 // totals over the live buckets
	hinted uint64                         // the 429s with a retry hint among them
	ttft   *histogram                     // totals over the live buckets; nil until the first sample

	// The client errors by status class (statusclass.go): per bucket,
	// indexed like buckets, and their totals over the live buckets. status
	// is nil until the window's first client error, so a backend that
	// never answers 4xx pays nothing for it and the bucket stays 80 bytes.
	status      []statusCounts
	statusTotal statusCounts
}

// denseAfter is the number of samples of one bucket above which its samples
// are folded into a dense histogram (2 x 512 bytes of bin numbers is below the
// dense histogram's 1.5 KiB).
const denseAfter = 512

// bucket is one Bucket of time. Its fields are ordered to keep it at 96
// bytes: 30 of them are most of a quiet backend's memory. (It was 88 until
// hinted, the count of hinted 429s, took it over; whether its samples are
// in dense is derived, isDense, rather than a bool.)
type bucket struct {
	num          int64      // bucket number; meaningful only while the bucket is not empty
	samples      []uint16   // bins of the latency samples, until dense
	dense        *histogram // samples beyond denseAfter (kept for reuse once allocated)
	counts       [fleetwatch.NumOutcomes]uint32
	sampleCounts uint32
	maxRetryMs   float32
	// sent and sentClientErr count the answered requests (counted and
	// client errors) and the client errors among them by when the request
	// was sent (ts - duration_ms), not by when it was answered: the
	// client-error rule compares backends on the requests sent to them in
	// the same span (clienterr.go).
	sent          uint32
	sentClientErr uint32
	// hinted counts the 429s with a retry hint among counts' throttled
	// (Settings.ThrottleRateCounts).
	hinted uint32
}

// isDense reports whether the bucket's samples are in dense: they were
// folded there (samples emptied) when the list was full, so from then on
// the bucket counts more samples than its list holds.
func (b *bucket) isDense() bool { return b.sampleCounts > uint32(len(b.samples)) }

func (b *bucket) empty() bool {
	return b.sampleCounts == 0 && b.sent == 0 && b.counts == [fleetwatch.NumOutcomes]uint32{}
}

// newWindow returns a window of size buckets of the given length.
func newWindow(size int, bucketLen time.Duration) window {
	return window{bucketNanos: int64(bucketLen), buckets: make([]bucket, size)}
}

// bucketOf returns the bucket number of t.
func (w *window) bucketOf(t time.Time) int64 { return w.bucketOfNanos(t.UnixNano()) }

// bucketOfNanos returns the bucket number of n nanoseconds since the Unix
// epoch.
func (w *window) bucketOfNanos(n int64) int64 {
	if n < 0 {
		return (n - w.bucketNanos + 1) / w.bucketNanos
	}
	return n / w.bucketNanos
}

func (w *window) size() int64 { return int64(len(w.buckets)) }

// advance moves the head to bucket number num, evicting the buckets that
// leave the window. A num at or behind the head changes nothing.
func (w *window) advance(num int64) {
	if !w.started {
		w.head, w.started = num, true
		return
	}
	if num <= w.head {
		return
	}
	if num-w.head >= w.size() {
		for i := range w.buckets {
			w.evict(i)
		}
	} else {
		for n := w.head + 1; n <= num; n++ {
			w.evict(w.index(n))
		}
	}
	w.head = num
}

func (w *window) slot(num int64) *bucket { return &w.buckets[w.index(num)] }

// index is the position of bucket number num in the ring.
func (w *window) index(num int64) int {
	i := num % w.size()
	if i < 0 {
		i += w.size()
	}
	return int(i)
}

// evict subtracts the bucket at index i from the totals and empties it.
func (w *window) evict(i int) {
	b := &w.buckets[i]
	if b.empty() {
		return
	}
	for o, c := range b.counts {
		w.counts[o] -= uint64(c)
	}
	w.hinted -= uint64(b.hinted)
	if w.status != nil && b.counts[fleetwatch.OutcomeClientError] > 0 {
		st := &w.status[i]
		for k, c := range st {
			w.statusTotal[k] -= c
		}
		*st = statusCounts{}
	}
	for _, bin := range b.samples {
		w.ttft.remove(bin)
	}
	if b.isDense() {
		w.ttft.subAll(b.dense)
		*b.dense = histogram{}
	}
	b.counts = [fleetwatch.NumOutcomes]uint32{}
	b.sent, b.sentClientErr = 0, 0
	b.samples = b.samples[:0]
	b.maxRetryMs = 0
	b.hinted = 0
	b.sampleCounts = 0
}

// accepts reports whether an event in bucket num would be counted: it is
// not older than the window.
func (w *window) accepts(num int64) bool { return !w.started || num > w.head-w.size() }

// add counts one event in bucket num, moving the head forward when num is
// newer. latency tells whether bin is a TTFT sample. It returns false (and
// counts nothing) when num is older than the window.
func (w *window) add(num int64, outcome fleetwatch.Outcome, latency bool, bin uint16, retryAfterMs float64) bool {
	w.advance(num)
	if num <= w.head-w.size() {
		return false
	}
	b := w.slot(num)
	b.num = num
	b.counts[outcome]++
	w.counts[outcome]++
	if r := float32(retryAfterMs); r > b.maxRetryMs {
		b.maxRetryMs = r
	}
	if outcome == fleetwatch.OutcomeThrottled && retryAfterMs > 0 {
		b.hinted++
		w.hinted++
	}
	if latency {
		if w.ttft == nil {
			w.ttft = new(histogram)
		}
		w.ttft.add(bin)
		dense := b.isDense()
		b.sampleCounts++
		if dense {
			b.dense.add(bin)
		} else if len(b.samples) < denseAfter {
			b.samples = append(b.samples, bin)
		} else {
			if b.dense == nil {
				b.dense = new(histogram)
			}
			for _, s := range b.samples {
				b.dense.add(s)
			}
			b.dense.add(bin)
			b.samples = b.samples[:0]
		}
	}
	return true
}

// reset empties the window (a new breaker generation starts from nothing).
func (w *window) reset() {
	for i := range w.buckets {
		w.evict(i)
	}
}

// addSent counts an answered request in the bucket of its sending, num,
// which is not newer than the head (add has moved the head to the
// answer's bucket); a request sent before the window is not counted.
func (w *window) addSent(num int64, clientErr bool) {
	if !w.started || num <= w.head-w.size() || num > w.head {
		return
	}
	b := w.slot(num)
	if b.empty() {
		b.num = num
	}
	b.sent++
	if clientErr {
		b.sentClientErr++
	}
}

// sentIn is the answered requests sent in bucket num and the client
// errors among them (0 when num is not in the window).
func (w *window) sentIn(num int64) (sent, clientErr uint32) {
	if !w.started || num <= w.head-w.size() || num > w.head {
		return 0, 0
	}
	b := w.slot(num)
	if b.empty() || b.num != num {
		return 0, 0
	}
	return b.sent, b.sentClientErr
}

// addClientStatus counts the status class of a client error that add has
// just counted in bucket num.
func (w *window) addClientStatus(num int64, status int) {
	if num <= w.head-w.size() {
		return
	}
	if w.status == nil {
		w.status = make([]statusCounts, len(w.buckets))
	}
	k := classOf(status)
	w.status[w.index(num)][k]++
	w.statusTotal[k]++
}

// windowStats is what the rules read from a window.
type windowStats struct {
	counts     [fleetwatch.NumOutcomes]uint64
	requests   uint64 // all outcomes
	counted    uint64 // ok + error + timeout + stalled + throttled
	hinted     uint64 // the throttled with a retry hint
	maxRetryMs float64

	// sent and sentClientErr: the answered requests sent in the span and
	// the client errors among them (recent only; bucket.sent).
	sent, sentClientErr uint64
}

// sentClientErrorRate is the client-error rate of the requests sent in the
// span and answered; ok is false when none was.
func (s *windowStats) sentClientErrorRate() (float64, bool) {
	if s.sent == 0 {
		return 0, false
	}
	return float64(s.sentClientErr) / float64(s.sent), true
}

func (s *windowStats) clientErrors() uint64 { return s.counts[fleetwatch.OutcomeClientError] }

// answered is the denominator of the client-error rate and of that rule's
// gate: the counted requests and the client errors.
func (s *windowStats) answered() uint64 { return s.counted + s.clientErrors() }

// clientErrorRate is client_error / (counted + client_error); ok is false
// when that is 0/0.
func (s *windowStats) clientErrorRate() (float64, bool) {
	d := s.answered()
	if d == 0 {
		return 0, false
	}
	return float64(s.clientErrors()) / float64(d), true
}

func (s *windowStats) ok() uint64        { return s.counts[fleetwatch.OutcomeOK] }
func (s *windowStats) throttled() uint64 { return s.counts[fleetwatch.OutcomeThrottled] }
func (s *windowStats) failures() uint64 {
	return s.counts[fleetwatch.OutcomeError] + s.counts[fleetwatch.OutcomeTimeout] + s.counts[fleetwatch.OutcomeStalled]
}

// successRate is ok / (ok + error + timeout); ok is false when that is 0/0.
func (s *windowStats) successRate() (float64, bool) {
	d := s.ok() + s.failures()
	if d == 0 {
		return 0, false
	}
	return float64(s.ok()) / float64(d), true
}

// failureRate is 1 - successRate.
func (s *windowStats) failureRate() (float64, bool) {
	d := s.ok() + s.failures()
	if d == 0 {
		return 0, false
	}
	return float64(s.failures()) / float64(d), true
}

// tripRate429 is the 429 rate the breaker opens on: of the 429s with a
// retry hint with RunCountsHinted, of every 429 with RunCountsAll (the
// denominator is counted either way).
func (s *windowStats) tripRate429(counts string) (float64, bool) {
	if counts == RunCountsAll {
		return s.rate429()
	}
	if s.counted == 0 {
		return 0, false
	}
	return float64(s.hinted) / float64(s.counted), true
}

// rate429 is throttled / (ok + error + timeout + throttled).
func (s *windowStats) rate429() (float64, bool) {
	if s.counted == 0 {
		return 0, false
	}
	return float64(s.throttled()) / float64(s.counted), true
}

// stats reads the totals and the largest retry-after. The caller advances
// the window to now first.
func (w *window) stats() windowStats {
	var s windowStats
	s.counts = w.counts
	s.hinted = w.hinted
	for o, c := range w.counts {
		s.requests += c
		if fleetwatch.Outcome(o).Counted() {
			s.counted += c
		}
	}
	if w.started && s.counts[fleetwatch.OutcomeThrottled] > 0 {
		for i := range w.buckets {
			b := &w.buckets[i]
			if r := float64(b.maxRetryMs); !b.empty() && b.num > w.head-w.size() && r > s.maxRetryMs {
				s.maxRetryMs = r
			}
		}
	}
	return s
}

// recent sums the counts of the newest n buckets of the window (the
// recent part the trip rules confirm a rate on).
func (w *window) recent(n int64) windowStats {
	var s windowStats
	if !w.started {
		return s
	}
	for i := range w.buckets {
		b := &w.buckets[i]
		if b.empty() || b.num <= w.head-n || b.num <= w.head-w.size() {
			continue
		}
		for o, c := range b.counts {
			s.counts[o] += uint64(c)
			s.requests += uint64(c)
			if fleetwatch.Outcome(o).Counted() {
				s.counted += uint64(c)
			}
		}
		s.hinted += uint64(b.hinted)
		s.sent += uint64(b.sent)
		s.sentClientErr += uint64(b.sentClientErr)
	}
	return s
}

// ttftQuantiles returns p50 and p95 of the window's TTFT samples; ok is
// false when it has none. Only snapshots need them, so the rules do not pay
// for them.
func (w *window) ttftQuantiles() (p50, p95 float64, ok bool) {
	var q [2]float64
	if !w.ttft.quantiles([]float64{0.50, 0.95}, q[:]) {
		return 0, 0, false
	}
	return q[0], q[1], true
}
