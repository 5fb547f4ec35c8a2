package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// The scale benchmark's routers: each one a NATS connection of its own
// (through a dialer that counts the bytes read from its socket), the real
// feed.Watcher in compact mode and the real picker through route.Pools,
// configured with the pools it follows. They run in this process; their
// callbacks time each load frame's age at apply and when each pool was
// last refreshed.

// countingDialer dials TCP and counts what the connections read.
type countingDialer struct {
	d  net.Dialer
	in *atomic.Int64
}

func (c *countingDialer) Dial(network, address string) (net.Conn, error) {
	conn, err := c.d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, in: c.in}, nil
}

type countingConn struct {
	net.Conn
	in *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

// ageHist counts ages in 1 ms buckets up to 10 s (the last bucket holds
// everything beyond); safe for concurrent use.
type ageHist struct {
	counts [10001]atomic.Int64
}

func (h *ageHist) add(d time.Duration) {
	ms := d.Milliseconds()
	h.counts[min(max(ms, 0), int64(len(h.counts)-1))].Add(1)
}

// snapshot copies the counts.
func (h *ageHist) snapshot() []int64 {
	out := make([]int64, len(h.counts))
	for i := range h.counts {
		out[i] = h.counts[i].Load()
	}
	return out
}

// quantiles returns the q-quantiles (in ms) of the counts in b minus a,
// and how many there were.
func quantiles(a, b []int64, qs ...float64) ([]float64, int64) {
	var total int64
	diff := make([]int64, len(b))
	for i := range b {
		diff[i] = b[i]
		if a != nil {
			diff[i] -= a[i]
		}
		total += diff[i]
	}
	out := make([]float64, len(qs))
	if total == 0 {
		return out, 0
	}
	for k, q := range qs {
		rank := int64(q * float64(total-1))
		var seen int64
		for i, c := range diff {
			seen += c
			if seen > rank {
				out[k] = float64(i)
				break
			}
		}
	}
	return out, total
}

// scaleRouter is one router.
type scaleRouter struct {
	idx     int
	nc      *nats.Conn
	wire    atomic.Int64 // bytes read from the socket
	w       *feed.Watcher
	pools   *route.Pools
	follows []string
	poolIdx map[string]int
	ages    *ageHist

	startedAt   time.Time
	keyed       atomic.Int32   // followed pools with a snapshot
	syncedAt    atomic.Int64   // unix ns when every followed pool had one; 0 until then
	syncBytes   atomic.Int64   // wire bytes read by then
	lastKey     []atomic.Int64 // per followed pool: unix ns of the last snapshot applied
	lastLoads   []atomic.Int64 // ... and of the last load frame applied
	reconnected atomic.Int64   // unix ns of the last reconnect
}

// errNotSynced reports routers that never held every pool they follow
// within the time given.
var errNotSynced = errors.New("bench scale: routers not synced")

// routerFleet is the routers of one step.
type routerFleet struct {
	routers []*scaleRouter
	set     *metrics.Set // the watchers' counters, summed over the routers
	ages    *ageHist
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// followed lists the pools router i follows: every pool, or k of them
// taken in turn so that every pool has as many followers as can be.
func followed(i, pools, k int) []int {
	if k <= 0 || k >= pools {
		k = pools
	}
	out := make([]int, 0, k)
	for j := range k {
		out = append(out, (i*k+j)%pools)
	}
	sort.Ints(out)
	return out
}

// newRouter connects router idx to the cluster (its first URL the node
// idx % 3) and builds its watcher and pools; Run starts it.
func newRouter(idx int, cluster *natsCluster, pools []int, backends int, set *metrics.Set, ages *ageHist) (*scaleRouter, error) {
	r := &scaleRouter{idx: idx, poolIdx: map[string]int{}, ages: ages, startedAt: time.Now()}
	for k, p := range pools {
		r.follows = append(r.follows, poolID(p))
		r.poolIdx[poolID(p)] = k
	}
	r.lastKey = make([]atomic.Int64, len(pools))
	r.lastLoads = make([]atomic.Int64, len(pools))
	var err error
	if r.pools, err = route.NewPools(routePools(pools, backends), nil, nil); err != nil {
		return nil, err
	}
	// The options of fleetwatch route's connection (cmd/fleetwatch's
	// clientOptions), plus the counting dialer.
	r.nc, err = nats.Connect(cluster.urls(idx%len(cluster.nodes)),
		nats.Name(fmt.Sprintf("bench-router-%d", idx)),
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), // a busy server may drop a connection mid-handshake
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.PingInterval(10*time.Second),
		nats.SetCustomDialer(&countingDialer{in: &r.wire}),
		nats.ReconnectHandler(func(*nats.Conn) { r.reconnected.Store(time.Now().UnixNano()) }),
	)
	if err != nil {
		return nil, fmt.Errorf("bench scale: router %d: %w", idx, err)
	}
	r.w, err = feed.NewWatcher(r.nc, feed.WatcherSettings{
		Pools:    r.follows,
		Compact:  true,
		Metrics:  set,
		OnUpdate: r.onUpdate,
		OnLoads:  r.onLoads,
	})
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	return r, nil
}

func (r *scaleRouter) onUpdate(snap *fleetwatch.Snapshot) {
	now := time.Now().UnixNano()
	if k, ok := r.poolIdx[snap.Pool]; ok {
		if r.lastKey[k].Swap(now) == 0 && int(r.keyed.Add(1)) == len(r.follows) {
			r.syncBytes.Store(r.wire.Load())
			r.syncedAt.Store(now)
		}
	}
	r.pools.Apply(snap)
}

func (r *scaleRouter) onLoads(pool string, u *p2c.LoadUpdate) {
	now := time.Now()
	r.ages.add(now.Sub(u.At))
	if k, ok := r.poolIdx[pool]; ok {
		r.lastLoads[k].Store(now.UnixNano())
		if u.Full { // a key frame that repeated the decisions applied
			r.lastKey[k].Store(now.UnixNano())
		}
	}
	r.pools.ApplyLoads(pool, u)
}

// startFleet starts n routers, each following k pools (0: all), eight
// at a time, and waits up to limit for every one to hold a snapshot of
// every pool it follows.
func startFleet(ctx context.Context, cluster *natsCluster, n, pools, k, backends int, limit time.Duration) (*routerFleet, error) {
	f := &routerFleet{set: metrics.NewSet(), ages: &ageHist{}, routers: make([]*scaleRouter, n)}
	runCtx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	errs := make(chan error, n)
	next := make(chan int)
	var starting sync.WaitGroup
	for range 8 {
		starting.Go(func() { // ends when next is closed
			for i := range next {
				r, err := newRouter(i, cluster, followed(i, pools, k), backends, f.set, f.ages)
				if err != nil {
					errs <- err
					continue
				}
				f.routers[i] = r
				f.wg.Go(func() { _ = r.w.Run(runCtx) }) // ends when the fleet is closed
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	starting.Wait()
	f.routers = slices.DeleteFunc(f.routers, func(r *scaleRouter) bool { return r == nil })
	select {
	case err := <-errs:
		f.close()
		return nil, err
	default:
	}
	deadline := time.Now().Add(limit)
	for !f.synced() {
		if time.Now().After(deadline) {
			return f, fmt.Errorf("%w: %d of %d after %v", errNotSynced, f.countSynced(), n, limit)
		}
		select {
		case <-ctx.Done():
			return f, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return f, nil
}

func (f *routerFleet) countSynced() int {
	n := 0
	for _, r := range f.routers {
		if r.syncedAt.Load() != 0 {
			n++
		}
	}
	return n
}

// syncBytesMean is the mean of the synced routers' bytes read until they
// were.
func (f *routerFleet) syncBytesMean() float64 {
	var sum float64
	n := 0
	for _, r := range f.routers {
		if r.syncedAt.Load() != 0 {
			sum += float64(r.syncBytes.Load())
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func (f *routerFleet) synced() bool { return f.countSynced() == len(f.routers) }

// counters sums the routers' byte and message counts: wire bytes read,
// and nats.go's payload bytes and messages.
func (f *routerFleet) counters() (wire, payload, msgs int64) {
	for _, r := range f.routers {
		wire += r.wire.Load()
		st := r.nc.Stats()
		payload += int64(st.InBytes)
		msgs += int64(st.InMsgs)
	}
	return
}

// watcherCount reads one of the watchers' summed counters.
func (f *routerFleet) watcherCount(name string) uint64 {
	return f.set.GetOrCreateCounter(name).Get()
}

func (f *routerFleet) close() {
	f.cancel()
	for _, r := range f.routers {
		r.w.Close()
	}
	f.wg.Wait()
	for _, r := range f.routers {
		r.nc.Close()
	}
}
