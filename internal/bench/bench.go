// Package bench measures fleetwatch end to end against a NATS server: how
// many outcome events per second the daemon (internal/serve) ingests
// compared with a plain nats.go subscriber that only counts messages, the
// rate with NDJSON batches, the latency from a tripping event's publish to
// the snapshot that shows the breaker open, and the memory of a large
// fleet in a bare analyzer. `fleetwatch bench` turns its flags into
// Settings and prints the Report; BENCHMARKS.md records the numbers.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
	"github.com/fleetwatch/fleetwatch/internal/serve"
)

// Settings configure a Run. The zero value runs the full measurement
// against an embedded NATS server.
type Settings struct {
	// URL is the NATS server to measure against. If empty, an embedded
	// server with JetStream is started in a temporary directory.
	URL string
	// NATSOptions are the daemon's nats.go options (authentication, TLS).
	NATSOptions []nats.Option
	// Dial connects the measuring clients (publishers, subscribers). If
	// nil, nats.Connect(url, nats.Name(name)) with NATSOptions is used.
	Dial func(name, url string) (*nats.Conn, error)
	// Events is the number of events per throughput run. If zero, 500,000.
	Events int
	// Batch is the number of events per NDJSON message in the batch run.
	// If zero, 100.
	Batch int
	// Trips is the number of breaker trips timed for the decision
	// latency. If zero, 200.
	Trips int
	// Rounds is the number of repetitions of each throughput run; the
	// best is reported. If zero, 3.
	Rounds int
	// NoJetStream runs the daemon without JetStream (no FW_OUTCOMES
	// capture, no KV), to see what capture costs.
	NoJetStream bool
	// Durable is the daemon's ingest.durable: nil the default (the
	// capture beside the core path), true the durable intake, false the
	// core path alone.
	Durable *bool
}

// Result is one throughput run of a Report.
type Result struct {
	Name      string  `json:"name"`
	Events    int     `json:"events"`
	Messages  int     `json:"messages"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"events_per_second"`
	Dropped   uint64  `json:"dropped"`
}

// Report is what Run measured.
type Report struct {
	// DecisionLatencyMs holds p50, p99 and max of the decision latency in
	// milliseconds.
	DecisionLatencyMs map[string]float64 `json:"decision_latency_ms"`
	// Throughput holds the baseline, the daemon with one event per
	// message and the daemon with NDJSON batches, in this order.
	Throughput []Result `json:"throughput"`
	// Trips is the number of trips behind DecisionLatencyMs.
	Trips int `json:"-"`
}

// WriteJSON writes the report as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}

// WriteText writes the report as a table, the ratios to the baseline and
// the decision latency.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "%-62s %10s %10s %14s %8s\n", "run", "events", "seconds", "events/s", "dropped")
	for _, t := range r.Throughput {
		fmt.Fprintf(w, "%-62s %10d %10.3f %14.0f %8d\n", t.Name, t.Events, t.Seconds, t.PerSecond, t.Dropped)
	}
	if len(r.Throughput) == 3 {
		fmt.Fprintf(w, "\nratio fleetwatch/baseline (1 event/msg): %.2f\n", r.Throughput[1].PerSecond/r.Throughput[0].PerSecond)
		fmt.Fprintf(w, "ratio NDJSON/baseline:                   %.2f\n", r.Throughput[2].PerSecond/r.Throughput[0].PerSecond)
	}
	lat := r.DecisionLatencyMs
	_, err := fmt.Fprintf(w, "decision latency, tripping event publish -> snapshot showing it open (%d trips, heartbeat 1s): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		r.Trips, lat["p50"], lat["p99"], lat["max"])
	return err
}

// withDefaults returns s with every zero field set to its default.
func (s Settings) withDefaults() Settings {
	if s.Events == 0 {
		s.Events = 500_000
	}
	if s.Batch == 0 {
		s.Batch = 100
	}
	if s.Trips == 0 {
		s.Trips = 200
	}
	if s.Rounds == 0 {
		s.Rounds = 3
	}
	if s.Dial == nil {
		opts := s.NATSOptions
		s.Dial = func(name, url string) (*nats.Conn, error) {
			return nats.Connect(url, append([]nats.Option{nats.Name(name)}, opts...)...)
		}
	}
	return s
}

