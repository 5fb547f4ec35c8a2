package config

import (
	"errors"
	"github.com/fleetwatch/fleetwatch/probes"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

func TestConfigDesignExample(t *testing.T) {
	// The example of DESIGN.md "Configuration" must load as it is.
	cfg, err := Load("testdata/design.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Analyzer.Window.Duration, 30*time.Second; got != want {
		t.Errorf("analyzer.window = %v, want %v", got, want)
	}
	if got, want := *cfg.Analyzer.MinRequests, 20; got != want {
		t.Errorf("analyzer.min_requests = %v, want %v", got, want)
	}
	if len(cfg.Pools) != 1 || len(cfg.Pools[0].Backends) != 1 {
		t.Fatalf("pools = %+v", cfg.Pools)
	}
	b := cfg.Pools[0].Backends[0]
	if diff := cmp.Diff(BackendConfig{ID: "vllm-a", URL: "http://127.0.0.1:9001", APIKeyEnv: "VLLM_A_KEY", CostPerMTok: ptr(0.6)}, b); diff != "" {
		t.Errorf("backend (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct"}, cfg.Pools[0].Models); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

func TestConfigDefaults(t *testing.T) {
	cfg, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if cfg.HTTP.Listen != "127.0.0.1:8080" || cfg.Prefix != "fw" || cfg.Probes.Schedule != "@every 5m" || cfg.Review.Schedule != "0 9 * * 1-5" {
		t.Errorf("defaults differ from DESIGN.md: %+v", cfg)
	}
}

func TestConfigErrorsNameKeyAndLine(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		wantKey  string
		wantLine int
	}{
		{"unknown top-level key", "prefix: fw\nbogus: 1\n", "bogus", 2},
		{"unknown nested key", "analyzer:\n  window: 30s\n  windwo: 10s\n", "analyzer.windwo", 3},
		{"unknown backend key", "pools:\n  - id: p\n    backends:\n      - id: a\n        urll: http://x\n", "pools[0].backends[0].urll", 5},
		{"negative duration", "analyzer:\n  window: -5s\n", "analyzer.window", 2},
		{"not a duration", "analyzer:\n  bucket: soon\n", "analyzer.bucket", 2},
		{"wrong type", "analyzer:\n  min_requests: lots\n", "analyzer.min_requests", 2},
		{"rate above one", "analyzer:\n  failure_rate: 1.5\n", "analyzer.failure_rate", 2},
		{"zero min requests", "analyzer:\n  min_requests: 0\n", "analyzer.min_requests", 2},
		{"bucket above window", "analyzer:\n  window: 1s\n  bucket: 2s\n", "analyzer.bucket", 3},
		{"explicit zero", "analyzer:\n  failure_rate: 0\n", "analyzer.failure_rate", 2},
		{"client_error_rate above one", "analyzer:\n  client_error_rate: 1.5\n", "analyzer.client_error_rate", 2},
		{"zero client_error_rate", "analyzer:\n  client_error_rate: 0\n", "analyzer.client_error_rate", 2},
		{"client_error_margin above one", "analyzer:\n  client_error_margin: 2\n", "analyzer.client_error_margin", 2},
		{"pool client_error_margin", "pools:\n  - id: a\n    analyzer:\n      client_error_margin: -0.5\n", "pools[0].analyzer.client_error_margin", 4},
		{"bad pool id", "pools:\n  - id: a..b\n", "pools[0].id", 2},
		{"duplicate pool", "pools:\n  - id: a\n  - id: a\n", "pools[1].id", 3},
		{"bad mode", "pools:\n  - id: a\n    mode: roundrobin\n", "pools[0].mode", 3},
		{"bad all_open", "pools:\n  - id: a\n    all_open: panic\n", "pools[0].all_open", 3},
		{"pool override", "pools:\n  - id: a\n    analyzer:\n      slow_factor: 0.5\n", "pools[0].analyzer.slow_factor", 4},
		{"bad backend url", "pools:\n  - id: a\n    backends:\n      - id: b\n        url: ftp://x\n", "pools[0].backends[0].url", 5},
		{"duplicate backend", "pools:\n  - id: a\n    backends:\n      - id: b\n      - id: b\n", "pools[0].backends[1].id", 5},
		{"model in two pools", "pools:\n  - id: a\n    models: [m]\n  - id: b\n    models: [m]\n", "pools[1].models[0]", 5},
		{"bad probe endpoint", "pools:\n  - id: a\n    backends:\n      - id: b\n        url: http://x\n        probe_endpoint: responses\n", "pools[0].backends[0].probe_endpoint", 6},
		{"affinity below one", "pools:\n  - id: a\n    affinity_tolerance: 0.5\n", "pools[0].affinity_tolerance", 3},
		{"negative cost exchange rate", "pools:\n  - id: a\n    ms_per_cost_unit: -1\n", "pools[0].ms_per_cost_unit", 3},
		{"unknown score", "pools:\n  - id: a\n    score: fastest\n", "pools[0].score", 3},
		{"negative choices", "pools:\n  - id: a\n    choices: -2\n", "pools[0].choices", 3},
		{"zero load_stale", "pools:\n  - id: a\n    load_stale: 0s\n", "pools[0].load_stale", 3},
		{"load_stale under 50ms", "pools:\n  - id: a\n    load_stale: 20ms\n", "pools[0].load_stale", 3},
		{"load_running_weight over 1", "pools:\n  - id: a\n    load_running_weight: 2\n", "pools[0].load_running_weight", 3},
		{"negative priority", "pools:\n  - id: a\n    backends:\n      - id: b\n        priority: -1\n", "pools[0].backends[0].priority", 5},
		{"zero stall floor", "route:\n  stall_floor: 0s\n", "route.stall_floor", 2},
		{"negative stall multiple", "route:\n  stall_multiple: -4\n", "route.stall_multiple", 2},
		{"zero max attempts", "route:\n  stall_floor: 3s\n  max_attempts: 0\n", "route.max_attempts", 3},
		{"negative idle gap", "route:\n  idle_gap: -1m\n", "route.idle_gap", 2},
		{"zero max body", "route:\n  max_body_bytes: 0\n", "route.max_body_bytes", 2},
		{"negative header timeout", "route:\n  header_timeout: -1s\n", "route.header_timeout", 2},
		{"infinite retry ratio", "route:\n  retry_ratio: .inf\n", "route.retry_ratio", 2},
		{"bad prefix_from", "route:\n  prefix_from: user\n", "route.prefix_from", 2},
		{"bad feed", "route:\n  feed: xml\n", "route.feed", 2},
		{"negative scan_routers", "pools:\n  - id: a\n    scan_routers: -1\n", "pools[0].scan_routers", 3},
		{"removed load_baseline_at_report", "pools:\n  - id: a\n    load_baseline_at_report: false\n", "pools[0].load_baseline_at_report", 3},
		{"removed many_routers_heartbeat", "analyzer:\n  heartbeat: 1s\n  many_routers_heartbeat: 250ms\n", "analyzer.many_routers_heartbeat", 3},
		{"max attempts not a number", "route:\n  max_attempts: many\n", "route.max_attempts", 2},
		{"bad cron", "probes:\n  schedule: every now and then\n", "probes.schedule", 2},
		{"negative probe budget", "probes:\n  budget_tokens_per_day: -1\n", "probes.budget_tokens_per_day", 2},
		{"negative pool probe budget", "pools:\n  - id: a\n    probe_budget_tokens_per_day: -5\n", "pools[0].probe_budget_tokens_per_day", 3},
		{"negative backend probe budget", "pools:\n  - id: a\n    backends:\n      - id: b\n        probe_budget_tokens_per_day: -5\n", "pools[0].backends[0].probe_budget_tokens_per_day", 5},
		{"probe budget not a number", "probes:\n  budget_tokens_per_day: lots\n", "probes.budget_tokens_per_day", 2},
		{"bad review cron", "review:\n  schedule: \"61 * * * *\"\n", "review.schedule", 2},
		{"bad prefix", "prefix: \"fw..x\"\n", "prefix", 1},
		{"bad http listen", "http:\n  listen: localhost\n", "http.listen", 2},
		{"zero max_pools", "limits:\n  max_pools: 0\n", "limits.max_pools", 2},
		{"negative max_backends", "limits:\n  max_backends: -1\n", "limits.max_backends", 2},
		{"more pools than max_pools", "limits:\n  max_pools: 1\npools:\n  - id: a\n  - id: b\n", "limits.max_pools", 2},
		{"more backends than max_backends_per_pool", "limits:\n  max_backends_per_pool: 1\npools:\n  - id: a\n    backends:\n      - id: b\n      - id: c\n", "limits.max_backends_per_pool", 2},
		{"more backends than max_backends", "limits: {max_backends: 1}\npools:\n  - id: a\n    backends:\n      - id: b\n  - id: c\n    backends:\n      - id: d\n", "limits.max_backends", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "fw.yaml")
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a *Error", err)
			}
			if ce.Key != tt.wantKey || ce.Line != tt.wantLine {
				t.Errorf("key %q line %d, want key %q line %d (error: %v)", ce.Key, ce.Line, tt.wantKey, tt.wantLine, err)
			}
			if ce.File != "fw.yaml" {
				t.Errorf("file = %q", ce.File)
			}
		})
	}
}

