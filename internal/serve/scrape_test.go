package serve

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestParseLoadMetrics(t *testing.T) {
	for _, tt := range []struct {
		name string
		page string
		want analyzer.LoadReport
		ok   bool
	}{
		{"vLLM, two engines", `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
`, analyzer.LoadReport{Running: 5, HasRunning: true, Waiting: 1, HasWaiting: true, KVCacheUsage: 0.375, HasKVCache: true}, true},
		{"older vLLM", "vllm:num_requests_running{model_name=\"m\"} 4\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n",
			analyzer.LoadReport{Running: 4, HasRunning: true, KVCacheUsage: 0.9, HasKVCache: true}, true},
		{"both kv names: the newer wins", "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n",
			analyzer.LoadReport{KVCacheUsage: 0.1, HasKVCache: true}, true},
		{"SGLang", `sglang:num_running_reqs{model_name="m",dp="0"} 7.0
sglang:num_queue_reqs{model_name="m",dp="0"} 2.0
sglang:token_usage{model_name="m",dp="0"} 0.28
`, analyzer.LoadReport{Running: 7, HasRunning: true, Waiting: 2, HasWaiting: true, KVCacheUsage: 0.28, HasKVCache: true}, true},
		{"labels with braces and quotes, a timestamp", `vllm:num_requests_running{model_name="a}\"b",engine="0"} 6 1700000000000` + "\n",
			analyzer.LoadReport{Running: 6, HasRunning: true}, true},
		{"a percent, bad samples skipped", "vllm:kv_cache_usage_perc 40\nvllm:num_requests_waiting NaN\nvllm:num_requests_waiting -1\nvllm:num_requests_running +Inf\n",
			analyzer.LoadReport{KVCacheUsage: 0.4, HasKVCache: true}, true},
		{"no known gauge", "process_cpu_seconds_total 12\n# vllm:num_requests_running 3\n", analyzer.LoadReport{}, false},
		{"unterminated labels", "vllm:num_requests_running{engine=\"0\" 3\n", analyzer.LoadReport{}, false},
		{"empty", "", analyzer.LoadReport{}, false},
	} {
		got, ok, err := parseLoadMetrics(strings.NewReader(tt.page))
		if err != nil || ok != tt.ok {
			t.Errorf("%s: ok %v err %v, want ok %v", tt.name, ok, err, tt.ok)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: (-want +got):\n%s", tt.name, diff)
		}
	}
}

// FuzzParseLoadMetrics: any page parses without panicking into values the
// analyzer accepts.
func FuzzParseLoadMetrics(f *testing.F) {
	f.Add("vllm:num_requests_running{engine=\"0\"} 3.0\nvllm:kv_cache_usage_perc 0.5\n")
	f.Add("sglang:token_usage{a=\"}\\\"\"} 1e2 123\n")
	f.Add("vllm:num_requests_waiting{")
	f.Fuzz(func(t *testing.T, page string) {
		r, ok, _ := parseLoadMetrics(strings.NewReader(page))
		if !(r.Running >= 0 && r.Waiting >= 0 && r.KVCacheUsage >= 0 && r.KVCacheUsage <= 1) {
			t.Fatalf("parseLoadMetrics(%q) = %+v", page, r)
		}
		if ok != (r.HasRunning || r.HasWaiting || r.HasKVCache) {
			t.Fatalf("ok %v with %+v", ok, r)
		}
	})
}

