package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/ha"
)

// The instance's part of a deployment (internal/ha): the partition leases
// over the lease bucket when the server has JetStream, alone otherwise,
// and what the leases need from serve: the partitions' subjects, the
// rebuild of a partition taken over, the analyzer.

// originHeader names the instance whose collector republished a batch.
const originHeader = "Fw-Origin"

// partitionCounters count the partitions' events seen by serve.
type partitionCounters struct {
	fromOthers, forwarded *metrics.Counter
	unowned, malformed    *metrics.Counter
}

func newPartitionCounters(m *metrics.Set) partitionCounters {
	return partitionCounters{
		fromOthers: m.NewCounter("fleetwatch_ha_partition_events_received_total"),
		forwarded:  m.NewCounter("fleetwatch_ha_events_forwarded_total"),
		unowned:    m.NewCounter("fleetwatch_ha_snapshots_unowned_total"),
		malformed:  m.NewCounter("fleetwatch_ha_partition_lines_malformed_total"),
	}
}

// newLeases builds the leases: over the lease bucket (created, or bound,
// first) with JetStream, without a store otherwise (every partition live
// here).
func (s *Server) newLeases() error {
	hs := s.cfg.HASettings()
	var store ha.Store
	fresh := false
	if s.js != nil {
		st := ha.NewJetStreamStore(s.nc, s.js, ha.StoreSettings{
			Bucket: s.subj.BucketLeases(), Replicas: hs.Replicas, TTL: hs.LeaseTTL.Duration,
			Floor: s.leaseFloor, Logf: s.logf,
		})
		if err := s.untilPlaced("creating the lease bucket", 10*time.Second, st.Ensure); err != nil {
			return err
		}
		store, fresh = st, st.Created()
	}
	s.leases = ha.New(ha.Settings{Partitions: hs.Partitions, TTL: hs.LeaseTTL.Duration, FreshStore: fresh}, ha.Deps{
		Store:         store,
		Logf:          s.logf,
		Metrics:       s.metrics,
		Subscribe:     s.subscribePartition,
		Rebuild:       s.rebuild,
		Observe:       s.observeBatch,
		Forget:        func(drop func(string) bool) int { return len(s.an.Forget(drop)) },
		AfterTakeover: s.afterTakeover,
		Trouble:       s.kickEnsure,
		Closed:        s.nc.IsClosed,
	})
	return nil
}

// leaseFloor is the first revision of a lease bucket made again: above the
// wall clock in microseconds (every bucket created earlier was created
// with an earlier clock, and renewals write far fewer than a million
// revisions a second, so its revisions stay below), above every fence this
// instance held, and above every fence stored in the decisions bucket.
func (s *Server) leaseFloor(ctx context.Context) uint64 {
	floor := uint64(time.Now().UnixMicro())
	if s.leases != nil {
		floor = max(floor, s.leases.MaxFence()+1)
	}
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	snaps, err := s.lastSnapshots(c, func(string) bool { return true })
	if err != nil {
		s.logf("ha: lease bucket floor: %v (using the clock and this instance's fences)", err)
	}
	for _, snap := range snaps {
		floor = max(floor, snap.Fence+1)
	}
	return floor
}

// subscribePartition delivers partition p's batches, telling this
// instance's own apart by their origin header; the server has the
// subscription when it returns.
func (s *Server) subscribePartition(p int, deliver func([]byte, bool)) (ha.Subscription, error) {
	id := s.leases.ID()
	sub, err := s.nc.Subscribe(s.subj.Partition(p), func(m *nats.Msg) { deliver(m.Data, m.Header.Get(originHeader) == id) })
	if err != nil {
		return nil, err
	}
	if err := s.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return sub, nil
}

// observeBatch decodes an NDJSON batch of a partition and hands it to the
// analyzer.
func (s *Server) observeBatch(data []byte) {
	var dec fleetwatch.Decoder
	batch := make([]fleetwatch.Event, 0, 64)
	dec.DecodeBatch(data, func(_ []byte, ev *fleetwatch.Event, err error) {
		if err != nil {
			s.m.malformed.Inc()
			return
		}
		batch = append(batch, *ev)
	})
	if len(batch) == 0 {
		return
	}
	s.m.fromOthers.Add(len(batch))
	if s.an.Observe(batch) {
		s.signalUrgent()
	}
}

