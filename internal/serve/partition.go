package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// The partitions' events and their takeover.
//
// Every instance runs a collector in the queue group, so any of them may
// take an event of any pool. The collector republishes what it accepted on
// fw.partition.<n> (Settings.StreamSubject), which FW_OUTCOMES captures and
// the partition's owner subscribes to. The owner observes the events its own
// collector took at once (haSink) and skips its own batches on the
// partition subject (they carry its id in the Fw-Origin header); it observes
// the batches of the other instances' collectors. An instance that takes a
// partition over rebuilds it apart (takeOver) before it publishes any of its
// pools, buffering the partition's batches meanwhile.

// maxBufferedBytes bounds the partition batches held during rebuilds.
const maxBufferedBytes = 256 << 20

// onPartition handles one batch of partition p's events.
func (h *ha) onPartition(p int, m *nats.Msg) {
	h.mu.Lock()
	l := h.leases[p]
	if l == nil {
		h.mu.Unlock()
		return
	}
	if l.state == stateRestoring {
		if h.bufferedBytes+len(m.Data) > maxBufferedBytes {
			h.mu.Unlock()
			h.dropped.Inc() // the events are in FW_OUTCOMES; the rebuild is taking too long
			return
		}
		h.bufferedBytes += len(m.Data)
		l.buffer = append(l.buffer, m)
		h.mu.Unlock()
		h.buffered.Inc()
		return
	}
	h.mu.Unlock()
	if m.Header.Get(originHeader) == h.id {
		h.ownSkipped.Inc() // observed already, by haSink
		return
	}
	h.observeBatch(m.Data)
}

// observeBatch decodes an NDJSON batch and hands it to the analyzer.
func (h *ha) observeBatch(data []byte) {
	var dec fleetwatch.Decoder
	batch := make([]fleetwatch.Event, 0, 64)
	dec.DecodeBatch(data, func(_ []byte, ev *fleetwatch.Event, err error) {
		if err != nil {
			h.malformed.Inc()
			return
		}
		batch = append(batch, *ev)
	})
	if len(batch) == 0 {
		return
	}
	h.fromOthers.Add(len(batch))
	if h.s.an.Observe(batch) {
		h.s.signalUrgent()
	}
}

// takeOver rebuilds the partitions got before their pools are published:
// their last snapshots from fw_decisions, the outcome stream replayed for
// them from one window before the oldest snapshot (evaluating at event
// time) into an analyzer of their own, the snapshots' breakers, trip counts
// and weights laid over the replay (analyzer.Restore: an open breaker never
// closes early), and only then their pools adopted by the instance's
// analyzer and the partitions made live. first is the start of the
// instance, which also replays the per-pool subject of earlier versions.
func (h *ha) takeOver(ctx context.Context, got []int, first bool) {
	if len(got) == 0 {
		return
	}
	start := time.Now()
	s := h.s
	mine := make(map[int]bool, len(got))
	for _, p := range got {
		mine[p] = true
	}
	inGot := func(pool string) bool { return mine[fleetwatch.PartitionOf(pool, h.n)] }
	scratch, snaps, n, ok := h.rebuild(ctx, got, first, start, inGot)
	if !ok {
		return
	}
	r := scratch.Restore(snaps, time.Now())
	held, adopted, pending := h.goLive(got, mine, scratch)
	// The pools' drift states as their previous owner last stored them
	// (the restored snapshots carry the statuses already; this brings the
	// CUSUM, cooldown and quarantine, which the probes of this instance
	// did not follow while another owned the pools).
	if !first && len(adopted) > 0 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.restoreDrift(rctx, adopted); err != nil && !errors.Is(err, errNoDriftProbes) {
			s.logf("ha: restoring the drift states of %v: %v", adopted, err)
		}
		cancel()
	}
	d := time.Since(start)
	h.takeover.Update(d.Seconds())
	h.mu.Lock()
	h.rebuilt = d
	h.mu.Unlock()
	s.logf("ha: took over partitions %v in %v: replayed %d events, restored %d snapshots (%d breakers open, %d half-open, %d weights), %d pools, %d batches buffered",
		sortedKeys(held), d.Round(time.Millisecond), n, len(snaps), r.Open, r.HalfOpen, r.Weights, len(adopted), pending)
	s.signalUrgent()
}

