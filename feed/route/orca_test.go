package route

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestParseORCA(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		want orcaReport
		ok   bool
	}{
		{"vLLM TEXT", "TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4",
			orcaReport{waiting: 3, hasWaiting: true, kv: 0.4, hasKV: true}, true},
		{"vLLM JSON", `JSON {"named_metrics": {"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.4}}`,
			orcaReport{waiting: 3, hasWaiting: true, kv: 0.4, hasKV: true}, true},
		{"lowercase word, no spaces", "text named_metrics.kv_cache_usage_perc=0.25,named_metrics.num_requests_waiting=0",
			orcaReport{waiting: 0, hasWaiting: true, kv: 0.25, hasKV: true}, true},
		{"no format word", "named_metrics.kv_cache_usage_perc=0.5,named_metrics.num_requests_waiting=1",
			orcaReport{waiting: 1, hasWaiting: true, kv: 0.5, hasKV: true}, true},
		{"bare JSON", `{"named_metrics":{"num_requests_running":7}}`, orcaReport{running: 7, hasRunning: true}, true},
		{"running and the older kv name", "TEXT named_metrics.num_requests_running=12, named_metrics.gpu_cache_usage_perc=1",
			orcaReport{running: 12, hasRunning: true, kv: 1, hasKV: true}, true},
		{"ORCA's example name", "TEXT cpu_utilization=0.3, named_metrics.kv_cache_utilization=0.4",
			orcaReport{kv: 0.4, hasKV: true}, true},
		{"a percent", "TEXT named_metrics.kv_cache_usage_perc=40", orcaReport{kv: 0.4, hasKV: true}, true},
		{"fractional count rounds", "TEXT named_metrics.num_requests_waiting=2.6", orcaReport{waiting: 3, hasWaiting: true}, true},
		{"bad values dropped, others kept",
			"TEXT named_metrics.num_requests_waiting=-1, named_metrics.kv_cache_usage_perc=NaN, named_metrics.num_requests_running=x, named_metrics.kv_cache_usage_perc=0.1",
			orcaReport{kv: 0.1, hasKV: true}, true},
		{"kv beyond a percent", "TEXT named_metrics.kv_cache_usage_perc=101", orcaReport{}, true},
		{"count beyond the bound", "TEXT named_metrics.num_requests_waiting=1e12", orcaReport{}, true},
		{"infinity", "TEXT named_metrics.num_requests_waiting=+Inf", orcaReport{}, true},
		{"top-level fields only", "TEXT cpu_utilization=0.3, mem_utilization=0.8", orcaReport{}, true},
		{"JSON with strings", `JSON {"named_metrics": {"num_requests_waiting": "3", "kv_cache_usage_perc": 0.2}}`,
			orcaReport{kv: 0.2, hasKV: true}, true},
		{"empty", "", orcaReport{}, false},
		{"format word only", "TEXT", orcaReport{}, false},
		{"BIN", "BIN CgkJAAAAAAAA4D8=", orcaReport{}, false},
		{"malformed JSON", `JSON {"named_metrics": {`, orcaReport{}, false},
		{"no pairs", "TEXT hello, world", orcaReport{}, false},
		{"too long", "TEXT named_metrics.num_requests_waiting=1, " + strings.Repeat("x=1, ", 1000), orcaReport{}, false},
	} {
		got, ok := parseORCA(tt.in)
		if ok != tt.ok || got != tt.want {
			t.Errorf("%s: parseORCA(%q) = %+v, %v; want %+v, %v", tt.name, tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseORCA: arbitrary header values never panic and never yield a
// value out of range; a report written in either of vLLM's formats reads
// back as written.
func FuzzParseORCA(f *testing.F) {
	f.Add("TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4", uint32(3), uint16(400))
	f.Add(`JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.0}}`, uint32(0), uint16(0))
	f.Add("named_metrics.num_requests_running=1e3", uint32(1<<30), uint16(1000))
	f.Add("BIN \x00\xff", uint32(7), uint16(999))
	f.Fuzz(func(t *testing.T, header string, waiting uint32, kvPermille uint16) {
		r, _ := parseORCA(header)
		if r.running < 0 || r.running > maxORCACount || r.waiting < 0 || r.waiting > maxORCACount ||
			!(r.kv >= 0 && r.kv <= 1) {
			t.Fatalf("parseORCA(%q) = %+v: out of range", header, r)
		}
		w := int64(waiting % (maxORCACount + 1))
		kv := float64(kvPermille%1001) / 1000
		want := orcaReport{waiting: w, hasWaiting: true, kv: kv, hasKV: true}
		for _, enc := range []string{
			fmt.Sprintf("TEXT named_metrics.num_requests_waiting=%d.0, named_metrics.kv_cache_usage_perc=%v", w, kv),
			fmt.Sprintf(`JSON {"named_metrics": {"num_requests_waiting": %d.0, "kv_cache_usage_perc": %v}}`, w, kv),
		} {
			if got, ok := parseORCA(enc); !ok || got != want {
				t.Fatalf("parseORCA(%q) = %+v, %v; want %+v", enc, got, ok, want)
			}
		}
	})
}

func TestORCASettingChecked(t *testing.T) {
	p := Pool{ID: "p", ORCA: "binary", Backends: []Backend{{ID: "b", URL: "http://127.0.0.1:1"}}}
	if _, err := New(Settings{Pools: []Pool{p}}); err == nil || !strings.Contains(err.Error(), "pools[0].orca") {
		t.Errorf("New with orca %q: err = %v", p.ORCA, err)
	}
}

// eventLoad is the load fields of an event, for comparison.
type eventLoad struct {
	Running, Waiting       int64
	HasRunning, HasWaiting bool
	KVCacheUsage           float64
	HasKVCache             bool
}

func loadOfEvent(ev fleetwatch.Event) eventLoad {
	return eventLoad{Running: ev.Running, HasRunning: ev.HasRunning, Waiting: ev.Waiting, HasWaiting: ev.HasWaiting,
		KVCacheUsage: ev.KVCacheUsage, HasKVCache: ev.HasKVCache}
}

// TestRouteCopiesORCALoad: over real sockets, the router asks real fake
// backends for ORCA reports in the pool's format and copies them into the
// outcome events it publishes on a real NATS server; a stream (vLLM adds no
// header to streams) and a pool with orca off carry no load.
func TestRouteCopiesORCALoad(t *testing.T) {
	for _, format := range []string{"", ORCAText, ORCAJSON, ORCAOff} {
		t.Run("orca="+format, func(t *testing.T) {
			natsURL, _ := feedtest.NewServer(t)
			log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
			backends := testkit.StartFakeBackends(t, 1)
			pool := llamaPool(backends)
			pool.ORCA = format
			rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}})
			c := testkit.NewChatClient(rt.url)
			for _, stream := range []bool{false, true} {
				if r, err := c.Chat("be brief", "hello", stream); err != nil || r.Status != 200 {
					t.Fatalf("stream=%v: %v %+v", stream, err, r)
				}
			}
			eventually(t, 30*time.Second, "2 outcome events", func() bool { return len(log.Events()) >= 2 })
			evs := log.Events()
			// The fake reports vLLM's two metrics: nobody waiting, and the
			// answering request itself in a KV cache of 32.
			want := []eventLoad{{Waiting: 0, HasWaiting: true, KVCacheUsage: 1.0 / 32, HasKVCache: true}, {}}
			if format == ORCAOff {
				want[0] = eventLoad{}
			}
			got := []eventLoad{loadOfEvent(evs[0]), loadOfEvent(evs[1])}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("load of the events (non-stream, stream) (-want +got):\n%s", diff)
			}
			reports := `fleetwatch_route_load_reports_total{pool="llama",result="ok"} 1`
			if has := strings.Contains(rt.metricsText(), reports); has == (format == ORCAOff) {
				t.Errorf("metrics: %q present = %v with orca %q", reports, has, format)
			}
		})
	}
}

