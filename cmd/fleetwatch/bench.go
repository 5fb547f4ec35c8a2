package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

func init() {
	register("bench", "end-to-end throughput and decision latency against a plain NATS subscriber", runBench)
}

// benchResult is one line of bench's report.
type benchResult struct {
	Name      string  `json:"name"`
	Events    int     `json:"events"`
	Messages  int     `json:"messages"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"events_per_second"`
	Dropped   uint64  `json:"dropped"`
}

// runBench measures, in one run against one server configuration, how many
// outcome events per second fleetwatch ingests compared with a plain
// nats.go subscriber that only counts messages, the rate with NDJSON
// batches, and the latency from a tripping event's publish to the snapshot
// that shows the breaker open.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	events := fs.Int("events", 500_000, "events per throughput run")
	batch := fs.Int("batch", 100, "events per NDJSON message in the batch run")
	trips := fs.Int("trips", 200, "breaker trips timed for the decision latency")
	rounds := fs.Int("rounds", 3, "repetitions of each throughput run (the best is reported)")
	asJSON := fs.Bool("json", false, "print results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memory := fs.Bool("memory", false, "only measure the memory of 10,000 backends in 100 pools")
	noCapture := fs.Bool("no-jetstream", false, "run fleetwatch without JetStream (no FW_OUTCOMES capture, no KV), to see what capture costs")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memory {
		return benchMemory(stdout, 10_000, 100)
	}
	url := nf.url
	if url == "" {
		dir, err := os.MkdirTemp("", "fleetwatch-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := natsrv.Start(natsrv.Settings{Listen: "127.0.0.1:-1", StoreDir: dir, ServerName: "bench"})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
	}
	cfg := config.Default()
	cfg.NATS.URL = url
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Probes.Disabled = true
	cfg.NATS.NoJetStream = *noCapture
	cfg.Data, _ = os.MkdirTemp("", "fleetwatch-bench-data-")
	defer os.RemoveAll(cfg.Data)

	single := benchEvents(*events, 256)
	ndjson := benchBatches(single, *batch)

	// The baseline runs with the daemon up, so the server configuration
	// (FW_OUTCOMES stream, KV bucket) is the same in every run; the
	// daemon's collector is paused by publishing on a subject it does not
	// consume.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	nopts, err := nf.options()
	if err != nil {
		return err
	}
	d, err := serve.New(cfg, serve.Options{NATSOptions: nopts})
	if err != nil {
		return err
	}
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(runCtx) }()
	defer func() { cancel(); <-runDone }()
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}

	var results []benchResult
	best := func(name string, run func() (benchResult, error)) error {
		var top benchResult
		for i := 0; i < *rounds; i++ {
			r, err := run()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if r.PerSecond > top.PerSecond {
				top = r
			}
		}
		top.Name = name
		results = append(results, top)
		return nil
	}
	baseName := "baseline: count-only nats.go subscriber, 1 event/msg, stream capture"
	if *noCapture {
		baseName = "baseline: count-only nats.go subscriber, 1 event/msg"
	}
	if err := best(baseName, func() (benchResult, error) {
		return benchBaseline(&nf, url, single, !*noCapture)
	}); err != nil {
		return err
	}
	if err := best("fleetwatch: collector + analyzer, 1 event/msg", func() (benchResult, error) {
		return benchDaemon(d, subj, &nf, url, single, len(single))
	}); err != nil {
		return err
	}
	if err := best(fmt.Sprintf("fleetwatch: collector + analyzer, NDJSON %d events/msg", *batch), func() (benchResult, error) {
		return benchDaemon(d, subj, &nf, url, ndjson, len(single))
	}); err != nil {
		return err
	}
	lat, err := benchDecisionLatency(subj, &nf, url, *trips)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"throughput": results, "decision_latency_ms": lat})
	}
	fmt.Fprintf(stdout, "%-62s %10s %10s %14s %8s\n", "run", "events", "seconds", "events/s", "dropped")
	for _, r := range results {
		fmt.Fprintf(stdout, "%-62s %10d %10.3f %14.0f %8d\n", r.Name, r.Events, r.Seconds, r.PerSecond, r.Dropped)
	}
	fmt.Fprintf(stdout, "\nratio fleetwatch/baseline (1 event/msg): %.2f\n", results[1].PerSecond/results[0].PerSecond)
	fmt.Fprintf(stdout, "ratio NDJSON/baseline:                   %.2f\n", results[2].PerSecond/results[0].PerSecond)
	fmt.Fprintf(stdout, "decision latency, tripping event publish -> snapshot showing it open (%d trips, heartbeat 1s): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		*trips, lat["p50"], lat["p99"], lat["max"])
	return nil
}

