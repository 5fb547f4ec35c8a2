package serve

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/ha"
)

// The partitions' events (internal/ha has the leases and the takeover).
//
// Every instance runs a collector in the queue group, so any of them may
// take an event of any pool. The collector republishes what it accepted on
// fw.partition.<n> (Settings.StreamSubject), which FW_OUTCOMES captures and
// the partition's owner subscribes to. The owner observes the events its own
// collector took at once (haSink) and skips its own batches on the
// partition subject (they carry its id in the Fw-Origin header); it observes
// the batches of the other instances' collectors.

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

// haSink is the collector's sink with partitions: the events of the
// partitions this instance decides go to the analyzer at once; the others
// are left to their owner, who receives them on the partition subject.
type haSink struct {
	leases    *ha.Manager
	forwarded *metrics.Counter
	an        *analyzer.Analyzer
	scratch   sync.Pool // *sinkScratch
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
	v := k.leases.View()
	if v == nil {
		return k.an.ObserveRefusing(batch, refused)
	}
	n := k.leases.Partitions()
	all := true
	for i := range batch {
		if !v.Live(fleetwatch.PartitionOf(batch[i].Pool, n)) {
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
		if v.Live(fleetwatch.PartitionOf(batch[i].Pool, n)) {
			sc.events = append(sc.events, batch[i])
			sc.index = append(sc.index, i)
		}
	}
	k.forwarded.Add(len(batch) - len(sc.events))
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
	body := fmt.Sprintf(`{"instance":%q,"jetstream":%t}`, s.leases.ID(), s.js != nil)
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
