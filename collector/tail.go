package collector

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// The republished tail. The catch-up replays what FW_CAPTURE stored after
// the time of FW_OUTCOMES' last batch. The capture stores an event
// asynchronously, so under load it may store events after the batch that
// republished them (a stopped collector's last events, for one): replayed,
// they would be counted twice. Before replaying, the catch-up reads both
// streams around that time: the events FW_OUTCOMES' batches of the last
// tailSpan republished, less the capture's copies stored before the last
// batch (a multiset: identical events are legitimate), are the events
// decided on whose capture copies are still to come; each capture copy
// stored within tailSpan after the last batch that matches one of them is
// left out of the replay and counted
// (fleetwatch_capture_deduplicated_events_total).
//
// An event matches on every field; on its ts too when the proxy sent one.
// An event without ts was stamped with its arrival when decided on, so its
// capture copy matches the republished event with the nearest ts. Not
// matched, so counted twice as before: an event whose ts the collector
// replaced for skew (its copy carries the proxy's ts), an object spanning
// several lines, a capture copy stored more than tailSpan after the batch.

// tailSpan is how far before FW_OUTCOMES' last batch the catch-up reads
// the republished events, and how far after it it matches capture copies
// against them; the capture's copies are read from twice as far back (a
// batch republishes events received up to tailSpan before it, at most).
const tailSpan = 5 * time.Second

// maxTailEvents bounds the republished events the catch-up matches: past
// it the rest of the tail is not read (its copies are replayed, as
// without the matching), so a huge tail cannot hold the start.
const maxTailEvents = 500_000

// republished is the multiset of republished events whose capture copies
// are still to come, keyed by the event without its ts.
type republished struct {
	last  time.Time // FW_OUTCOMES' last batch: copies stored up to it only take theirs off
	since time.Time // where the replay starts reading copies: 2 x tailSpan before last
	// from is the first sequence the replay reads (set by the caller), pre
	// the messages it read up to last: unless every sequence from from to
	// the first message after last was read (a work queue deletes what
	// was acknowledged), copies are missing from the subtraction, and
	// only events sent with a ts match (tsOnly: the same event to the
	// millisecond), rather than a legitimate event without one left out
	// for the nearest republished copy of a missing one.
	from, pre uint64
	checked   bool
	tsOnly    bool
	dec       fleetwatch.Decoder
	byKey     map[string][]time.Time // the ts of each republished copy
	events    int
	key       []byte
	kept      []byte
}

// keyOf is ev encoded without its ts, in r.key.
func (r *republished) keyOf(ev *fleetwatch.Event) []byte {
	e := *ev
	e.TS = time.Time{}
	r.key = fleetwatch.AppendEvent(r.key[:0], &e)
	return r.key
}

// add counts a republished event.
func (r *republished) add(ev *fleetwatch.Event) {
	k := r.keyOf(ev)
	r.byKey[string(k)] = append(r.byKey[string(k)], ev.TS)
	r.events++
}

// take removes a republished copy of ev, a capture copy stored at at, and
// reports whether there was one: the copy with ev's ts, or without one
// (unless tsOnly), the copy whose ts is nearest at within tailSpan.
func (r *republished) take(ev *fleetwatch.Event, at time.Time) bool {
	if r.tsOnly && ev.TS.IsZero() {
		return false
	}
	k := r.keyOf(ev)
	tss := r.byKey[string(k)]
	best := -1
	for i, ts := range tss {
		if !ev.TS.IsZero() {
			if ts.Equal(ev.TS) {
				best = i
				break
			}
			continue
		}
		if d := absDuration(ts.Sub(at)); d <= tailSpan && (best < 0 || d < absDuration(tss[best].Sub(at))) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	tss[best] = tss[len(tss)-1]
	if tss = tss[:len(tss)-1]; len(tss) == 0 {
		delete(r.byKey, string(k))
	} else {
		r.byKey[string(k)] = tss
	}
	r.events--
	return true
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// filter returns data, a capture message of sequence seq stored at at,
// without the lines
// of events that match a republished copy (taken), and how many it left
// out; -1 for a message stored up to the last batch (before r.last), whose
// events only take their republished copies off the multiset. Lines that
// do not decode are kept: the replay rejects and counts them. The result
// aliases r's buffer until the next call.
func (r *republished) filter(data []byte, at time.Time, seq uint64) ([]byte, int) {
	if r == nil {
		return data, 0
	}
	if !at.After(r.last) {
		r.pre++
		if r.events > 0 {
			r.dec.DecodeBatch(data, func(_ []byte, ev *fleetwatch.Event, err error) {
				if err == nil {
					r.take(ev, at)
				}
			})
		}
		return nil, -1
	}
	if !r.checked {
		r.checked = true
		if seq < r.from || seq-r.from != r.pre {
			r.tsOnly = true // copies missing
		}
	}
	if r.events == 0 || at.After(r.last.Add(tailSpan)) {
		return data, 0
	}
	r.kept = r.kept[:0]
	dropped := 0
	r.dec.DecodeBatch(data, func(line []byte, ev *fleetwatch.Event, err error) {
		if err == nil && r.take(ev, at) {
			dropped++
			return
		}
		r.kept = append(r.kept, line...)
		r.kept = append(r.kept, '\n')
	})
	if dropped == 0 {
		return data, 0
	}
	return r.kept, dropped
}

// readTail returns the multiset of the events FW_OUTCOMES republished in
// the tailSpan up to last (its last batch's time), or nil when there is
// none or it cannot be read (logged: the copies may be replayed, counted
// twice, as without the matching).
func (c *Collector) readTail(ctx context.Context, outcomes jetstream.Stream, last time.Time) *republished {
	r := &republished{last: last, since: last.Add(-2 * tailSpan), byKey: map[string][]time.Time{}}
	// Every message of FW_OUTCOMES is a batch of events: fw.accepted.<pool>,
	// or fw.partition.<n> when serve runs partitions (ha).
	err := readStored(ctx, outcomes, last.Add(-tailSpan), outcomes.CachedInfo().State.LastSeq, func(data []byte) bool {
		r.dec.DecodeBatch(data, func(_ []byte, ev *fleetwatch.Event, err error) {
			if err == nil {
				r.add(ev)
			}
		})
		return r.events < maxTailEvents
	})
	if err != nil {
		c.settings.Logf("collector: catch-up: reading the events republished before %v: %v; copies of events decided on may be replayed (counted twice)", last, err)
		return nil
	}
	if r.events == 0 {
		return nil
	}
	return r
}

// readStored hands fn the messages stream stored from since up to sequence
// upTo, in order, until fn returns false.
func readStored(ctx context.Context, stream jetstream.Stream, since time.Time, upTo uint64, fn func(data []byte) bool) error {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &since,
	})
	if err != nil {
		return err
	}
	if info, err := cons.Info(ctx); err != nil || info.NumPending == 0 {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(replayPullExpiry))
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		next, cancel := context.WithTimeout(ctx, replayNextTimeout)
		msg, err := it.Next(jetstream.NextContext(next))
		cancel()
		if err != nil {
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Stream > upTo || !fn(msg.Data()) {
			return nil
		}
		if meta.Sequence.Stream == upTo || meta.NumPending == 0 {
			return nil
		}
	}
}
