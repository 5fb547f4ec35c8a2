package bench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// The scale benchmark's fleet: P pools of B backends in serve's
// configuration and the routers' (the same ids), and the synthetic outcome
// traffic that moves their loads.

func poolID(i int) string           { return fmt.Sprintf("pool-%03d", i) }
func backendID(pool, i int) string  { return fmt.Sprintf("p%03d-b%04d", pool, i) }
func backendURL(pool, i int) string { return "http://127.0.0.1:9/" + backendID(pool, i) }

// serveConfig is serve's YAML: the pools and backends, HA with three
// replicas (and enough partitions for three instances to share evenly),
// limits that hold the fleet.
func serveConfig(pools, backends, serves int) string {
	var b strings.Builder
	partitions := 16
	if serves > 1 {
		partitions = 18 // a multiple of 3: an even split
	}
	fmt.Fprintf(&b, "ha:\n  replicas: 3\n  partitions: %d\nlimits:\n  max_pools: %d\n  max_backends_per_pool: %d\n  max_backends: %d\npools:\n",
		partitions, max(1000, pools), max(1000, backends), max(20000, pools*backends))
	for p := range pools {
		fmt.Fprintf(&b, "  - id: %s\n    backends:\n", poolID(p))
		for i := range backends {
			fmt.Fprintf(&b, "      - {id: %s, url: %q}\n", backendID(p, i), backendURL(p, i))
		}
	}
	return b.String()
}

// routePools is the routers' configuration of the pools a router follows.
func routePools(ids []int, backends int) []route.Pool {
	out := make([]route.Pool, 0, len(ids))
	for _, p := range ids {
		rp := route.Pool{ID: poolID(p), ORCA: route.ORCAOff}
		for i := range backends {
			rp.Backends = append(rp.Backends, route.Backend{ID: backendID(p, i), URL: backendURL(p, i)})
		}
		out = append(out, rp)
	}
	return out
}

// serveProc is one `fleetwatch serve` with its HTTP address.
type serveProc struct {
	scaleProc
	http string
}

var serveHTTPLine = regexp.MustCompile(`HTTP on http://(\S+)`)

