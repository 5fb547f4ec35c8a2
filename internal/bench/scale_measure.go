package bench

import (
	"context"
	"fmt"
	"runtime/metrics"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
)

// How one window is measured: every counter is read at its start and its
// end, and the step reports the differences per second.

// scaleSample is one reading of every counter.
type scaleSample struct {
	at        time.Time
	nodes     []nodeSample
	up        []bool
	serves    []serveCounters
	serveStat []procStat
	cpu       time.Duration
	wire      int64
	payload   int64
	msgs      int64
	ages      []int64
	watcher   map[string]uint64
	events    int64
	gc        gcSample
}

// gcSample is this process's garbage collector so far (runtime/metrics).
type gcSample struct {
	cycles uint64
	cpu    float64 // seconds of CPU spent collecting (an estimate of the runtime's)
	heap   uint64  // bytes of heap objects, garbage not yet collected included
}

var gcMetrics = []string{"/gc/cycles/total:gc-cycles", "/cpu/classes/gc/total:cpu-seconds", "/memory/classes/heap/objects:bytes"}

func sampleGC() gcSample {
	ms := make([]metrics.Sample, len(gcMetrics))
	for i, name := range gcMetrics {
		ms[i].Name = name
	}
	metrics.Read(ms)
	var g gcSample
	if ms[0].Value.Kind() == metrics.KindUint64 {
		g.cycles = ms[0].Value.Uint64()
	}
	if ms[1].Value.Kind() == metrics.KindFloat64 {
		g.cpu = ms[1].Value.Float64()
	}
	if ms[2].Value.Kind() == metrics.KindUint64 {
		g.heap = ms[2].Value.Uint64()
	}
	return g
}

// watcherCounters are the watchers' counters a step reports.
var watcherCounters = []string{
	"fleetwatch_feed_snapshots_dropped_total",
	"fleetwatch_feed_frame_gaps_total",
	"fleetwatch_feed_snapshots_malformed_total",
	"fleetwatch_feed_key_fetches_total",
	"fleetwatch_feed_load_frames_applied_total",
	"fleetwatch_feed_snapshots_applied_total",
	"fleetwatch_feed_key_frames_refreshed_total",
}

func (r *scaleRun) sample(ctx context.Context, fleet *routerFleet) (scaleSample, error) {
	sm := scaleSample{at: time.Now(), cpu: processCPU(), events: r.traffic.events.Load(), gc: sampleGC()}
	for _, n := range r.cluster.nodes {
		ns, ok := n.sample(ctx)
		sm.nodes, sm.up = append(sm.nodes, ns), append(sm.up, ok)
	}
	for _, sp := range r.serves {
		c, err := sp.counters(ctx)
		if err != nil {
			return sm, fmt.Errorf("bench scale: %s /metrics: %w", sp.name, err)
		}
		st, _ := readProcStat(sp.pid())
		sm.serves, sm.serveStat = append(sm.serves, c), append(sm.serveStat, st)
	}
	if fleet != nil {
		sm.wire, sm.payload, sm.msgs = fleet.counters()
		sm.ages = fleet.ages.snapshot()
		sm.watcher = map[string]uint64{}
		for _, name := range watcherCounters {
			sm.watcher[name] = fleet.watcherCount(name)
		}
	}
	return sm, nil
}