func TestConfigFileMissing(t *testing.T) {
	_, err := Load(t.TempDir() + "/nope.yaml")
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want os.ErrNotExist", err)
	}
}

// TestConfigDocExample keeps docs/CONFIG.md true: its full example must
// load, and every key of the configuration types must appear in it.
func TestConfigDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/CONFIG.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "```yaml\n")
	end := strings.Index(text[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("docs/CONFIG.md has no yaml example")
	}
	example := text[start+8 : start+8+end]
	cfg, err := Parse([]byte(example), "docs/CONFIG.md")
	if err != nil {
		t.Fatalf("the example of docs/CONFIG.md does not load: %v", err)
	}
	if cfg.Analyzer.OpenJitter == nil || cfg.Probes.EnrolMin == nil {
		t.Errorf("example lost keys: %+v", cfg.Analyzer)
	}
	lines := keyLines(mustNode(t, example))
	for _, key := range yamlKeys(reflect.TypeOf(Config{}), "") {
		if _, ok := lines[key]; !ok && !removed(key) {
			t.Errorf("docs/CONFIG.md's example does not show key %s", key)
		}
	}
}

func mustNode(t *testing.T, s string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

// yamlKeys lists the dotted key paths of a config type, with slices shown
// by their first element.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		keys = append(keys, key)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeOf(AnalyzerConfig{}) && prefix != "":
			// A pool's analyzer block has the keys of the global one.
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(Duration{}):
			keys = append(keys, yamlKeys(ft, key)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, yamlKeys(ft.Elem(), key+"[0]")...)
		}
	}
	return keys
}