// rebuild is a takeover's reading: the partitions' last snapshots and
// their events replayed from one window before the oldest of them, into a
// scratch analyzer. A later takeover (not the first) abandons the
// partitions when either read fails (ok false); the first starts from
// what it could read.
func (h *ha) rebuild(ctx context.Context, got []int, first bool, start time.Time, inGot func(string) bool) (_ *analyzer.Analyzer, _ []fleetwatch.Snapshot, replayed int, ok bool) {
	s := h.s
	subjects := make([]string, 0, len(got)+1)
	for _, p := range got {
		subjects = append(subjects, s.subj.Partition(p))
	}
	if first {
		subjects = append(subjects, s.subj.AcceptedWildcard())
	}
	scratch, err := analyzer.New(s.config().AnalyzerSettings(s.seed))
	if err != nil { // the configuration was validated: cannot happen
		s.logf("ha: takeover of %v: %v", got, err)
		return nil, nil, 0, false
	}
	snaps, err := s.lastSnapshots(ctx, inGot)
	if err != nil {
		if !first {
			h.abandon(ctx, got, fmt.Sprintf("reading %s: %v", s.subj.BucketDecisions(), err))
			return nil, nil, 0, false
		}
		s.logf("restore: %v (starting from the outcome stream alone)", err)
	}
	since := start.Add(-s.window)
	for _, snap := range snaps {
		if from := snap.At.Add(-s.window); from.Before(since) {
			since = from
		}
	}
	rp := newReplayer(scratch, inGot, snaps)
	n, err := s.col.ReplaySubjects(ctx, since, subjects, rp.batch)
	if err != nil {
		if !first {
			h.abandon(ctx, got, fmt.Sprintf("replaying %s: %v", s.subj.StreamOutcomes(), err))
			return nil, nil, 0, false
		}
		s.logf("replay: %v (starting with what was replayed, if anything)", err)
	}
	return scratch, snaps, n, true
}

// replayer feeds a takeover's replayed batches to its scratch analyzer,
// evaluating at each batch's last event time, as the live loop would have,
// and also at each restored snapshot's time when a batch passes it. The
// snapshot decided on every event up to its at, and analyzer.Restore lets a
// trip the replay made no later than that at give way to the snapshot's
// (same trip, same open_until for the routers); a trip dated at the end of
// a batch that straddles at looked like a trip on later events, and the
// new owner published an open_until a few milliseconds later than the
// one routers had (TestHAOnAThreeNodeCluster saw 8 ms under load).
type replayer struct {
	scratch *analyzer.Analyzer
	inGot   func(pool string) bool
	marks   []time.Time // the snapshots' times not passed yet, ascending
	keep    []fleetwatch.Event
}

func newReplayer(scratch *analyzer.Analyzer, inGot func(string) bool, snaps []fleetwatch.Snapshot) *replayer {
	r := &replayer{scratch: scratch, inGot: inGot}
	for _, snap := range snaps {
		r.marks = append(r.marks, snap.At.Time)
	}
	slices.SortFunc(r.marks, time.Time.Compare)
	return r
}

// batch observes the events of batch whose pools are in the partitions.
func (r *replayer) batch(batch []fleetwatch.Event) {
	r.keep = r.keep[:0]
	for i := range batch {
		if r.inGot(batch[i].Pool) {
			r.keep = append(r.keep, batch[i])
		}
	}
	keep := r.keep
	for len(keep) > 0 {
		cut := len(keep)
		if len(r.marks) > 0 {
			cut = slices.IndexFunc(keep, func(ev fleetwatch.Event) bool { return ev.TS.After(r.marks[0]) })
			if cut < 0 {
				cut = len(keep)
			}
		}
		if cut > 0 {
			r.scratch.Observe(keep[:cut])
		}
		if cut == len(keep) {
			r.scratch.Evaluate(keep[cut-1].TS)
			return
		}
		// The events up to the next snapshot are observed: evaluate at
		// its time before the events after it.
		r.scratch.Evaluate(r.marks[0])
		r.marks = r.marks[1:]
		keep = keep[cut:]
	}
}