// snapshotsOn subscribes to the snapshots of the server's NATS.
func snapshotsOn(t *testing.T, p *running) (*nats.Conn, *testkit.SnapshotLog) {
	t.Helper()
	nc, err := nats.Connect(p.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, testkit.SubscribeSnapshots(t, nc)
}

// TestServeScrapesLoad: serve reads real fake backends' /metrics and
// publishes their load, with source "metrics", in the snapshots on NATS.
func TestServeScrapesLoad(t *testing.T) {
	busy, err := fakeai.Listen(fakeai.Settings{Name: "busy", KVCacheRequests: 4,
		Behavior: fakeai.Behavior{MaxConcurrent: 1, TTFT: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	idle, err := fakeai.Listen(fakeai.Settings{Name: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idle.Close() })
	// Three requests held by the busy backend: one running, two waiting.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range 3 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, busy.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"p"}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	testkit.Eventually(t, 10*time.Second, "the busy backend to hold 3 requests", func() bool { return busy.Stats().InFlight == 3 })

	p := startServer(t, fmt.Sprintf(`probes: {disabled: true}
pools:
  - id: p
    backends:
      - id: busy
        url: %s/v1
        metrics_url: auto
      - id: idle
        url: %s
        metrics_url: %s/metrics
`, busy.URL(), idle.URL(), idle.URL()), Options{})
	_, snaps := snapshotsOn(t, p)
	kv := func(v float64) *float64 { return &v }
	want := map[string]fleetwatch.Load{
		"busy": {Running: 1, Waiting: 2, KVCacheUsage: kv(0.25), Source: fleetwatch.LoadSourceMetrics},
		"idle": {Running: 0, Waiting: 0, KVCacheUsage: kv(0), Source: fleetwatch.LoadSourceMetrics},
	}
	got := map[string]fleetwatch.Load{}
	testkit.Eventually(t, 20*time.Second, "both backends' load in a snapshot", func() bool {
		for id := range want {
			b, ok := snaps.Backend("p", id)
			if !ok || b.Load == nil {
				return false
			}
			l := *b.Load
			if l.AgeMs < 0 || l.AgeMs > 3000 {
				t.Errorf("%s: age_ms %d outside [0, load_max_age]", id, l.AgeMs)
			}
			l.AgeMs = 0
			got[id] = l
		}
		return cmp.Equal(want, got)
	})
	_, page := testkit.HTTPGet(t, p.httpURL+"/metrics")
	for _, line := range []string{`fleetwatch_load_scrapes_total{pool="p",backend="busy"}`, `fleetwatch_load_scrape_duration_seconds_count`} {
		if !strings.Contains(page, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if !strings.Contains(page, `fleetwatch_load_scrape_failures_total{pool="p",backend="idle"} 0`) {
		t.Errorf("/metrics counts failures of a healthy endpoint")
	}
}

// scrapedPool starts a fake backend and returns the configuration of a
// pool p of it, backend a, whose metrics are read every 100ms.
func scrapedPool(t *testing.T) string {
	t.Helper()
	b, err := fakeai.Listen(fakeai.Settings{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return fmt.Sprintf(`scrape: {interval: 100ms}
pools:
  - id: p
    backends:
      - id: a
        url: %s/v1
        metrics_url: auto
`, b.URL())
}

// TestServeScrapesFasterThanASecond: scrape.interval below a second (the
// shortest is 50ms) is what serve does: 20 reads of one backend come
// within 15 s at 100ms, where a one-second interval needs 19 s or more.
func TestServeScrapesFasterThanASecond(t *testing.T) {
	p := startServer(t, "probes: {disabled: true}\n"+scrapedPool(t), Options{})
	series := `fleetwatch_load_scrapes_total{pool="p",backend="a"}`
	testkit.Eventually(t, 15*time.Second, "20 reads of the backend's metrics", func() bool {
		n, _ := strconv.Atoi(metricValue(t, p, series))
		return n >= 20
	})
	if v := metricValue(t, p, `fleetwatch_load_scrape_failures_total{pool="p",backend="a"}`); v != "0" {
		t.Errorf("failures = %q, want 0", v)
	}
}

// TestServeScrapeFailuresDelayNothing: a metrics endpoint that answers 500
// and one that never answers (within a minute's timeout) are counted as
// failures, and the snapshots keep their heartbeat meanwhile.
func TestServeScrapeFailuresDelayNothing(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(broken.Close)
	hung := make(chan struct{}, 1)
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case hung <- struct{}{}:
		default:
		}
		<-r.Context().Done() // until serve gives up: at its shutdown
	}))
	t.Cleanup(stuck.Close)
	p := startServer(t, fmt.Sprintf(`probes: {disabled: true}
scrape: {interval: 1s, timeout: 1m}
pools:
  - id: p
    backends:
      - id: broken
        metrics_url: %s/metrics
      - id: stuck
        metrics_url: %s/metrics
`, broken.URL, stuck.URL), Options{})
	_, snaps := snapshotsOn(t, p)
	select {
	case <-hung:
	case <-time.After(20 * time.Second):
		t.Fatal("serve never read the stuck endpoint")
	}
	// While the stuck read waits, snapshots keep coming (one a heartbeat)
	// and the broken endpoint keeps being read and counted.
	first := snaps.Count()
	testkit.Eventually(t, 20*time.Second, "three more snapshots while a scrape hangs", func() bool { return snaps.Count() >= first+3 })
	testkit.Eventually(t, 20*time.Second, "two failures of the broken endpoint", func() bool {
		_, page := testkit.HTTPGet(t, p.httpURL+"/metrics")
		return seriesValue(page, `fleetwatch_load_scrape_failures_total{pool="p",backend="broken"}`) >= 2
	})
	for _, id := range []string{"broken", "stuck"} {
		if b, ok := snaps.Backend("p", id); !ok || b.Load != nil {
			t.Errorf("%s: %+v, want a backend without load", id, b)
		}
	}
}

// TestServeCountsRoutersAndEventLoad: events from two sources make
// routers 2, and an event's load fields are published with source "event".
func TestServeCountsRoutersAndEventLoad(t *testing.T) {
	p := startServer(t, "probes: {disabled: true}\n", Options{})
	nc, snaps := snapshotsOn(t, p)
	testkit.WaitConsuming(t, nc, snaps, "p", "a") // source "test"
	testkit.Publish(t, nc, "fw.outcomes.r2", `{"v":1,"pool":"p","backend":"a","status":200,"ttft_ms":90,"source":"r2","running":4,"waiting":1,"kv_cache_usage":0.5}`)
	testkit.Eventually(t, 20*time.Second, "routers 2 and the event's load", func() bool {
		s, ok := snaps.Snapshot("p")
		if !ok || s.Routers != 2 {
			return false
		}
		l := s.Find("a").Load
		return l != nil && l.Source == fleetwatch.LoadSourceEvent && l.Running == 4 && l.Waiting == 1 &&
			l.KVCacheUsage != nil && *l.KVCacheUsage == 0.5
	})
}

// seriesValue is the value of series on a /metrics page, -1 when absent.
func seriesValue(page, series string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestHAScrapesOnlyWhatItDecides: with two instances, a backend's metrics
// are read by the instance that decides its pool and not by the other, so
// a server answers one read an interval whatever the instances; the
// survivor of a kill reads them once it has taken the partition over.
func TestHAScrapesOnlyWhatItDecides(t *testing.T) {
	t.Parallel() // waits on leases mostly
	url, _ := feedtest.NewServer(t)
	yaml := haYAML(url, 1) + scrapedPool(t)
	x := startInstance(t, "x", yaml)
	y := startInstance(t, "y", yaml)
	ins := []*instance{x, y}
	testkit.Eventually(t, 20*time.Second, "the partitions split between two instances", func() bool {
		ok, all, _ := exclusive(ins, 8)
		return ok && all && len(x.ownedPartitions()) > 0 && len(y.ownedPartitions()) > 0
	})
	reads := func(in *instance) uint64 {
		return in.metrics.GetOrCreateCounter(`fleetwatch_load_scrapes_total{pool="p",backend="a"}`).Get()
	}
	owner, other := x, y
	if !x.decides("p") {
		owner, other = y, x
	}
	if !owner.decides("p") || other.decides("p") {
		t.Fatalf("p decided by x %v, y %v: want one of them", x.decides("p"), y.decides("p"))
	}
	before, from := reads(other), reads(owner)
	testkit.Eventually(t, 15*time.Second, "20 reads by the deciding instance", func() bool { return reads(owner) >= from+20 })
	if !owner.decides("p") || other.decides("p") {
		t.Skip("p's partition moved during the test (a lease lost on a loaded machine): nothing to compare")
	}
	if got := reads(other); got != before {
		t.Errorf("%s, which does not decide p, read its backend %d times meanwhile", other.name, got-before)
	}

	owner.kill()
	testkit.Eventually(t, 30*time.Second, other.name+" to take p over", func() bool { return other.decides("p") })
	from = reads(other)
	testkit.Eventually(t, 15*time.Second, "20 reads by the survivor", func() bool { return reads(other) >= from+20 })
}