// measure waits out the warm-up (with routers), then measures one window.
func (r *scaleRun) measure(ctx context.Context, fleet *routerFleet, base *ScaleStep) (ScaleStep, error) {
	if fleet != nil {
		if err := sleepCtx(ctx, r.s.Warmup); err != nil {
			return ScaleStep{}, err
		}
	}
	a, err := r.sample(ctx, fleet)
	if err != nil {
		return ScaleStep{}, err
	}
	end := func() {}
	if fleet != nil && r.s.Window != nil {
		end = r.s.Window(len(fleet.routers))
	}
	err = sleepCtx(ctx, r.s.Duration)
	end()
	if err != nil {
		return ScaleStep{}, err
	}
	b, err := r.sample(ctx, fleet)
	if err != nil {
		return ScaleStep{}, err
	}
	return r.stepFrom(a, b, fleet, base), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// stepFrom turns two samples into a step.
func (r *scaleRun) stepFrom(a, b scaleSample, fleet *routerFleet, base *ScaleStep) ScaleStep {
	sec := b.at.Sub(a.at).Seconds()
	st := ScaleStep{Seconds: sec, LoadAvg: loadAvg(), EventsPerSec: float64(b.events-a.events) / sec,
		ProcessCPU: (b.cpu - a.cpu).Seconds() / sec,
		GCCycles:   b.gc.cycles - a.gc.cycles, GCCPU: (b.gc.cpu - a.gc.cpu) / sec, HeapMiB: float64(b.gc.heap) / (1 << 20)}
	perNode := make([]int, len(r.cluster.nodes))
	pools := make([]map[string]bool, len(r.cluster.nodes))
	for i := range pools {
		pools[i] = map[string]bool{}
	}
	if fleet != nil {
		st.Routers, st.Follow = len(fleet.routers), r.s.Follow
		for _, rt := range fleet.routers {
			k := rt.node(r.cluster)
			perNode[k]++
			for _, p := range rt.follows {
				pools[k][p] = true
			}
		}
		poolSec := float64(st.Routers*st.Follow) * sec
		st.WirePerPoolSec = float64(b.wire-a.wire) / poolSec
		st.PayloadPerPoolSec = float64(b.payload-a.payload) / poolSec
		st.MsgsPerPoolSec = float64(b.msgs-a.msgs) / poolSec
		q, n := quantiles(a.ages, b.ages, 0.5, 0.99, 1)
		st.AgeP50Ms, st.AgeP99Ms, st.AgeMaxMs, st.AgeSamples = q[0], q[1], q[2], n
		st.Dropped = b.watcher[watcherCounters[0]] - a.watcher[watcherCounters[0]]
		st.Gaps = b.watcher[watcherCounters[1]] - a.watcher[watcherCounters[1]]
		st.Malformed = b.watcher[watcherCounters[2]] - a.watcher[watcherCounters[2]]
		st.KeyFetches = b.watcher[watcherCounters[3]] - a.watcher[watcherCounters[3]]
		if base != nil {
			st.RouterCPUMsPerPoolSec = (st.ProcessCPU - base.ProcessCPU) * 1000 / float64(st.Routers*st.Follow)
		}
	}
	for i := range r.cluster.nodes {
		ns := NodeStep{Name: fmt.Sprintf("n%d", i+1), Routers: perNode[i], PoolsFollowed: len(pools[i]), Up: a.up[i] && b.up[i]}
		if ns.Up {
			va, vb := a.nodes[i].varz, b.nodes[i].varz
			ns.InBytesPerSec, ns.OutBytesPerSec = float64(vb.InBytes-va.InBytes)/sec, float64(vb.OutBytes-va.OutBytes)/sec
			ns.InMsgsPerSec, ns.OutMsgsPerSec = float64(vb.InMsgs-va.InMsgs)/sec, float64(vb.OutMsgs-va.OutMsgs)/sec
			ns.SlowConsumers = vb.SlowConsumers - va.SlowConsumers
			ns.CPU = (b.nodes[i].stat.CPU - a.nodes[i].stat.CPU).Seconds() / sec
			ns.RSSMiB = float64(b.nodes[i].stat.RSS) / (1 << 20)
			st.SlowConsumers += ns.SlowConsumers
			for j := range r.cluster.nodes {
				if j == i {
					continue
				}
				to := fmt.Sprintf("n%d", j+1)
				la, lb := a.nodes[i].links[to], b.nodes[i].links[to]
				st.Links = append(st.Links, LinkStep{From: ns.Name, To: to,
					BytesPerSec: float64(lb.Bytes-la.Bytes) / sec, MsgsPerSec: float64(lb.Msgs-la.Msgs) / sec})
			}
		}
		st.Nodes = append(st.Nodes, ns)
	}
	for i, sp := range r.serves {
		ca, cb := a.serves[i], b.serves[i]
		st.Serves = append(st.Serves, ServeStep{Name: sp.name, Node: r.serveNodes[i],
			CPU:              (b.serveStat[i].CPU - a.serveStat[i].CPU).Seconds() / sec,
			RSSMiB:           float64(b.serveStat[i].RSS) / (1 << 20),
			KeyFramesPerSec:  (cb.KeyFrames - ca.KeyFrames) / sec,
			LoadFramesPerSec: (cb.LoadFrames - ca.LoadFrames) / sec,
			FrameBytesPerSec: (cb.FrameBytes - ca.FrameBytes) / sec,
			SnapshotsPerSec:  (cb.Published - ca.Published) / sec,
			EventsRefused:    cb.Refused - ca.Refused,
			EventsDropped:    cb.Dropped - ca.Dropped,
		})
	}
	return st
}

// node is the index of the node the router is connected to now (its
// server name n1..n3), or -1.
func (rt *scaleRouter) node(c *natsCluster) int {
	name := rt.nc.ConnectedServerName()
	for i := range c.nodes {
		if name == fmt.Sprintf("n%d", i+1) {
			return i
		}
	}
	return 0
}

// census subscribes to every pool's feed for a while on the node of the
// first serve (so that no route link carries it) and measures the
// frames: how many of each kind, their sizes, and how many backends a load
// frame lists. It runs between the windows, never inside one.
func (r *scaleRun) census(ctx context.Context) (FrameCensus, error) {
	var c FrameCensus
	nc, err := nats.Connect(r.cluster.nodes[0].url(), nats.Name("bench-census"))
	if err != nil {
		return c, err
	}
	defer nc.Close()
	var mu sync.Mutex // guards c and the regression sums
	var sumX, sumY, sumXY, sumXX, nL float64
	var loads feed.Loads
	applied := map[string]*fleetwatch.Snapshot{} // per subject: the last key frame a router applied as a snapshot
	sub, err := nc.Subscribe("fw.feed.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		kind, err := feed.FrameKind(m.Data)
		if err != nil {
			return
		}
		size := float64(len(m.Data))
		c.WireOverhead += float64(len("MSG  1 \r\n\r\n") + len(m.Subject) + len(strconv.Itoa(len(m.Data))) + len(strconv.Itoa(2*r.s.Follow)) - 1)
		if kind == feed.FrameKey {
			snap, n, err := feed.DecodeKey(m.Data, "p")
			if err != nil {
				return
			}
			c.KeyFrames++
			c.KeyBytesMean += size
			if a := applied[m.Subject]; a != nil && feed.RepeatsDecisions(a, snap) {
				c.KeyRepeats++
			} else {
				applied[m.Subject] = snap
			}
			header := *snap
			header.Backends = nil
			c.KeyHeader += float64(len(feed.AppendKey(nil, &header, n)))
			return
		}
		if feed.DecodeLoads(m.Data, &loads) != nil {
			return
		}
		c.LoadFrames++
		c.LoadBytesMean += size
		x := float64(len(loads.Entries))
		sumX, sumY, sumXY, sumXX, nL = sumX+x, sumY+size, sumXY+x*size, sumXX+x*x, nL+1
	})
	if err != nil {
		return c, err
	}
	window := max(min(r.s.Duration, 30*time.Second), 5*time.Second)
	err = sleepCtx(ctx, window)
	_ = sub.Unsubscribe()
	mu.Lock()
	defer mu.Unlock()
	c.finish(window.Seconds(), r.s.Pools, r.s.Backends, sumX, sumY, sumXY, sumXX, nL)
	return c, err
}

