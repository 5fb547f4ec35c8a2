package analyzer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fleetwatch/fleetwatch"
)

// benchEvents returns n events over the given pools and backends with a
// realistic mix of outcomes (90% ok with lognormal TTFTs around 200ms, 4%
// error, 3% throttled, 1% timeout, 1% canceled, 1% client_error) and each
// event's offset from the start of the run (rate events per second).
func benchEvents(n, pools, backendsPerPool int, rate float64) ([]fleetwatch.Event, []time.Duration) {
	rng := rand.New(rand.NewPCG(1, 2))
	evs := make([]fleetwatch.Event, n)
	offsets := make([]time.Duration, n)
	for i := range evs {
		p := rng.IntN(pools)
		e := fleetwatch.Event{
			Pool:    fmt.Sprintf("pool-%02d", p),
			Backend: fmt.Sprintf("backend-%02d-%03d", p, rng.IntN(backendsPerPool)),
		}
		switch r := rng.IntN(100); {
		case r < 90:
			e.Outcome, e.TTFTMs, e.HasTTFT = fleetwatch.OutcomeOK, math.Exp(math.Log(200)+0.5*rng.NormFloat64()), true
		case r < 94:
			e.Outcome = fleetwatch.OutcomeError
		case r < 97:
			e.Outcome, e.RetryAfterMs = fleetwatch.OutcomeThrottled, 1000
		case r < 98:
			e.Outcome = fleetwatch.OutcomeTimeout
		case r < 99:
			e.Outcome = fleetwatch.OutcomeCanceled
		default:
			e.Outcome = fleetwatch.OutcomeClientError
		}
		evs[i] = e
		offsets[i] = time.Duration(float64(i) / rate * float64(time.Second))
	}
	return evs, offsets
}

const benchBatch = 64

// runObserveBench feeds b.N events in batches of benchBatch to observe,
// stamping each with a time that keeps moving forward (10,000 events/s), so
// windows rotate as in production.
func runObserveBench(b *testing.B, observe func([]fleetwatch.Event)) {
	runObserveBenchWith(b, nil, observe)
}

// runObserveBenchWith is runObserveBench with each pregenerated event
// passed to decorate first (when not nil).
func runObserveBenchWith(b *testing.B, decorate func(i int, e *fleetwatch.Event), observe func([]fleetwatch.Event)) {
	const pregenerated = 1 << 16
	evs, offsets := benchEvents(pregenerated, 10, 10, 10_000)
	if decorate != nil {
		for i := range evs {
			decorate(i, &evs[i])
		}
	}
	span := offsets[pregenerated-1] + 100*time.Microsecond
	batch := make([]fleetwatch.Event, benchBatch)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += benchBatch {
		n := min(benchBatch, b.N-done)
		for i := range n {
			k := (done + i) % pregenerated
			batch[i] = evs[k]
			batch[i].TS = t0.Add(time.Duration((done+i)/pregenerated)*span + offsets[k])
		}
		observe(batch[:n])
	}
}

// BenchmarkObserve is the cost per event of Observe: 100 backends in 10
// pools, a realistic outcome mix, batches of 64.
func BenchmarkObserve(b *testing.B) {
	a := newAnalyzer(b, Config{})
	runObserveBench(b, func(batch []fleetwatch.Event) { a.Observe(batch) })
}

// baselineCounter is the floor Observe is compared with: a mutex, a
// two-level map lookup and a counter increment per event.
type baselineCounter struct {
	mu     sync.Mutex
	counts map[string]map[string]*[fleetwatch.NumOutcomes]uint64
}

func (c *baselineCounter) observe(batch []fleetwatch.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]map[string]*[fleetwatch.NumOutcomes]uint64{}
	}
	for i := range batch {
		ev := &batch[i]
		pool := c.counts[ev.Pool]
		if pool == nil {
			pool = map[string]*[fleetwatch.NumOutcomes]uint64{}
			c.counts[ev.Pool] = pool
		}
		n := pool[ev.Backend]
		if n == nil {
			n = new([fleetwatch.NumOutcomes]uint64)
			pool[ev.Backend] = n
		}
		n[ev.Outcome]++
	}
}