// Run measures, in one run against one server configuration, the
// throughput of a count-only subscriber, of the daemon with one event per
// message and with NDJSON batches, and the decision latency.
func Run(ctx context.Context, s Settings) (*Report, error) {
	s = s.withDefaults()
	url := s.URL
	if url == "" {
		dir, err := os.MkdirTemp("", "fleetwatch-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		srv, err := natsrv.Start(natsrv.Settings{Listen: "127.0.0.1:-1", StoreDir: dir, ServerName: "bench"})
		if err != nil {
			return nil, err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
	}
	cfg := config.Default()
	cfg.NATS.URL = url
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Probes.Disabled = true
	cfg.NATS.NoJetStream = s.NoJetStream
	cfg.Ingest.Durable = s.Durable
	cfg.Data, _ = os.MkdirTemp("", "fleetwatch-bench-data-")
	defer os.RemoveAll(cfg.Data)

	single := Events(s.Events, 256)
	ndjson := Batches(single, s.Batch)

	// The baseline runs with the daemon up, so the server configuration
	// (FW_OUTCOMES stream, KV bucket) is the same in every run; the
	// daemon's collector is paused by publishing on a subject it does not
	// consume.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	d, err := serve.New(cfg, serve.Options{NATSOptions: s.NATSOptions, OnReady: func() { close(ready) }})
	if err != nil {
		return nil, err
	}
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(runCtx) }() // exits when runCtx is canceled below
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	// Measure a daemon that consumes: its start (leases, restore, replay)
	// is not part of any run.
	select {
	case <-ready:
	case err := <-runDone:
		return nil, fmt.Errorf("daemon: %w", err)
	}
	defer func() { cancel(); <-runDone }()
	if err := waitConsuming(d, subj, s.Dial, url, single[0]); err != nil {
		return nil, err
	}

	r := &Report{Trips: s.Trips}
	best := func(name string, run func() (Result, error)) error {
		var top Result
		for i := 0; i < s.Rounds; i++ {
			res, err := run()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if res.PerSecond > top.PerSecond {
				top = res
			}
		}
		top.Name = name
		r.Throughput = append(r.Throughput, top)
		return nil
	}
	baseName := "baseline: count-only nats.go subscriber, 1 event/msg, stream capture"
	if s.NoJetStream {
		baseName = "baseline: count-only nats.go subscriber, 1 event/msg"
	}
	if err := best(baseName, func() (Result, error) {
		return baseline(s.Dial, url, single, !s.NoJetStream)
	}); err != nil {
		return nil, err
	}
	if err := best("fleetwatch: collector + analyzer, 1 event/msg", func() (Result, error) {
		return daemon(d, subj, s.Dial, url, single, len(single))
	}); err != nil {
		return nil, err
	}
	if err := best(fmt.Sprintf("fleetwatch: collector + analyzer, NDJSON %d events/msg", s.Batch), func() (Result, error) {
		return daemon(d, subj, s.Dial, url, ndjson, len(single))
	}); err != nil {
		return nil, err
	}
	r.DecisionLatencyMs, err = decisionLatency(subj, s.Dial, url, s.Trips)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Events returns n outcome events of about size bytes each, spread over
// 10 pools of 10 backends, mostly successes.
func Events(n, size int) [][]byte {
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

// Batches joins events into NDJSON messages of per events.
func Batches(events [][]byte, per int) [][]byte {
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

// baseline times a plain subscriber that only counts messages; with
// capture, a stream stores the same subject meanwhile.
func baseline(dial func(name, url string) (*nats.Conn, error), url string, msgs [][]byte, capture bool) (Result, error) {
	sub, err := dial("bench baseline subscriber", url)
	if err != nil {
		return Result{}, err
	}
	defer sub.Close()
	pub, err := dial("bench publisher", url)
	if err != nil {
		return Result{}, err
	}
	defer pub.Close()
	if capture {
		// Stream capture on in both runs: the baseline's subject is
		// captured the way FW_OUTCOMES captures fleetwatch's (file
		// storage), so the server does the same kind of work for both.
		js, err := jetstream.New(pub)
		if err != nil {
			return Result{}, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: "BENCH_BASELINE", Subjects: []string{"bench.baseline.>"},
			Storage: jetstream.FileStorage, MaxAge: 10 * time.Minute, Discard: jetstream.DiscardOld,
		}); err != nil {
			return Result{}, fmt.Errorf("baseline capture stream: %w", err)
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
		return Result{}, err
	}
	s.SetPendingLimits(-1, -1)
	sub.Flush()
	start := time.Now()
	if err := publishAll(pub, "bench.baseline.edge", msgs); err != nil {
		return Result{}, err
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
	}
	el := time.Since(start)
	dropped, _ := s.Dropped()
	return Result{Events: int(got.Load()), Messages: len(msgs), Seconds: el.Seconds(), PerSecond: float64(got.Load()) / el.Seconds(), Dropped: uint64(dropped)}, nil
}

// waitConsuming publishes event until the daemon's collector has accepted
// one: then it consumes.
func waitConsuming(d *serve.Server, subj fleetwatch.Subjects, dial func(name, url string) (*nats.Conn, error), url string, event []byte) error {
	pub, err := dial("bench warm-up", url)
	if err != nil {
		return err
	}
	defer pub.Close()
	deadline := time.Now().Add(time.Minute)
	for d.IngestStats().AcceptedTotal() == 0 {
		if time.Now().After(deadline) {
			return errors.New("daemon: no event accepted within a minute of its start")
		}
		if err := pub.Publish(subj.Outcomes()+".bench", event); err != nil {
			return err
		}
		_ = pub.Flush()
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// daemon times the daemon's collector until it has accepted events.
func daemon(d *serve.Server, subj fleetwatch.Subjects, dial func(name, url string) (*nats.Conn, error), url string, msgs [][]byte, events int) (Result, error) {
	pub, err := dial("bench publisher", url)
	if err != nil {
		return Result{}, err
	}
	defer pub.Close()
	before := d.IngestStats()
	start := time.Now()
	if err := publishAll(pub, subj.Outcomes()+".bench", msgs); err != nil {
		return Result{}, err
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
	return Result{Events: got, Messages: len(msgs), Seconds: el.Seconds(), PerSecond: float64(got) / el.Seconds(), Dropped: st.Dropped - before.Dropped}, nil
}

// decisionLatency trips fresh backends with five consecutive failures
// and times each from the last failure's publish to the first snapshot on
// fw.decisions.<pool> that shows the backend open.
func decisionLatency(subj fleetwatch.Subjects, dial func(name, url string) (*nats.Conn, error), url string, trips int) (map[string]float64, error) {
	nc, err := dial("bench latency", url)
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

// MemoryReport is what Memory measured.
type MemoryReport struct {
	Backends, Pools int
	// Window is the analyzer window filled with events.
	Window time.Duration
	// HeapBytes is the live heap the analyzer added.
	HeapBytes float64
	// RSSBefore and RSSAfter are the process's resident set size before
	// and after, in bytes (0 when it cannot be read).
	RSSBefore, RSSAfter int64
}

// Write writes the report as one line.
func (m MemoryReport) Write(w io.Writer) error {
	_, err := fmt.Fprintf(w, "memory: %d backends in %d pools, full %v windows: heap +%.1f MiB (%.0f B/backend), RSS +%.1f MiB (%.1f MiB total)\n",
		m.Backends, m.Pools, m.Window, m.HeapBytes/(1<<20), m.HeapBytes/float64(m.Backends),
		float64(m.RSSAfter-m.RSSBefore)/(1<<20), float64(m.RSSAfter)/(1<<20))
	return err
}

// Memory tracks backends backends across pools pools in a bare analyzer,
// one event per backend per second over a full window, and measures the
// heap and the process RSS it adds.
func Memory(backends, pools int) (MemoryReport, error) {
	an, err := analyzer.New(analyzer.Config{})
	if err != nil {
		return MemoryReport{}, err
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rep := MemoryReport{Backends: backends, Pools: pools, Window: analyzer.DefaultWindow, RSSBefore: readRSS()}
	start := time.Now()
	batch := make([]fleetwatch.Event, 0, 1024)
	ids := make([]string, backends)
	poolIDs := make([]string, pools)
	for i := range ids {
		ids[i] = fmt.Sprintf("backend-%05d", i)
	}
	for i := range poolIDs {
		poolIDs[i] = fmt.Sprintf("pool-%03d", i)
	}
	for sec := time.Duration(0); sec < rep.Window; sec += time.Second {
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
	rep.RSSAfter = readRSS()
	rep.HeapBytes = float64(after.HeapAlloc) - float64(before.HeapAlloc)
	runtime.KeepAlive(an)
	return rep, nil
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
