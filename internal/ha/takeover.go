package ha

import (
	"context"
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The partitions' batches and their takeover.
//
// Every instance runs a collector in the queue group, so any of them may
// take an event of any pool; the collector republishes what it accepted on
// the partition's subject, which the owner subscribes to. The owner decides
// at once on the events its own collector took (the daemon's sink, through
// View) and skips its own batches on the subject; it decides on the other
// instances' batches. An instance that takes a partition over rebuilds it
// apart (Deps.Rebuild) before any of its pools is published, buffering the
// partition's batches meanwhile, its own included (the sink leaves a
// partition that is not live to the subject).

// maxBufferedBytes bounds the batches held during rebuilds.
const maxBufferedBytes = 256 << 20

// onPartition handles one batch of partition p.
func (m *Manager) onPartition(p int, batch []byte, own bool) {
	m.mu.Lock()
	l := m.leases[p]
	if l == nil {
		m.mu.Unlock()
		return
	}
	if l.state == stateRestoring {
		if m.bufferedBytes+len(batch) > maxBufferedBytes {
			m.mu.Unlock()
			m.m.dropped.Inc() // the events are in the outcome stream; the rebuild is taking too long
			return
		}
		m.bufferedBytes += len(batch)
		l.buffer = append(l.buffer, batch)
		m.mu.Unlock()
		m.m.buffered.Inc()
		return
	}
	m.mu.Unlock()
	if own {
		m.m.ownSkipped.Inc() // decided on already, by the sink
		return
	}
	m.d.Observe(batch)
}

// takeOver rebuilds the partitions got (Deps.Rebuild), adopts their pools
// into the live decisions, makes them live and applies the batches
// buffered meanwhile. first is the instance's start.
func (m *Manager) takeOver(ctx context.Context, got []int, first bool) {
	if len(got) == 0 {
		return
	}
	start := m.d.Now()
	rebuilt, err := m.d.Rebuild(ctx, got, first)
	if err != nil {
		m.abandon(ctx, got, err.Error())
		return
	}
	held, adopted, pending := m.goLive(got, rebuilt)
	if m.d.AfterTakeover != nil {
		m.d.AfterTakeover(ctx, adopted, first)
	}
	d := m.d.Now().Sub(start)
	m.m.takeover.Update(d.Seconds())
	m.mu.Lock()
	m.rebuilt = d
	m.mu.Unlock()
	m.d.Logf("ha: took over partitions %v in %v: %s, %d pools, %d batches buffered",
		held, d.Round(time.Millisecond), rebuilt.Summary(), len(adopted), pending)
}

// goLive adopts the pools of the partitions still held from the rebuild,
// turns them live and applies the batches buffered meanwhile; the pools
// adopted for a partition lost during the rebuild are forgotten. It
// returns the partitions that went live, sorted, the pools adopted, and
// how many batches were buffered.
func (m *Manager) goLive(got []int, rebuilt Rebuilt) (live []int, adopted []string, buffered int) {
	mine := make(map[int]bool, len(got))
	for _, p := range got {
		mine[p] = true
	}
	held := map[int]bool{}
	m.mu.Lock()
	for _, p := range got {
		if l := m.leases[p]; l != nil && l.state == stateRestoring {
			held[p] = true
		}
	}
	m.mu.Unlock()
	adopted = rebuilt.Adopt(func(pool string) bool { return held[fleetwatch.PartitionOf(pool, m.n)] })
	var pending [][]byte
	m.mu.Lock()
	for p := range held {
		if l := m.leases[p]; l != nil && l.state == stateRestoring {
			l.state = stateLive
			for _, b := range l.buffer {
				pending = append(pending, b)
				m.bufferedBytes -= len(b)
			}
			l.buffer = nil
			live = append(live, p)
		}
	}
	m.publishViewLocked()
	m.mu.Unlock()
	slices.Sort(live)
	m.d.Forget(func(pool string) bool {
		p := fleetwatch.PartitionOf(pool, m.n)
		return mine[p] && !slices.Contains(live, p)
	})
	for _, b := range pending {
		m.d.Observe(b)
	}
	return live, adopted, len(pending)
}

// abandon gives up partitions whose rebuild failed (the decisions bucket
// or the stream could not be read): going live on them could close an
// open breaker early or open one on partial data. Their keys are given
// back, so that this or another instance tries again at once.
func (m *Manager) abandon(ctx context.Context, got []int, why string) {
	m.mu.Lock()
	revs := map[int]uint64{}
	for _, p := range got {
		if l := m.leases[p]; l != nil && l.state == stateRestoring {
			revs[p] = l.rev
			m.loseLocked(p, "rebuild failed: "+why)
		}
	}
	m.mu.Unlock()
	for p, rev := range revs {
		c, cancel := context.WithTimeout(ctx, m.opTimeout())
		_, _ = m.d.Store.Update(c, leaseKey(p), released_, rev)
		cancel()
	}
}