// BenchmarkObserveBaseline runs the baseline on the same batches as
// BenchmarkObserve.
func BenchmarkObserveBaseline(b *testing.B) {
	var c baselineCounter
	runObserveBench(b, c.observe)
}

// BenchmarkObserveVsBaseline alternates Observe and the baseline on the same
// chunks of events, so that both see the same machine load, and reports
// each one's ns per event and their ratio. On a busy shared machine this
// ratio is steadier than two separate benchmarks.
func BenchmarkObserveVsBaseline(b *testing.B) { observeVsBaseline(b, nil) }

// observeVsBaseline is BenchmarkObserveVsBaseline on events passed to
// decorate first (when not nil).
func observeVsBaseline(b *testing.B, decorate func(i int, e *fleetwatch.Event)) {
	a := newAnalyzer(b, Config{})
	var c baselineCounter
	var inAnalyzer, inBaseline time.Duration
	var events int
	runObserveBenchWith(b, decorate, func(batch []fleetwatch.Event) {
		start := time.Now()
		c.observe(batch)
		mid := time.Now()
		a.Observe(batch)
		inBaseline += mid.Sub(start)
		inAnalyzer += time.Since(mid)
		events += len(batch)
	})
	if events > 0 && inBaseline > 0 {
		b.ReportMetric(float64(inAnalyzer)/float64(events), "observe-ns/event")
		b.ReportMetric(float64(inBaseline)/float64(events), "baseline-ns/event")
		b.ReportMetric(float64(inAnalyzer)/float64(inBaseline), "ratio")
	}
}

// withLoad gives events what routers that copy ORCA reports send: one of
// four sources (interned strings, as the collector hands them over) per
// batch-sized run of events, and running, waiting and kv_cache_usage.
func withLoad(i int, e *fleetwatch.Event) {
	sources := [...]string{"router-a", "router-b", "router-c", "router-d"}
	e.Source = sources[(i/benchBatch)%len(sources)]
	e.Running, e.HasRunning = int64(i%16), true
	e.Waiting, e.HasWaiting = int64(i%3), true
	e.KVCacheUsage, e.HasKVCache = float64(i%100)/100, true
}

// BenchmarkObserveWithLoad is BenchmarkObserveVsBaseline on events that
// carry a source and load fields: the cost of the load report and the
// router count on the hot path.
func BenchmarkObserveWithLoad(b *testing.B) { observeVsBaseline(b, withLoad) }

// BenchmarkEvaluate1000 is one Evaluate (rules, weights and the snapshot)
// of a pool of 1,000 backends whose 30s windows are full (20 events per
// backend per second, 90% with a TTFT sample). Each iteration first observes
// one more second of events, outside the timer, so the windows stay full.
func BenchmarkEvaluate1000(b *testing.B) { evaluate1000(b, 0) }

// BenchmarkEvaluate1000ClientErrors is BenchmarkEvaluate1000 with 1% of the
// events client errors (status 404) on every backend: the client-error
// rule computes the peers' rates and sums at every Evaluate.
func BenchmarkEvaluate1000ClientErrors(b *testing.B) { evaluate1000(b, 100) }

// evaluate1000 runs the Evaluate benchmark; one event in clientErrEvery,
// drawn at random, is a client error (none when 0).
func evaluate1000(b *testing.B, clientErrEvery int) {
	const backends, perSecond = 1000, 20
	a := newAnalyzer(b, Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	second := func(s int) []fleetwatch.Event {
		evs := make([]fleetwatch.Event, 0, backends*perSecond)
		for i := range backends * perSecond {
			e := fleetwatch.Event{Pool: "big", Backend: fmt.Sprintf("backend-%04d", i%backends),
				TS: t0.Add(time.Duration(s)*time.Second + time.Duration(i)*time.Second/(backends*perSecond))}
			switch {
			case clientErrEvery > 0 && rng.IntN(clientErrEvery) == 0:
				e.Outcome, e.Status, e.HasStatus = fleetwatch.OutcomeClientError, 404, true
			case rng.IntN(10) == 0:
				e.Outcome = fleetwatch.OutcomeError
			default:
				e.Outcome, e.TTFTMs, e.HasTTFT = fleetwatch.OutcomeOK, math.Exp(math.Log(200)+0.5*rng.NormFloat64()), true
			}
			evs = append(evs, e)
		}
		return evs
	}
	for s := range 30 {
		a.Observe(second(s))
	}
	published := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		a.Observe(second(30 + i))
		b.StartTimer()
		ev := a.Evaluate(t0.Add(time.Duration(31+i) * time.Second))
		published += len(ev.Snapshots)
	}
	b.StopTimer()
	if published != b.N {
		b.Fatalf("%d snapshots in %d heartbeats", published, b.N)
	}
	snap, _ := a.Snapshot("big", t0.Add(time.Duration(31+b.N)*time.Second))
	if d := snap.Backends[0]; d.Requests < 500 || d.P95TTFTMs == nil {
		b.Fatalf("window not full: %+v", d)
	}
}