// startServe starts serve number i on the cluster (its first URL the
// node i % 3) and waits for its HTTP line.
func startServe(ctx context.Context, bin, dir string, i int, urls, config string) (*serveProc, error) {
	sd := filepath.Join(dir, fmt.Sprintf("serve-%d", i))
	if err := os.MkdirAll(sd, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(sd, "fleetwatch.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	s := &serveProc{}
	s.name, s.bin = fmt.Sprintf("serve-%d", i), bin
	s.args = []string{"serve", "--config", cfg, "--nats", urls, "--http", "127.0.0.1:0",
		"--data", filepath.Join(sd, "data"), "--no-probes"}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if m := serveHTTPLine.FindStringSubmatch(s.out.String()); m != nil {
			s.http = m[1]
			return s, nil
		}
		if !s.running() || time.Now().After(deadline) {
			s.stop(syscall.SIGKILL)
			return nil, fmt.Errorf("bench scale: %s did not start: %s", s.name, tail(s.out.String(), 3000))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serveCounters are the counters of serve's /metrics the model uses.
type serveCounters struct {
	KeyFrames, LoadFrames, FrameBytes, Published float64
	// Refused are the events the collector rejected (every reason: the
	// analyzer's limits among them), Dropped those lost to a slow
	// subscription.
	Refused, Dropped float64
}

var metricLine = regexp.MustCompile(`^(fleetwatch_feed_frames_published_total\{kind="(key|loads)"\}|fleetwatch_feed_frame_bytes_total|fleetwatch_decisions_published_total|fleetwatch_ingest_rejects_total\{reason="[a-z_]+"\}|fleetwatch_ingest_dropped_total) (\S+)$`)

// counters reads serve's feed counters from /metrics.
func (s *serveProc) counters(ctx context.Context) (serveCounters, error) {
	var c serveCounters
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.http+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch {
		case m[2] == "key":
			c.KeyFrames = v
		case m[2] == "loads":
			c.LoadFrames = v
		case strings.HasPrefix(m[1], "fleetwatch_feed_frame_bytes"):
			c.FrameBytes = v
		case strings.HasPrefix(m[1], "fleetwatch_ingest_rejects_total"):
			c.Refused += v
		case m[1] == "fleetwatch_ingest_dropped_total":
			c.Dropped = v
		default:
			c.Published = v
		}
	}
	return c, sc.Err()
}

// traffic publishes synthetic outcome events for every backend: each
// backend answers Rate requests per second (Poisson arrivals), each event
// carrying its load (running, waiting) and TTFT. A backend's load is a
// random walk of its queue (running + waiting, 0 to 12, up to 8 running),
// one step up or down or none per event; its TTFT is its own base (150-400
// ms) with 10% noise. Events go out as NDJSON batches every 50 ms, from
// several sources (as several routers would publish them).
type traffic struct {
	nc       *nats.Conn
	subjects fleetwatch.Subjects
	pools    int
	backends int
	rate     float64
	rng      *rand.Rand
	queue    []int
	base     []float64
	events   atomic.Int64
	bytes    atomic.Int64
	stop     chan struct{}
	done     sync.WaitGroup
}

const (
	trafficTick    = 50 * time.Millisecond
	trafficSources = 8
	queueMax       = 12
	runningMax     = 8
)

func newTraffic(nc *nats.Conn, pools, backends int, rate float64, seed uint64) *traffic {
	t := &traffic{nc: nc, pools: pools, backends: backends, rate: rate,
		rng: rand.New(rand.NewPCG(seed, 0x5ca1e)), stop: make(chan struct{})}
	n := pools * backends
	t.queue, t.base = make([]int, n), make([]float64, n)
	for i := range n {
		t.queue[i] = 3 + t.rng.IntN(6)
		t.base[i] = 150 + 250*t.rng.Float64()
	}
	return t
}

// run publishes until close.
func (t *traffic) run() {
	t.done.Add(1)
	go func() { // ends at close
		defer t.done.Done()
		tick := time.NewTicker(trafficTick)
		defer tick.Stop()
		var evs []fleetwatch.Event
		var buf []byte
		src := 0
		for {
			select {
			case <-t.stop:
				return
			case now := <-tick.C:
				evs = t.tick(evs[:0], now)
				// One batch per source, as routers batch theirs.
				per := (len(evs) + trafficSources - 1) / trafficSources
				for lo := 0; lo < len(evs); lo += max(per, 1) {
					hi := min(lo+per, len(evs))
					for i := lo; i < hi; i++ {
						evs[i].Source = "edge-" + strconv.Itoa(src)
					}
					buf = fleetwatch.AppendNDJSON(buf[:0], evs[lo:hi])
					if err := t.nc.Publish(t.subjects.OutcomesFrom("edge-"+strconv.Itoa(src)), buf); err == nil {
						t.events.Add(int64(hi - lo))
						t.bytes.Add(int64(len(buf)))
					}
					src = (src + 1) % trafficSources
				}
			}
		}
	}()
}

// tick draws one tick's events: each backend answers with probability
// rate x tick (Poisson thinning; at most one per tick, exact enough for
// rate x tick well below 1).
func (t *traffic) tick(evs []fleetwatch.Event, now time.Time) []fleetwatch.Event {
	p := t.rate * trafficTick.Seconds()
	for k := range t.queue {
		if t.rng.Float64() >= p {
			continue
		}
		switch t.rng.IntN(3) {
		case 0:
			t.queue[k] = max(t.queue[k]-1, 0)
		case 1:
			t.queue[k] = min(t.queue[k]+1, queueMax)
		}
		q := t.queue[k]
		running, waiting := min(q, runningMax), max(q-runningMax, 0)
		ttft := t.base[k] * math.Max(0.5, 1+0.1*t.rng.NormFloat64())
		evs = append(evs, fleetwatch.Event{
			Pool: poolID(k / t.backends), Backend: backendID(k/t.backends, k%t.backends), TS: now,
			Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, TTFTMs: ttft, HasTTFT: true,
			Running: int64(running), HasRunning: true, Waiting: int64(waiting), HasWaiting: true,
		})
	}
	return evs
}

func (t *traffic) close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.done.Wait()
}