// benchEvents returns n outcome events of about size bytes each, spread over
// 10 pools of 10 backends, mostly successes.
func benchEvents(n, size int) [][]byte {
	out := make([][]byte, n)
	ts := fleetwatch.FormatTime(time.Now())
	for i := range out {
		status := 200
		switch i % 50 {
		case 7:
			status = 500
		case 19:
			status = 429
		}
		e := fmt.Sprintf(`{"v":1,"pool":"bench-%d","backend":"vllm-%d","ts":%q,"status":%d,"ttft_ms":%d.5,"duration_ms":2300.5,"input_tokens":1200,"output_tokens":350,"source":"bench-`,
			i%10, (i/10)%10, ts, status, 100+i%200)
		pad := size - len(e) - 2
		if pad < 1 {
			pad = 1
		}
		out[i] = []byte(e + strings.Repeat("x", pad) + `"}`)
	}
	return out
}

// benchBatches joins events into NDJSON messages of per events.
func benchBatches(events [][]byte, per int) [][]byte {
	var out [][]byte
	for i := 0; i < len(events); i += per {
		j := min(i+per, len(events))
		out = append(out, slices.Concat(joinLines(events[i:j])...))
	}
	return out
}

func joinLines(lines [][]byte) [][]byte {
	out := make([][]byte, 0, 2*len(lines))
	for i, l := range lines {
		if i > 0 {
			out = append(out, []byte{'\n'})
		}
		out = append(out, l)
	}
	return out
}

func publishAll(nc *nats.Conn, subject string, msgs [][]byte) error {
	for _, m := range msgs {
		if err := nc.Publish(subject, m); err != nil {
			return err
		}
	}
	return nc.Flush()
}

// benchBaseline times a plain subscriber that only counts messages; with
// capture, a stream stores the same subject meanwhile.
func benchBaseline(nf *natsFlags, url string, msgs [][]byte, capture bool) (benchResult, error) {
	sub, err := nf.connectURL("bench baseline subscriber", url, nil)
	if err != nil {
		return benchResult{}, err
	}
	defer sub.Close()
	pub, err := nf.connectURL("bench publisher", url, nil)
	if err != nil {
		return benchResult{}, err
	}
	defer pub.Close()
	if capture {
		// Stream capture on in both runs: the baseline's subject is
		// captured the way FW_OUTCOMES captures fleetwatch's (file
		// storage), so the server does the same kind of work for both.
		js, err := jetstream.New(pub)
		if err != nil {
			return benchResult{}, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: "BENCH_BASELINE", Subjects: []string{"bench.baseline.>"},
			Storage: jetstream.FileStorage, MaxAge: 10 * time.Minute, Discard: jetstream.DiscardOld,
		}); err != nil {
			return benchResult{}, fmt.Errorf("baseline capture stream: %w", err)
		}
		defer js.DeleteStream(context.WithoutCancel(ctx), "BENCH_BASELINE")
	}
	var got atomic.Int64
	done := make(chan struct{})
	want := int64(len(msgs))
	s, err := sub.Subscribe("bench.baseline.>", func(*nats.Msg) {
		if got.Add(1) == want {
			close(done)
		}
	})
	if err != nil {
		return benchResult{}, err
	}
	s.SetPendingLimits(-1, -1)
	sub.Flush()
	start := time.Now()
	if err := publishAll(pub, "bench.baseline.edge", msgs); err != nil {
		return benchResult{}, err
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
	}
	el := time.Since(start)
	dropped, _ := s.Dropped()
	return benchResult{Events: int(got.Load()), Messages: len(msgs), Seconds: el.Seconds(), PerSecond: float64(got.Load()) / el.Seconds(), Dropped: uint64(dropped)}, nil
}