// TestRouteSurvivesBadORCAHeader: a backend whose ORCA header cannot be
// read still answers the client; the event has no load and the header is
// counted as invalid.
func TestRouteSurvivesBadORCAHeader(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	fake := fakeai.New(fakeai.Settings{Name: "bad"})
	var mu sync.Mutex // guards asked
	var asked []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Header.Get("Endpoint-Load-Metrics-Format"))
		mu.Unlock()
		r.Header.Del("Endpoint-Load-Metrics-Format") // so that the fake adds none of its own
		w.Header().Set("Endpoint-Load-Metrics", `JSON {"named_metrics": {"kv_cache_usage_perc": 0.`+strings.Repeat("9", 10))
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(backend.Close)
	pool := Pool{ID: "llama", Backends: []Backend{{ID: "bad", URL: backend.URL}}}
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}})
	r, err := testkit.NewChatClient(rt.url).Chat("", "hello", false)
	if err != nil || r.Status != 200 || r.Text == "" {
		t.Fatalf("request through a backend with a bad ORCA header: %v %+v", err, r)
	}
	eventually(t, 30*time.Second, "the outcome event", func() bool { return len(log.Events()) >= 1 })
	if ev := log.Events()[0]; ev.HasLoad() || ev.Outcome != fleetwatch.OutcomeOK {
		t.Errorf("event %+v: want ok without load", ev)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"TEXT"}, asked); diff != "" {
		t.Errorf("endpoint-load-metrics-format sent (-want +got):\n%s", diff)
	}
	if want := `fleetwatch_route_load_reports_total{pool="llama",result="invalid"} 1`; !strings.Contains(rt.metricsText(), want) {
		t.Errorf("metrics lack %q", want)
	}
}

func TestKVFraction(t *testing.T) {
	for in, want := range map[float64]float64{0: 0, 0.5: 0.5, 1: 1, 50: 0.5, 100: 1, 100.5: -1, -0.1: -1, math.NaN(): -1, math.Inf(1): -1} {
		got, ok := kvFraction(in)
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("kvFraction(%v) = %v, %v; want %v", in, got, ok, want)
		}
	}
}