// BenchmarkEvaluateTick1000 is an Evaluate between heartbeats (a caller
// ticking every 100 ms) of the same full pool of 1,000 backends: the rules
// run, nothing changes, no snapshot is built.
func BenchmarkEvaluateTick1000(b *testing.B) {
	const backends = 1000
	a := newAnalyzer(b, Config{})
	evs := make([]fleetwatch.Event, 0, backends*600)
	for i := range backends * 600 {
		evs = append(evs, fleetwatch.Event{Pool: "big", Backend: fmt.Sprintf("backend-%04d", i%backends),
			Outcome: fleetwatch.OutcomeOK, TTFTMs: 200, HasTTFT: true,
			TS: t0.Add(time.Duration(i) * 30 * time.Second / (backends * 600))})
	}
	a.Observe(evs)
	a.Evaluate(t0.Add(30 * time.Second))
	published := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		// The 100 ms ticks between two heartbeats, over and over: time
		// must not run on, or the windows would empty.
		tick := time.Duration(i%8+1) * 100 * time.Millisecond
		published += len(a.Evaluate(t0.Add(30*time.Second + tick)).Snapshots)
	}
	b.StopTimer()
	if published > 0 {
		b.Fatalf("%d snapshots in %d ticks between heartbeats", published, b.N)
	}
	if snap, _ := a.Snapshot("big", t0.Add(30*time.Second)); len(snap.Backends) != backends || snap.Backends[0].Requests < 500 {
		b.Fatalf("pool not full: %d backends", len(snap.Backends))
	}
}

// BenchmarkMemory10kBackends tracks 10,000 backends across 100 pools with
// one event per backend per second for a whole window (so every bucket of
// every window holds a sample) and reports the heap per backend. Run it
// with -benchtime=1x.
func BenchmarkMemory10kBackends(b *testing.B) {
	const pools, perPool = 100, 100
	ids := make([][2]string, 0, pools*perPool)
	for p := range pools {
		for k := range perPool {
			ids = append(ids, [2]string{fmt.Sprintf("pool-%03d", p), fmt.Sprintf("backend-%03d-%03d", p, k)})
		}
	}
	batch := make([]fleetwatch.Event, len(ids))
	var perBackend float64
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		a := newAnalyzer(b, Config{})
		for s := range 30 {
			for i, id := range ids {
				batch[i] = fleetwatch.Event{Pool: id[0], Backend: id[1], Outcome: fleetwatch.OutcomeOK,
					TTFTMs: 150 + float64(i%100), HasTTFT: true, TS: t0.Add(time.Duration(s) * time.Second)}
			}
			a.Observe(batch)
		}
		a.Evaluate(t0.Add(30 * time.Second))
		runtime.GC()
		runtime.ReadMemStats(&after)
		perBackend = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(ids))
		runtime.KeepAlive(a)
	}
	b.ReportMetric(perBackend, "heap-bytes/backend")
	b.ReportMetric(float64(windowBytes(30)), "window-bytes/backend")
}

// windowBytes is the fixed size of a window of n buckets once it holds a
// latency sample: the buckets and the window's histogram (the bins of the
// samples themselves grow with traffic, 2 bytes each).
func windowBytes(n int) int {
	return n*int(unsafe.Sizeof(bucket{})) + int(unsafe.Sizeof(histogram{}))
}
