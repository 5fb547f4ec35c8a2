package serve

import (
	"fmt"
	"maps"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// floodLimits are the limits of TestFloodOfInventedIDs: the defaults when
// FLEETWATCH_FLOOD_DEFAULTS is set (the measurement recorded in
// docs/DECISIONS.md "Bounded under abuse"), smaller ones otherwise so that
// the race-enabled suite stays quick on a small machine; the flood exceeds
// either.
func floodLimits() (analyzer.Limits, string) {
	if os.Getenv("FLEETWATCH_FLOOD_DEFAULTS") != "" {
		return analyzer.Limits{}.WithDefaults(), ""
	}
	l := analyzer.Limits{MaxPools: 100, MaxBackendsPerPool: 100, MaxBackends: 2000}
	return l, fmt.Sprintf("limits: {max_pools: %d, max_backends_per_pool: %d, max_backends: %d}\n",
		l.MaxPools, l.MaxBackendsPerPool, l.MaxBackends)
}

// snapshotTimes records when each snapshot of one pool arrived.
type snapshotTimes struct {
	mu    sync.Mutex // guards times
	times []time.Time
}

func (s *snapshotTimes) add(at time.Time) {
	s.mu.Lock()
	s.times = append(s.times, at)
	s.mu.Unlock()
}

// maxGapSince is the longest time between two consecutive snapshots
// arriving after since (and between since and the first of them, and the
// last of them and until).
func (s *snapshotTimes) maxGapSince(since, until time.Time) (gap time.Duration, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := since
	for _, at := range s.times {
		if at.Before(since) {
			continue
		}
		gap = max(gap, at.Sub(prev))
		prev = at
		n++
	}
	return max(gap, until.Sub(prev)), n
}

// TestFloodOfInventedIDs: one publisher invents 50,000 pool and backend ids
// (NDJSON batches of 500) while a configured pool has steady traffic. The
// tracked pools and backends stay within the limits, /metrics stays
// bounded, the refused events are counted by reason and by source, the
// legitimate pool keeps getting a snapshot at least every two heartbeats
// (three under the race detector), and the heap stays bounded.
func TestFloodOfInventedIDs(t *testing.T) {
	limits, limitsYAML := floodLimits()
	url, _ := feedtest.NewServer(t)
	p := startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n"+limitsYAML+
		"pools:\n  - id: legit\n    backends:\n      - id: real\n", Options{Logf: func(string, ...any) {}})
	const heartbeat = analyzer.DefaultHeartbeat

	nc := feedtest.Connect(t, url)
	var legit snapshotTimes
	if _, err := nc.Subscribe("fw.decisions.legit", func(*nats.Msg) { legit.add(time.Now()) }); err != nil {
		t.Fatal(err)
	}
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "legit", "real")

	// Steady legitimate traffic until the test ends.
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	traffic.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = nc.Publish("fw.outcomes.legit-proxy", []byte(testkit.Event("legit", "real", 200, 120)))
			}
		}
	})
	defer func() { close(stop); traffic.Wait() }()

	// The flood, far beyond every limit: first distinct pools of one
	// backend each, then, once those are consumed, distinct backends in 50
	// of the pools it left tracked.
	const invented, batch = 50000, 500
	const poolsFlood = invented * 2 / 5
	var payloads [][]byte
	var b strings.Builder
	add := func(pool, backend string) {
		fmt.Fprintf(&b, `{"pool":%q,"backend":%q,"status":200,"ttft_ms":100,"source":"flood-1"}`+"\n", pool, backend)
		if strings.Count(b.String(), "\n") == batch {
			payloads = append(payloads, []byte(b.String()))
			b.Reset()
		}
	}
	send := func(payloads [][]byte) {
		t.Helper()
		for _, payload := range payloads {
			if err := nc.Publish("fw.outcomes.flood", payload); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	refusedOf := func() (pools, backends uint64) {
		st := p.IngestStats()
		return st.Rejected[fleetwatch.ReasonTooManyPools], st.Rejected[fleetwatch.ReasonTooManyBackends]
	}
	// Every invented event is either tracked (each id is new) or refused.
	consumed := func(sent int) func() bool {
		return func() bool {
			rp, rb := refusedOf()
			_, backends := p.an.Tracked()
			return int(rp+rb)+backends-1 == sent // -1: legit/real
		}
	}
	for i := range poolsFlood {
		add(fmt.Sprintf("inv-%d", i), "b")
	}
	floodStart := time.Now()
	send(payloads)
	testkit.Eventually(t, 60*time.Second, "the pool flood tracked or refused", consumed(poolsFlood))
	var targets []string
	for _, snap := range p.Snapshots() {
		if snap.Pool != "legit" && len(targets) < 50 {
			targets = append(targets, snap.Pool)
		}
	}
	payloads = payloads[:0]
	for k := range invented - poolsFlood {
		add(targets[k%len(targets)], fmt.Sprintf("b-%d", k))
	}
	send(payloads)
	testkit.Eventually(t, 60*time.Second, "every invented event tracked or refused", consumed(invented))
	floodDone := time.Now()
	pools, backends := p.an.Tracked()
	rp, rb := refusedOf()
	t.Logf("flood of %d ids took %v; tracked %d pools and %d backends; refused %d too_many_pools, %d too_many_backends",
		invented, floodDone.Sub(floodStart).Round(time.Millisecond), pools, backends, rp, rb)
	if pools > limits.MaxPools || backends > limits.MaxBackends {
		t.Errorf("tracked %d pools and %d backends, beyond the limits %+v", pools, backends, limits)
	}
	if rp == 0 || rb == 0 {
		t.Errorf("refused %d too_many_pools and %d too_many_backends: the flood should hit both", rp, rb)
	}

	// The publisher goes on inventing pools (all refused now: the pools
	// are full) at 50,000 events a second (10,000 under the race detector)
	// for five heartbeats; then check the legitimate pool's snapshots
	// since the flood started.
	var reflooded int
	for deadline := time.Now().Add(5 * heartbeat); time.Now().Before(deadline); {
		payloads = payloads[:0]
		for range floodRatePerSecond / 10 {
			add(fmt.Sprintf("more-%d", reflooded), "b")
			reflooded++
		}
		send(payloads)
		time.Sleep(100 * time.Millisecond)
	}
	gap, n := legit.maxGapSince(floodStart, time.Now())
	if os.Getenv("FLOOD_DEBUG") != "" {
		legit.mu.Lock()
		for _, at := range legit.times {
			t.Logf("legit snapshot at %v", at.Sub(floodStart).Round(time.Millisecond))
		}
		legit.mu.Unlock()
		t.Logf("flood consumed at %v", floodDone.Sub(floodStart).Round(time.Millisecond))
	}
	t.Logf("%d more invented events sent after the first flood", reflooded)
	t.Logf("legit pool: %d snapshots since the flood started, longest gap %v", n, gap.Round(time.Millisecond))
	if gap > floodHeartbeatSlack*heartbeat {
		t.Errorf("the legitimate pool went %v without a snapshot during the flood (heartbeat %v)", gap, heartbeat)
	}

	// Wait for the reflood to be consumed, so the scrape is exact.
	var lastRefused uint64
	testkit.Eventually(t, 60*time.Second, "the reflood to be consumed", func() bool {
		rp, rb := refusedOf()
		settled := rp+rb == lastRefused
		lastRefused = rp + rb
		time.Sleep(200 * time.Millisecond)
		return settled
	})

	// /metrics: per-backend series only for tracked backends, the rejects
	// by reason and by source, and a bounded size overall.
	start := time.Now()
	code, text := testkit.HTTPGet(t, p.httpURL+"/metrics")
	scrape := time.Since(start)
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	lines := strings.Count(text, "\n")
	t.Logf("/metrics: %d lines, %d bytes, scraped in %v", lines, len(text), scrape.Round(time.Millisecond))
	// Ten series per backend is more than the nine gauges written; the
	// rest (process, ingest, histograms, rejects by source) is a few
	// thousand lines at most.
	if bound := 10*limits.MaxBackends + 5000; lines > bound {
		t.Errorf("/metrics has %d lines, above the bound %d", lines, bound)
	}
	if pools, backends := p.an.Tracked(); pools > limits.MaxPools || backends > limits.MaxBackends {
		t.Errorf("after the reflood: tracked %d pools and %d backends, beyond the limits %+v", pools, backends, limits)
	}
	if got := strings.Count(text, "fleetwatch_backend_state{"); got != backends {
		t.Errorf("/metrics has %d backend_state series, want one per tracked backend (%d)", got, backends)
	}
	rp, rb = refusedOf()
	if want := uint64(invented - backends + 1 + reflooded); rp+rb != want {
		t.Errorf("refused %d events, want %d (the reflooded ones too); nats.go dropped %d messages", rp+rb, want, p.IngestStats().Dropped)
	}
	for _, want := range []string{
		fmt.Sprintf(`fleetwatch_ingest_rejects_total{reason="too_many_pools"} %d`, rp),
		fmt.Sprintf(`fleetwatch_ingest_rejects_total{reason="too_many_backends"} %d`, rb),
		fmt.Sprintf(`fleetwatch_ingest_rejects_by_source_total{reason="too_many_pools",source="flood-1"} %d`, rp),
		fmt.Sprintf(`fleetwatch_ingest_rejects_by_source_total{reason="too_many_backends",source="flood-1"} %d`, rb),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The heap, the analyzer and the embedded NATS client and server
	// included, after a collection.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use after GC: %d MiB", ms.HeapInuse>>20)
	const heapBound = 512 << 20
	if ms.HeapInuse > heapBound {
		t.Errorf("heap in use %d MiB after the flood, above %d MiB", ms.HeapInuse>>20, heapBound>>20)
	}
}

// TestExpiredBackendForgetsTransitions: the transition counts of a backend
// go when it expires, scraped or not, so invented backends that trip and
// expire leave nothing behind.
func TestExpiredBackendForgetsTransitions(t *testing.T) {
	var s Server
	for _, tr := range []analyzer.Transition{
		{Pool: "p", Backend: "gone", From: fleetwatch.StateClosed, To: fleetwatch.StateOpen, Cause: analyzer.CauseConsecutive},
		{Pool: "p", Backend: "gone", From: fleetwatch.StateOpen, To: fleetwatch.StateHalfOpen, Cause: analyzer.CauseOpenElapsed},
		{Pool: "p", Backend: "stays", From: fleetwatch.StateClosed, To: fleetwatch.StateOpen, Cause: analyzer.CauseFailureRate},
		{Pool: "p", Backend: "gone", From: fleetwatch.StateHalfOpen, To: "", Cause: analyzer.CauseExpired},
	} {
		s.countTransition(tr)
	}
	want := map[transitionKey]uint64{{"p", "stays", fleetwatch.StateOpen, analyzer.CauseFailureRate}: 1}
	if !maps.Equal(want, s.rec.transitions) {
		t.Errorf("transitions = %v, want %v", s.rec.transitions, want)
	}
}