// finish turns the census's sums into means and the load frame's size
// into a header and a size per entry (least squares).
func (c *FrameCensus) finish(sec float64, pools, backends int, sumX, sumY, sumXY, sumXX, nL float64) {
	c.Seconds = sec
	if n := float64(c.KeyFrames + c.LoadFrames); n > 0 {
		c.WireOverhead /= n
	}
	if c.KeyFrames > 0 {
		c.KeyBytesMean /= float64(c.KeyFrames)
		c.KeyHeader /= float64(c.KeyFrames)
		c.KeyPerBackend = (c.KeyBytesMean - c.KeyHeader) / float64(backends)
	}
	if c.LoadFrames > 0 {
		c.LoadBytesMean /= float64(c.LoadFrames)
		c.EntriesMean = sumX / nL
		c.ChangeRate = c.EntriesMean / float64(backends)
		if d := nL*sumXX - sumX*sumX; d > 0 {
			c.LoadPerEntry = (nL*sumXY - sumX*sumY) / d
			c.LoadHeader = (sumY - c.LoadPerEntry*sumX) / nL
		}
	}
	c.KeyPerPoolSec = float64(c.KeyFrames) / sec / float64(pools)
	c.LoadPerPoolSec = float64(c.LoadFrames) / sec / float64(pools)
}