// rebuilt is a takeover's reading (ha.Rebuilt): a scratch analyzer with
// the partitions' events replayed and their stored snapshots laid over.
type rebuilt struct {
	s        *Server
	scratch  *analyzer.Analyzer
	snaps    int
	replayed int
	restored analyzer.Restored
}

// Adopt implements ha.Rebuilt.
func (r *rebuilt) Adopt(keep func(pool string) bool) []string { return r.s.an.Adopt(r.scratch, keep) }

// Summary implements ha.Rebuilt.
func (r *rebuilt) Summary() string {
	return fmt.Sprintf("replayed %d events, restored %d snapshots (%d breakers open, %d half-open, %d weights)",
		r.replayed, r.snaps, r.restored.Open, r.restored.HalfOpen, r.restored.Weights)
}

// rebuild reads the partitions got before their pools are published:
// their last snapshots from fw_decisions, the outcome stream replayed for
// them from one window before the oldest snapshot (evaluating at event
// time) into an analyzer of their own, the snapshots' breakers, trip
// counts and weights laid over the replay (analyzer.Restore: an open
// breaker never closes early). A later takeover (not the first) fails
// when either read fails, and the leases give the partitions back; the
// first starts from what it could read. first also replays the per-pool
// subject of earlier versions.
func (s *Server) rebuild(ctx context.Context, got []int, first bool) (ha.Rebuilt, error) {
	n := s.leases.Partitions()
	mine := make(map[int]bool, len(got))
	subjects := make([]string, 0, len(got)+1)
	for _, p := range got {
		mine[p] = true
		subjects = append(subjects, s.subj.Partition(p))
	}
	if first {
		subjects = append(subjects, s.subj.AcceptedWildcard())
	}
	inGot := func(pool string) bool { return mine[fleetwatch.PartitionOf(pool, n)] }
	scratch, err := analyzer.New(s.config().AnalyzerSettings(s.seed))
	if err != nil { // the configuration was validated: cannot happen
		return nil, err
	}
	snaps, err := s.lastSnapshots(ctx, inGot)
	if err != nil {
		if !first {
			return nil, fmt.Errorf("reading %s: %w", s.subj.BucketDecisions(), err)
		}
		s.logf("restore: %v (starting from the outcome stream alone)", err)
	}
	window := s.window()
	since := time.Now().Add(-window)
	for _, snap := range snaps {
		if from := snap.At.Add(-window); from.Before(since) {
			since = from
		}
	}
	rp := newReplayer(scratch, inGot, snaps)
	replayed, err := s.col.ReplaySubjects(ctx, since, subjects, rp.batch)
	if err != nil {
		if !first {
			return nil, fmt.Errorf("replaying %s: %w", s.subj.StreamOutcomes(), err)
		}
		s.logf("replay: %v (starting with what was replayed, if anything)", err)
	}
	return &rebuilt{s: s, scratch: scratch, snaps: len(snaps), replayed: replayed, restored: scratch.Restore(snaps, time.Now())}, nil
}

// window is the analyzer's window in the running configuration: how far
// before a snapshot a rebuild replays.
func (s *Server) window() time.Duration {
	return s.config().AnalyzerSettings(s.seed).Settings.WithDefaults().Window
}

// afterTakeover runs once pools went live: the pools' drift states as
// their previous owner last stored them (the restored snapshots carry the
// statuses already; this brings the CUSUM, cooldown and quarantine, which
// the probes of this instance did not follow while another owned the
// pools), then an evaluation at once.
func (s *Server) afterTakeover(ctx context.Context, adopted []string, first bool) {
	if !first && len(adopted) > 0 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.restoreDrift(rctx, adopted); err != nil && !errors.Is(err, errNoDriftProbes) {
			s.logf("ha: restoring the drift states of %v: %v", adopted, err)
		}
		cancel()
	}
	s.signalUrgent()
}

// ownedPartitions returns the partitions whose pools this instance decides
// now, sorted (every partition without JetStream).
func (s *Server) ownedPartitions() []int { return s.leases.OwnedPartitions() }

// epoch is the analyzer's epoch: the epoch of every snapshot this instance
// publishes ("" before the first evaluation).
func (s *Server) epoch() string { return s.an.Epoch() }