func TestProbeTargetsFromConfig(t *testing.T) {
	cfg := Default()
	cfg.Pools = []PoolConfig{{ID: "p", Models: []string{"m"}, Backends: []BackendConfig{
		{ID: "a", URL: "http://a", APIKeyEnv: "KEY_A", ProbeEndpoint: "completions"},
		{ID: "no-url"},
	}}}
	got := cfg.ProbeTargets(func(k string) string { return map[string]string{"KEY_A": "secret"}[k] })
	want := []probes.Target{{Pool: "p", Backend: "a", URL: "http://a", APIKey: "secret", PreferModels: []string{"m"}, Endpoint: "completions"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
}

// TestProbeBudgetResolution: a backend's probe budget is its own key,
// else its pool's, else probes.budget_tokens_per_day (an explicit 0 is
// unlimited, overriding the pool's); cost_per_mtok goes along.
func TestProbeBudgetResolution(t *testing.T) {
	cfg, err := Parse([]byte(`probes:
  budget_tokens_per_day: 1000
pools:
  - id: p
    probe_budget_tokens_per_day: 2000
    backends:
      - {id: own, url: "http://a", probe_budget_tokens_per_day: 3000, cost_per_mtok: 0.5}
      - {id: pooled, url: "http://b"}
      - {id: unlimited, url: "http://c", probe_budget_tokens_per_day: 0}
  - id: q
    backends:
      - {id: global, url: "http://d"}
`), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var cost *float64
	for _, tg := range cfg.ProbeTargets(func(string) string { return "" }) {
		got[tg.Backend] = tg.BudgetTokensPerDay
		if tg.Backend == "own" {
			cost = tg.CostPerMTok
		} else if tg.CostPerMTok != nil {
			t.Errorf("%s: cost %v, want none", tg.Backend, *tg.CostPerMTok)
		}
	}
	if diff := cmp.Diff(map[string]int64{"own": 3000, "pooled": 2000, "unlimited": 0, "global": 1000}, got); diff != "" {
		t.Errorf("budgets (-want +got):\n%s", diff)
	}
	if cost == nil || *cost != 0.5 {
		t.Errorf("cost of own = %v, want 0.5", cost)
	}
}

// TestHTTPSecurityKeys: a listener beyond loopback needs authentication or
// an explicit http.insecure, and the TLS keys go together; each error
// names its key.
func TestHTTPSecurityKeys(t *testing.T) {
	for _, tc := range []struct {
		name, http string
		wantKey    string // "" when valid
	}{
		{"loopback", "listen: 127.0.0.1:8080", ""},
		{"localhost", "listen: localhost:8080", ""},
		{"ipv6 loopback", `listen: "[::1]:8080"`, ""},
		{"all interfaces", "listen: 0.0.0.0:8080", "http.listen"},
		{"empty host", `listen: ":8080"`, "http.listen"},
		{"lan address", "listen: 192.168.1.5:8080", "http.listen"},
		{"hostname", "listen: fleetwatch.example:8080", "http.listen"},
		{"insecure", "listen: 0.0.0.0:8080\n  insecure: true", ""},
		{"bearer", "listen: 0.0.0.0:8080\n  bearer_token_env: FLEETWATCH_HTTP_TOKEN", ""},
		{"basic", "listen: 0.0.0.0:8080\n  basic_users_file: /etc/fleetwatch/users", ""},
		{"token in place of a name", "bearer_token_env: \"s3cret token!\"", "http.bearer_token_env"},
		{"cert without key", "tls_cert: cert.pem", "http.tls_key"},
		{"key without cert", "tls_key: key.pem", "http.tls_cert"},
		{"tls", "tls_cert: cert.pem\n  tls_key: key.pem", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("http:\n  "+tc.http+"\n"), "fw.yaml")
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.wantKey || ce.Line == 0 {
				t.Fatalf("err = %#v, want a config error at key %s with its line", err, tc.wantKey)
			}
			if tc.wantKey == "http.listen" && !strings.Contains(ce.Msg, "http.insecure") {
				t.Errorf("message %q does not say how to allow it", ce.Msg)
			}
		})
	}
}
