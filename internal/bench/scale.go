package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// The scale benchmark (`fleetwatch bench scale`, issue 33 item 3): real
// nats-server processes in a three-node cluster with JetStream, one or
// three real `fleetwatch serve` processes deciding P pools of B backends
// from synthetic outcome traffic, and R routers as real NATS connections
// in this process, spread over the three nodes, each running the real
// feed.Watcher on the compact feed and the real picker (feed/route's
// Pools). For each R it measures, over a window, what each router
// receives per pool-second, what each server and route link carries, how
// old a load is when a router applies it, slow consumers and dropped or
// gapped frames, the routers' CPU and serve's CPU and memory; then what a
// fresh router reads to join every pool (and that it creates no JetStream
// consumer), and how long the routers of a killed node take to be in sync
// again. A model of every server's and link's bytes (scale_model.go) is
// derived from the measured frame sizes and rates and checked against
// every measured point.

// ScaleSettings configure RunScale. The zero value runs 10 pools of 100
// backends, one serve, 10, 50 and 100 routers following every pool, 30 s
// each, with the fleetwatch binary running the benchmark and nats-server
// from the PATH.
type ScaleSettings struct {
	// Fleetwatch is the fleetwatch binary that runs `serve`. If empty,
	// os.Executable() (the benchmark runs inside fleetwatch).
	Fleetwatch string
	// NATSServer is the nats-server binary. If empty, "nats-server" on the
	// PATH.
	NATSServer string
	// Pools and Backends are the fleet: Pools pools of Backends backends.
	// If zero, 10 and 100.
	Pools, Backends int
	// Routers are the router counts measured, one step each, in order. If
	// empty, 10, 50 and 100.
	Routers []int
	// Follow is how many pools each router follows, taken in turn so that
	// every pool has as many followers as can be. If zero (or Pools or
	// more), every pool.
	Follow int
	// Serves is the number of serve processes: 1, or 3 sharing the
	// partitions (ha.partitions 18). If zero, 1.
	Serves int
	// Duration is each step's measurement window, and Warmup the wait
	// before it once the routers are synced. If zero, 30s and 5s.
	Duration, Warmup time.Duration
	// Rate is the outcome events per second of each backend. If zero, 5
	// (see ScaleReport.RateNote).
	Rate float64
	// Seed seeds the traffic. If zero, 1.
	Seed uint64
	// NoStorm skips the reconnect storm (killing a node after the last
	// step), and NoJoin the fresh router's join.
	NoStorm, NoJoin bool
	// Dir holds the servers' stores and configurations. If empty, a
	// temporary directory, removed at the end.
	Dir string
	// Logf receives progress messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// GOGC, if not zero, is this process's GOGC for the run
	// (debug.SetGCPercent; negative: off): its one heap holds every
	// router's state, and the report says what its collector did.
	GOGC int
	// Window, if set, is called as each window with routers starts (n
	// routers); what it returns is called as the window ends. fleetwatch
	// bench scale's --cpuprofile profiles the windows with it, not the
	// routers' sync.
	Window func(n int) (end func())
}