// benchDaemon times the daemon's collector until it has accepted events.
func benchDaemon(d *serve.Server, subj fleetwatch.Subjects, nf *natsFlags, url string, msgs [][]byte, events int) (benchResult, error) {
	pub, err := nf.connectURL("bench publisher", url, nil)
	if err != nil {
		return benchResult{}, err
	}
	defer pub.Close()
	before := d.IngestStats()
	start := time.Now()
	if err := publishAll(pub, subj.Outcomes()+".bench", msgs); err != nil {
		return benchResult{}, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	var st = d.IngestStats()
	for int(st.AcceptedTotal()-before.AcceptedTotal()) < events && time.Now().Before(deadline) {
		if st.Dropped > before.Dropped {
			break // the rest will never arrive
		}
		time.Sleep(time.Millisecond)
		st = d.IngestStats()
	}
	el := time.Since(start)
	got := int(st.AcceptedTotal() - before.AcceptedTotal())
	return benchResult{Events: got, Messages: len(msgs), Seconds: el.Seconds(), PerSecond: float64(got) / el.Seconds(), Dropped: st.Dropped - before.Dropped}, nil
}

// benchDecisionLatency trips fresh backends with five consecutive failures
// and times each from the last failure's publish to the first snapshot on
// fw.decisions.<pool> that shows the backend open.
func benchDecisionLatency(subj fleetwatch.Subjects, nf *natsFlags, url string, trips int) (map[string]float64, error) {
	nc, err := nf.connectURL("bench latency", url, nil)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	// One pool per trip: the ejection cap would hold back most trips of a
	// single pool whose backends all fail.
	const poolPrefix = "bench-latency-"
	sent := make([]atomic.Int64, trips) // unix nanos of the tripping publish
	seen := make([]atomic.Int64, trips)
	var opened atomic.Int64
	allOpen := make(chan struct{})
	sub, err := nc.Subscribe(subj.DecisionsWildcard(), func(m *nats.Msg) {
		now := time.Now().UnixNano()
		var s fleetwatch.Snapshot
		if json.Unmarshal(m.Data, &s) != nil || !strings.HasPrefix(s.Pool, poolPrefix) {
			return
		}
		i, err := strconv.Atoi(strings.TrimPrefix(s.Pool, poolPrefix))
		if err != nil || i < 0 || i >= trips {
			return
		}
		if b := s.Find("trip"); b != nil && b.State == fleetwatch.StateOpen && sent[i].Load() != 0 && seen[i].CompareAndSwap(0, now) {
			if opened.Add(1) == int64(trips) {
				close(allOpen)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	nc.Flush()
	for i := 0; i < trips; i++ {
		fail := fmt.Appendf(nil, `{"pool":"%s%d","backend":"trip","status":503}`, poolPrefix, i)
		for j := 0; j < 4; j++ {
			nc.Publish(subj.Outcomes(), fail)
		}
		sent[i].Store(time.Now().UnixNano())
		nc.Publish(subj.Outcomes(), fail)
		nc.Flush()
		time.Sleep(5 * time.Millisecond) // one trip at a time, not a burst
	}
	select {
	case <-allOpen:
	case <-time.After(30 * time.Second):
	}
	var ms []float64
	for i := range trips {
		if s, e := sent[i].Load(), seen[i].Load(); s != 0 && e != 0 {
			ms = append(ms, float64(e-s)/1e6)
		}
	}
	if len(ms) < trips {
		return nil, fmt.Errorf("only %d of %d trips showed up in a snapshot", len(ms), trips)
	}
	slices.Sort(ms)
	q := func(p float64) float64 { return ms[min(len(ms)-1, int(p*float64(len(ms))))] }
	return map[string]float64{"p50": q(0.5), "p99": q(0.99), "max": ms[len(ms)-1]}, nil
}

// benchMemory tracks backends backends across pools pools in a bare
// analyzer, one event per backend per bucket over a full window, and
// reports the heap and the process RSS it adds.
func benchMemory(stdout io.Writer, backends, pools int) error {
	an, err := analyzer.New(analyzer.Config{})
	if err != nil {
		return err
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := readRSS()
	start := time.Now()
	window := analyzer.DefaultWindow
	batch := make([]fleetwatch.Event, 0, 1024)
	ids := make([]string, backends)
	poolIDs := make([]string, pools)
	for i := range ids {
		ids[i] = fmt.Sprintf("backend-%05d", i)
	}
	for i := range poolIDs {
		poolIDs[i] = fmt.Sprintf("pool-%03d", i)
	}
	for sec := time.Duration(0); sec < window; sec += time.Second {
		ts := start.Add(sec)
		for i := range ids {
			batch = append(batch, fleetwatch.Event{Pool: poolIDs[i%pools], Backend: ids[i], TS: ts,
				Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, TTFTMs: float64(100 + i%300), HasTTFT: true})
			if len(batch) == cap(batch) {
				an.Observe(batch)
				batch = batch[:0]
			}
		}
		an.Observe(batch)
		batch = batch[:0]
		an.Evaluate(ts)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	rssAfter := readRSS()
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	fmt.Fprintf(stdout, "memory: %d backends in %d pools, full %v windows: heap +%.1f MiB (%.0f B/backend), RSS +%.1f MiB (%.1f MiB total)\n",
		backends, pools, window, heap/(1<<20), heap/float64(backends), float64(rssAfter-rssBefore)/(1<<20), float64(rssAfter)/(1<<20))
	runtime.KeepAlive(an)
	return nil
}

// readRSS returns the resident set size of this process in bytes (Linux),
// or 0 when it cannot be read.
func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
