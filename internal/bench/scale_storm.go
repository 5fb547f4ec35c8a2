package bench

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
)

// The join and the reconnect storm.

// join starts one fresh router following every pool on the second node
// (not the first serve's) and measures what it read from its socket until
// it held every pool's snapshot, and how long that took; it counts the
// JetStream consumers before and after (/jsz) and the consumer-created
// advisories while it joined: a router must create none.
func (r *scaleRun) join(ctx context.Context) (*JoinResult, error) {
	before, err := r.cluster.consumers(ctx)
	if err != nil {
		return nil, err
	}
	var advisories atomic.Int64
	sub, err := r.gen.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", func(*nats.Msg) { advisories.Add(1) })
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := r.gen.Flush(); err != nil {
		return nil, err
	}
	fleet := &routerFleet{set: metrics.NewSet(), ages: &ageHist{}}
	runCtx, cancel := context.WithCancel(context.Background())
	fleet.cancel = cancel
	defer fleet.close()
	rt, err := newRouter(1, r.cluster, followed(0, r.s.Pools, 0), r.s.Backends, fleet.set, fleet.ages)
	if err != nil {
		return nil, err
	}
	fleet.routers = append(fleet.routers, rt)
	fleet.wg.Add(1)
	go func() { defer fleet.wg.Done(); _ = rt.w.Run(runCtx) }() // ends at fleet.close
	deadline := time.Now().Add(30 * time.Second)
	for rt.syncedAt.Load() == 0 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench scale: the joining router was not synced after 30s")
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return nil, err
		}
	}
	j := &JoinResult{Pools: r.s.Pools, Bytes: rt.syncBytes.Load(),
		Millis:  float64(rt.syncedAt.Load()-rt.startedAt.UnixNano()) / 1e6,
		Compact: rt.w.Compact()}
	_ = sleepCtx(ctx, time.Second) // late advisories
	j.ConsumerAdvisories = advisories.Load()
	after, err := r.cluster.consumers(ctx)
	if err != nil {
		return nil, err
	}
	j.ConsumersBefore, j.ConsumersAfter = before, after
	return j, nil
}

// storm kills (SIGKILL) a node (stormVictim) and measures, for every router
// that was connected to it, when it reconnected, when it had applied a
// frame of every pool it follows after reconnecting (loads flowing again),
// and when it had applied a key frame of every pool after reconnecting
// (in sync: a reconnected watcher marks a gap on every pool, which the
// next key frame clears).
func (r *scaleRun) storm(ctx context.Context, fleet *routerFleet) (*StormResult, error) {
	victim := r.stormVictim()
	var on []*scaleRouter
	for _, rt := range fleet.routers {
		if rt.node(r.cluster) == victim && rt.nc.ConnectedServerName() != "" {
			on = append(on, rt)
		}
	}
	res := &StormResult{Node: fmt.Sprintf("n%d", victim+1), Routers: len(on)}
	if len(on) == 0 {
		return res, nil
	}
	t0 := time.Now()
	r.cluster.nodes[victim].stop(syscall.SIGKILL)
	r.s.Logf("bench scale: killed %s with %d routers on it", res.Node, len(on))
	const limit = 30 * time.Second
	recon := make([]time.Duration, len(on))
	flowing := make([]time.Duration, len(on))
	keyed := make([]time.Duration, len(on))
	for time.Since(t0) < limit {
		done := true
		now := time.Since(t0)
		for i, rt := range on {
			rc := rt.reconnected.Load()
			if rc < t0.UnixNano() {
				done = false
				continue
			}
			recon[i] = time.Duration(rc - t0.UnixNano())
			if flowing[i] == 0 && allAfter(rt.lastLoads, rt.lastKey, rc) {
				flowing[i] = now
			}
			if keyed[i] == 0 && allAfter(rt.lastKey, nil, rc) {
				keyed[i] = now
			}
			done = done && flowing[i] != 0 && keyed[i] != 0
		}
		if done {
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	res.ReconnectP50Ms, res.ReconnectMaxMs, _ = durStats(recon)
	res.FlowingP50Ms, res.FlowingMaxMs, res.FlowingMissing = durStats(flowing)
	res.KeyedP50Ms, res.KeyedMaxMs, res.KeyedMissing = durStats(keyed)
	return res, nil
}

// allAfter reports whether every pool's time in a (or in b) is after t.
func allAfter(a, b []atomic.Int64, t int64) bool {
	for k := range a {
		if a[k].Load() > t {
			continue
		}
		if b != nil && b[k].Load() > t {
			continue
		}
		return false
	}
	return true
}

// durStats is the median and the largest of ds in ms, and how many are
// zero (never reached).
func durStats(ds []time.Duration) (p50, maxMs float64, missing int) {
	var got []time.Duration
	for _, d := range ds {
		if d == 0 {
			missing++
			continue
		}
		got = append(got, d)
	}
	if len(got) == 0 {
		return 0, 0, missing
	}
	slices.Sort(got)
	return float64(got[len(got)/2]) / 1e6, float64(got[len(got)-1]) / 1e6, missing
}

// stormVictim is the last node no serve is connected to (the routers'
// loss, not serve's: a serve reconnecting is "NATS restarts and
// elections"' case), or the last node when every node has one.
func (r *scaleRun) stormVictim() int {
	for n := len(r.cluster.nodes) - 1; n >= 0; n-- {
		if !slices.Contains(r.serveNodes, n) {
			return n
		}
	}
	return len(r.cluster.nodes) - 1
}