func (s ScaleSettings) withDefaults() (ScaleSettings, error) {
	if s.Fleetwatch == "" {
		exe, err := os.Executable()
		if err != nil {
			return s, err
		}
		s.Fleetwatch = exe
	}
	if s.NATSServer == "" {
		s.NATSServer = "nats-server"
	}
	if s.Pools <= 0 {
		s.Pools = 10
	}
	if s.Backends <= 0 {
		s.Backends = 100
	}
	if len(s.Routers) == 0 {
		s.Routers = []int{10, 50, 100}
	}
	s.Routers = slices.Clone(s.Routers)
	if s.Follow <= 0 || s.Follow > s.Pools {
		s.Follow = s.Pools
	}
	if s.Serves <= 0 {
		s.Serves = 1
	}
	if s.Duration <= 0 {
		s.Duration = 30 * time.Second
	}
	if s.Warmup <= 0 {
		s.Warmup = 5 * time.Second
	}
	if s.Rate <= 0 {
		s.Rate = 5
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	switch {
	case s.Serves != 1 && s.Serves != 3:
		return s, fmt.Errorf("bench scale: serves %d: want 1 or 3", s.Serves)
	case slices.ContainsFunc(s.Routers, func(r int) bool { return r < 1 }):
		return s, fmt.Errorf("bench scale: routers %v: every count must be >= 1", s.Routers)
	}
	return s, nil
}

// scaleRun is one RunScale in progress: what it started.
type scaleRun struct {
	s       ScaleSettings
	dir     string
	cluster *natsCluster
	serves  []*serveProc
	gen     *nats.Conn
	traffic *traffic
	// serveNodes is the node each serve connects to (connz), found once
	// the serves published.
	serveNodes []int
}

// RunScale runs the benchmark: the cluster, serve, the traffic, a
// baseline window without routers, one step per router count, the join
// and the reconnect storm; then it fits the model.
func RunScale(ctx context.Context, s ScaleSettings) (*ScaleReport, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if s.GOGC != 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(s.GOGC))
	}
	run := &scaleRun{s: s, dir: s.Dir}
	if run.dir == "" {
		if run.dir, err = os.MkdirTemp("", "fleetwatch-bench-scale-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(run.dir)
	}
	defer run.close()
	if err := run.setUp(ctx); err != nil {
		return nil, err
	}
	rep := newScaleReport(s)
	s.Logf("bench scale: baseline window without routers")
	base, err := run.measure(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	rep.Steps = append(rep.Steps, base)
	if rep.Frames, err = run.census(ctx); err != nil {
		return nil, err
	}
	for i, n := range s.Routers {
		st, fleet, err := run.routerStep(ctx, n, &base)
		if err != nil {
			return nil, err
		}
		rep.Steps = append(rep.Steps, st)
		if i < len(s.Routers)-1 && st.Unsynced == 0 {
			fleet.close()
			continue
		}
		if st.Unsynced > 0 && i < len(s.Routers)-1 {
			rep.Skipped = s.Routers[i+1:]
			s.Logf("bench scale: %d of %d routers never synced: router counts %v skipped", st.Unsynced, n, rep.Skipped)
		}
		err = run.joinAndStorm(ctx, rep, fleet)
		fleet.close()
		if err != nil {
			return nil, err
		}
		break
	}
	rep.EventsPerSec = float64(run.traffic.events.Load()) / time.Since(rep.started).Seconds()
	rep.LoadAvgEnd = loadAvg()
	rep.Model = fitScaleModel(rep)
	return rep, nil
}

// setUp starts the cluster, serve and the traffic, and waits until every
// pool's key frame is stored.
func (r *scaleRun) setUp(ctx context.Context) error {
	s := r.s
	var err error
	if r.cluster, err = newNATSCluster(s.NATSServer, r.dir); err != nil {
		return err
	}
	if err := r.cluster.start(ctx); err != nil {
		return err
	}
	s.Logf("bench scale: 3 nats-server nodes running (%s)", s.NATSServer)
	if r.gen, err = nats.Connect(r.cluster.urls(1), nats.Name("bench-traffic"), nats.MaxReconnects(-1), nats.DontRandomize()); err != nil {
		return err
	}
	if err := waitJetStream(ctx, r.gen, 60*time.Second); err != nil {
		return err
	}
	cfg := serveConfig(s.Pools, s.Backends, s.Serves)
	for i := range s.Serves {
		sp, err := startServe(ctx, s.Fleetwatch, r.dir, i, r.cluster.urls(i%3), cfg)
		if err != nil {
			return err
		}
		r.serves = append(r.serves, sp)
	}
	s.Logf("bench scale: %d serve process(es) running, %d pools of %d backends", s.Serves, s.Pools, s.Backends)
	r.traffic = newTraffic(r.gen, s.Pools, s.Backends, s.Rate, s.Seed)
	r.traffic.run()
	if err := waitKeyFrames(ctx, r.gen, s.Pools, 120*time.Second); err != nil {
		return err
	}
	if r.serveNodes, err = r.cluster.serveNodes(ctx); err != nil {
		return err
	}
	if len(r.serveNodes) != s.Serves {
		return fmt.Errorf("bench scale: %d serve connections found on the nodes' /connz, want %d", len(r.serveNodes), s.Serves)
	}
	s.Logf("bench scale: every pool's key frame is stored; serve(s) on node(s) %v; traffic %.0f events/s",
		r.serveNodes, s.Rate*float64(s.Pools*s.Backends))
	return nil
}

func (r *scaleRun) close() {
	if r.traffic != nil {
		r.traffic.close()
	}
	if r.gen != nil {
		r.gen.Close()
	}
	for _, sp := range r.serves {
		sp.stop(syscall.SIGTERM)
	}
	if r.cluster != nil {
		r.cluster.stop()
	}
}

// routerStep starts n routers, waits until they are synced (or the
// limit passed: the step then counts those never synced) and warmed up,
// and measures a window with them; the caller closes the fleet.
func (r *scaleRun) routerStep(ctx context.Context, n int, base *ScaleStep) (ScaleStep, *routerFleet, error) {
	r.s.Logf("bench scale: starting %d routers following %d pools each", n, r.s.Follow)
	begin := time.Now()
	fleet, err := startFleet(ctx, r.cluster, n, r.s.Pools, r.s.Follow, r.s.Backends, 60*time.Second+time.Duration(n)*100*time.Millisecond)
	if err != nil && !errors.Is(err, errNotSynced) {
		if fleet != nil {
			fleet.close()
		}
		return ScaleStep{}, nil, err
	}
	synced := time.Since(begin)
	r.s.Logf("bench scale: %d of %d routers synced in %v", fleet.countSynced(), n, synced.Round(time.Millisecond))
	st, err := r.measure(ctx, fleet, base)
	st.SyncMs = float64(synced) / 1e6
	st.Unsynced = n - fleet.countSynced()
	st.SyncBytesMean = fleet.syncBytesMean()
	if err != nil {
		fleet.close()
		return st, nil, err
	}
	return st, fleet, nil
}

// joinAndStorm runs the join and the reconnect storm beside the last
// step's fleet.
func (r *scaleRun) joinAndStorm(ctx context.Context, rep *ScaleReport, fleet *routerFleet) error {
	var err error
	if !r.s.NoJoin {
		if rep.Join, err = r.join(ctx); err != nil {
			return err
		}
	}
	if !r.s.NoStorm {
		rep.Storm, err = r.storm(ctx, fleet)
	}
	return err
}

// waitJetStream waits until the cluster's JetStream answers (a meta
// leader is elected).
func waitJetStream(ctx context.Context, nc *nats.Conn, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		resp, err := nc.Request("$JS.API.INFO", nil, time.Second)
		if err == nil && !strings.Contains(string(resp.Data), `"error"`) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench scale: the cluster's JetStream did not answer within %v (%v)", limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitKeyFrames waits until the fw_feed bucket holds every pool's key
// frame (serve decided and published every pool).
func waitKeyFrames(ctx context.Context, nc *nats.Conn, pools int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	missing := pools
	for {
		missing = 0
		for p := range pools {
			msg, err := nc.Request("$JS.API.DIRECT.GET.KV_fw_feed.$KV.fw_feed."+poolID(p), nil, time.Second)
			if err != nil || msg.Header.Get("Status") != "" { // 404: no message

				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench scale: %d of %d pools have no key frame in fw_feed after %v", missing, pools, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// loadAvg is the 1-minute load average, or -1.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return -1
	}
	return l
}

// processCPU is this process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func machine() string {
	return fmt.Sprintf("%s/%s, %d cores, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
}