// goLive adopts the pools of the partitions still held from scratch, turns
// them live and applies the batches buffered meanwhile; the pools adopted
// for a partition lost during the rebuild are forgotten. It returns the
// partitions that went live, the pools adopted, and how many batches were
// buffered.
func (h *ha) goLive(got []int, mine map[int]bool, scratch *analyzer.Analyzer) (held map[int]bool, adopted []string, buffered int) {
	s := h.s
	h.mu.Lock()
	held = map[int]bool{}
	for _, p := range got {
		if l := h.leases[p]; l != nil && l.state == stateRestoring {
			held[p] = true
		}
	}
	h.mu.Unlock()
	adopted = s.an.Adopt(scratch, func(pool string) bool { return held[fleetwatch.PartitionOf(pool, h.n)] })
	var pending [][]byte
	h.mu.Lock()
	for p := range held {
		if l := h.leases[p]; l != nil && l.state == stateRestoring {
			l.state = stateLive
			for _, m := range l.buffer {
				pending = append(pending, m.Data)
				h.bufferedBytes -= len(m.Data)
			}
			l.buffer = nil
		} else {
			delete(held, p)
		}
	}
	h.publishViewLocked()
	h.mu.Unlock()
	s.an.Forget(func(pool string) bool {
		p := fleetwatch.PartitionOf(pool, h.n)
		return mine[p] && !held[p]
	})
	for _, data := range pending {
		h.observeBatch(data)
	}
	return held, adopted, len(pending)
}

// abandon gives up partitions whose rebuild failed (the decisions bucket or
// the stream could not be read): going live on them could close an open
// breaker early or open one on partial data. Their leases are deleted, so
// that this or another instance tries again at once.
func (h *ha) abandon(ctx context.Context, got []int, why string) {
	h.mu.Lock()
	revs := map[int]uint64{}
	for _, p := range got {
		if l := h.leases[p]; l != nil && l.state == stateRestoring {
			revs[p] = l.rev
			h.loseLocked(p, "rebuild failed: "+why)
		}
	}
	h.mu.Unlock()
	for p, rev := range revs {
		c, cancel := context.WithTimeout(ctx, h.ttl/3)
		_ = h.kv.Delete(c, leaseKey(p), jetstream.LastRevision(rev))
		cancel()
	}
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for p := 0; len(out) < len(m); p++ {
		if m[p] {
			out = append(out, p)
		}
	}
	return out
}

// haSink is the collector's sink with partitions: the events of the
// partitions this instance decides go to the analyzer at once; the others
// are left to their owner, who receives them on the partition subject.
type haSink struct {
	h       *ha
	an      *analyzer.Analyzer
	scratch sync.Pool // *sinkScratch
}

type sinkScratch struct {
	events []fleetwatch.Event
	index  []int
}

// Observe implements collector.Sink.
func (k *haSink) Observe(batch []fleetwatch.Event) bool {
	urgent, _ := k.ObserveRefusing(batch, nil)
	return urgent
}

// ObserveRefusing implements collector.RefusingSink.
func (k *haSink) ObserveRefusing(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (bool, []fleetwatch.Refusal) {
	v := k.h.view.Load()
	if v == nil {
		return k.an.ObserveRefusing(batch, refused)
	}
	all := true
	for i := range batch {
		if !v.live[fleetwatch.PartitionOf(batch[i].Pool, k.h.n)] {
			all = false
			break
		}
	}
	if all {
		return k.an.ObserveRefusing(batch, refused)
	}
	sc, _ := k.scratch.Get().(*sinkScratch)
	if sc == nil {
		sc = &sinkScratch{}
	}
	for i := range batch {
		if v.live[fleetwatch.PartitionOf(batch[i].Pool, k.h.n)] {
			sc.events = append(sc.events, batch[i])
			sc.index = append(sc.index, i)
		}
	}
	k.h.forwarded.Add(len(batch) - len(sc.events))
	var urgent bool
	if len(sc.events) > 0 {
		from := len(refused)
		urgent, refused = k.an.ObserveRefusing(sc.events, refused)
		for j := from; j < len(refused); j++ {
			refused[j].Index = sc.index[refused[j].Index]
		}
	}
	clear(sc.events)
	sc.events, sc.index = sc.events[:0], sc.index[:0]
	k.scratch.Put(sc)
	return urgent, refused
}

// presence answers the presence requests of other instances on the prefix.
func (s *Server) answerPresence() (*nats.Subscription, error) {
	body := fmt.Sprintf(`{"instance":%q,"jetstream":%t}`, s.ha.id, s.js != nil)
	sub, err := s.nc.Subscribe(s.subj.Presence(), func(m *nats.Msg) { _ = m.Respond([]byte(body)) })
	if err != nil {
		return nil, err
	}
	// The server has the subscription before the instance says it is
	// ready: a second instance started then is answered.
	if err := s.nc.Flush(); err != nil {
		s.logf("presence: %v", err)
	}
	return sub, nil
}
