package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/dashboards"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

const victoriaMetricsBin = "/usr/bin/victoria-metrics"

// victoriaMetrics is a victoria-metrics process scraping one target.
type victoriaMetrics struct {
	url string // http://127.0.0.1:port
}

// startVictoriaMetrics starts Debian's victoria-metrics on a loopback port,
// scraping each job's target (host:port, path /metrics) every second. It
// stops in t.Cleanup.
func startVictoriaMetrics(t *testing.T, jobs map[string]string) *victoriaMetrics {
	t.Helper()
	bin := testkit.RequireTool(t, victoriaMetricsBin, "victoria-metrics")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "scrape.yaml")
	var config strings.Builder
	config.WriteString("scrape_configs:\n")
	for job, target := range jobs {
		fmt.Fprintf(&config, "  - job_name: %q\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      - targets: [%q]\n", job, target)
	}
	if err := os.WriteFile(cfg, []byte(config.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin,
		"-httpListenAddr="+addr,
		"-storageDataPath="+filepath.Join(dir, "data"),
		"-promscrape.config="+cfg,
		"-search.latencyOffset=0s", // show samples as soon as they are scraped
		"-search.disableCache",
		"-loggerLevel=ERROR",
	)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // reaps the process; exits when it does
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("victoria-metrics output:\n%s", logs.String())
		}
	})
	vm := &victoriaMetrics{url: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(vm.url + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return vm
			}
		}
		select {
		case <-exited:
			t.Fatalf("victoria-metrics exited: %s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("victoria-metrics not healthy at %s: %v", vm.url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promResult is the data of a Prometheus API answer.
type promResult struct {
	ResultType string `json:"resultType"`
	Result     []struct {
		Metric map[string]string `json:"metric"`
		Value  []any             `json:"value"`
	} `json:"result"`
}

// query runs an instant query and returns its series.
func (vm *victoriaMetrics) query(expr string) (promResult, error) {
	var out struct {
		Status string     `json:"status"`
		Error  string     `json:"error"`
		Data   promResult `json:"data"`
	}
	res, err := http.Get(vm.url + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		return out.Data, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return out.Data, err
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return out.Data, fmt.Errorf("%s: %s", err, body)
	}
	if out.Status != "success" {
		return out.Data, fmt.Errorf("query %s: %s %s", expr, out.Status, out.Error)
	}
	return out.Data, nil
}

// labelValues is Grafana's label_values(metric, label) variable query.
func (vm *victoriaMetrics) labelValues(metric, label string) ([]string, error) {
	res, err := http.Get(vm.url + "/api/v1/label/" + label + "/values?" + url.Values{"match[]": {metric}}.Encode())
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// waitScrapes waits until VictoriaMetrics holds n scrapes of the target.
func (vm *victoriaMetrics) waitScrapes(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	expr := fmt.Sprintf(`count_over_time(up{job="fleetwatch"}[5m]) >= %d and up{job="fleetwatch"} == 1`, n)
	for {
		r, err := vm.query(expr)
		if err == nil && len(r.Result) > 0 {
			return
		}
		if time.Now().After(deadline) {
			up, _ := vm.query(`up`)
			t.Fatalf("fewer than %d successful scrapes after 60s (err %v, up %+v)", n, err, up.Result)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// grafanaExpr replaces Grafana's variables with what the test queries:
// $pool, $backend (a regex: .* for All), and the interval macros.
func grafanaExpr(expr string, vars map[string]string) string {
	pairs := []string{"$__rate_interval", "30s", "$__interval", "1m", "$__range", "5m"}
	for k, v := range vars {
		pairs = append(pairs, "${"+k+"}", v, "$"+k, v)
	}
	return strings.NewReplacer(pairs...).Replace(expr)
}

// dashboardQueryProblems runs every query of every dashboard against vm
// and returns one line for each that errors or returns no series.
func dashboardQueryProblems(t *testing.T, vm *victoriaMetrics, pool string) []string {
	t.Helper()
	list, err := dashboards.Grafana()
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	vars := map[string]string{"pool": pool, "backend": ".*"}
	for _, d := range list {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			name := fmt.Sprintf("%s/%s %q %s", d.UID, q.Kind, q.Title, q.RefID)
			if q.Datasource != "${datasource}" {
				problems = append(problems, fmt.Sprintf("%s: data source %q, want ${datasource}", name, q.Datasource))
			}
			if q.Kind == "variable" {
				metric, label, ok := parseLabelValues(grafanaExpr(q.Expr, vars))
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: not a label_values(metric, label) query: %s", name, q.Expr))
					continue
				}
				values, err := vm.labelValues(metric, label)
				if err != nil || len(values) == 0 {
					problems = append(problems, fmt.Sprintf("%s: label_values(%s, %s) = %v, %v", name, metric, label, values, err))
				}
				continue
			}
			expr := grafanaExpr(q.Expr, vars)
			r, err := vm.query(expr)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			case len(r.Result) == 0:
				problems = append(problems, fmt.Sprintf("%s: no data for %s", name, expr))
			}
		}
	}
	return problems
}

// checkDashboardQueries waits until every dashboard query returns data, and
// fails with the ones that still do not after limit (series such as the
// decision latency appear only once their event has happened).
func checkDashboardQueries(t *testing.T, vm *victoriaMetrics, pool string, limit time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(limit)
	var first []string
	for round := 0; ; round++ {
		problems := dashboardQueryProblems(t, vm, pool)
		if round == 0 {
			first = problems
		}
		if len(problems) == 0 {
			if len(first) > 0 {
				t.Logf("after %v every query has data; at first %d had none:\n%s", time.Since(start).Round(time.Second), len(first), strings.Join(first, "\n"))
			}
			return
		}
		if time.Now().After(deadline) {
			for _, p := range problems {
				t.Error(p)
			}
			return
		}
		time.Sleep(time.Second)
	}
}

// parseLabelValues splits "label_values(metric{...}, label)".
func parseLabelValues(expr string) (metric, label string, ok bool) {
	inner, found := strings.CutPrefix(strings.TrimSpace(expr), "label_values(")
	if !found || !strings.HasSuffix(inner, ")") {
		return "", "", false
	}
	inner = strings.TrimSuffix(inner, ")")
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		return "", "", false
	}
	return strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:]), true
}

// serveTestConfig makes breakers trip and recover within seconds, so that a
// short test sees transitions, and probes every second: vllm-a and vllm-b
// are fake OpenAI-compatible backends, vllm-c's URL refuses connections, so
// its probes fail.
func serveTestConfig(t *testing.T) string {
	t.Helper()
	fake := func(name string) string {
		srv := httptest.NewServer(fakeai.New(fakeai.Settings{Name: name}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	return fmt.Sprintf(`analyzer:
  heartbeat: 250ms
  open_base: 1s
  open_max: 2s
pools:
  - id: llama-3.1-70b
    models: [llama-3.1-70b]
    backends:
      - id: vllm-a
        url: %s
      - id: vllm-b
        url: %s
      - id: vllm-c
        url: http://%s
probes:
  schedule: "@every 1s"
  timeout: 1s
`, fake("vllm-a"), fake("vllm-b"), freeLoopbackAddr(t))
}

// TestDashboardsAgainstServe runs every dashboard query against a real
// VictoriaMetrics scraping a real `fleetwatch serve` that receives traffic
// with a backend failing on and off, and checks docs/METRICS.md against the
// /metrics it exposes.
func TestDashboardsAgainstServe(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	testkit.RequireTool(t, victoriaMetricsBin, "victoria-metrics")
	config := serveTestConfig(t)
	p := startServeProcess(t, config)
	traffic := &testkit.OutcomeTraffic{Pool: "llama-3.1-70b", Backends: []string{"vllm-a", "vllm-b", "vllm-c"}}
	traffic.Start(t, p.natsURL)
	ctx, cancel := context.WithCancel(context.Background())
	flipped := make(chan struct{})
	go func() { // toggles vllm-b's failures; exits on cancel
		defer close(flipped)
		tick := time.NewTicker(1500 * time.Millisecond)
		defer tick.Stop()
		for fail := true; ; fail = !fail {
			traffic.SetFailing("vllm-b", fail)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-flipped
	})

	// A router in front of the fake backends, with its own traffic.
	cfgPath := filepath.Join(t.TempDir(), "route.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	route := startRouteProcess(t, nil, "--nats", p.natsURL, "--config", cfgPath, "--source", "dashboards-test")
	requests := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-requests
	})
	go func() { // requests through the router; exits on cancel
		defer close(requests)
		for i := 0; ctx.Err() == nil; i++ {
			body := fmt.Sprintf(`{"model":"llama-3.1-70b","messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}`, i)
			if res, err := http.Post(route+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	vm := startVictoriaMetrics(t, map[string]string{
		"fleetwatch":       strings.TrimPrefix(p.httpURL, "http://"),
		"fleetwatch-route": strings.TrimPrefix(route, "http://"),
	})
	vm.waitScrapes(t, 4)
	// A control: a series that does not exist gives no data, so an empty
	// answer is detected rather than taken for success.
	if r, err := vm.query("fleetwatch_no_such_series"); err != nil || len(r.Result) != 0 {
		t.Fatalf("control query: %+v, %v", r, err)
	}
	// Wait for the first breaker transition to be scraped.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := vm.query(`fleetwatch_breaker_transitions_total{pool="llama-3.1-70b"}`)
		if err == nil && len(r.Result) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no breaker transition scraped after 30s (err %v)", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	vm.waitScrapes(t, 8)
	t.Run("queries", func(t *testing.T) { checkDashboardQueries(t, vm, "llama-3.1-70b", 30*time.Second) })
	t.Run("METRICS.md", func(t *testing.T) { checkMetricsCatalogue(t, "## fleetwatch serve", p.httpURL+"/metrics") })
}

// metricsCatalogue returns the metric names listed in the tables of a
// section ("## fleetwatch serve") of docs/METRICS.md, each with whether it is
// always exposed (false for a type marked "conditional").
func metricsCatalogue(t *testing.T, section string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "METRICS.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(fleetwatch_[a-z0-9_]+)` \\| ([^|]*) \\|")
	names := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line) == section
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			if _, dup := names[m[1]]; dup {
				t.Errorf("METRICS.md lists %s twice", m[1])
			}
			names[m[1]] = !strings.Contains(m[2], "conditional")
		}
	}
	if len(names) == 0 {
		t.Fatalf("METRICS.md: no metric rows under %q", section)
	}
	return names
}

// exposedMetrics returns the fleetwatch_* metric names of a /metrics page,
// with a histogram's _bucket, _sum and _count series folded into its name.
func exposedMetrics(t *testing.T, url string) map[string]bool {
	t.Helper()
	_, body := testkit.HTTPGet(t, url)
	raw := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "fleetwatch_") {
			continue
		}
		name := line[:strings.IndexAny(line+" ", "{ ")]
		raw[name] = true
	}
	names := map[string]bool{}
	for name := range raw {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && raw[b+"_bucket"] {
				base = b
			}
		}
		names[base] = true
	}
	return names
}

func checkMetricsCatalogue(t *testing.T, section, url string) {
	listed := metricsCatalogue(t, section)
	exposed := exposedMetrics(t, url)
	for name, always := range listed {
		if always && !exposed[name] {
			t.Errorf("METRICS.md (%s) lists %s, which is not exposed", section, name)
		}
	}
	for name := range exposed {
		if _, ok := listed[name]; !ok {
			t.Errorf("%s is exposed, but METRICS.md (%s) does not list it", name, section)
		}
	}
}

// TestMetricsCatalogueRoute checks the "fleetwatch route" section of
// docs/METRICS.md against the /metrics of a real `fleetwatch route` that
// follows a real serve and has proxied requests to a healthy and a failing
// fake backend.
func TestMetricsCatalogueRoute(t *testing.T) {
	healthy := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "ok"}))
	t.Cleanup(healthy.Close)
	failing := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "bad", Behavior: fakeai.Behavior{ErrorRate: 1}}))
	t.Cleanup(failing.Close)
	config := fmt.Sprintf(`pools:
  - id: llama
    models: [llama]
    backends:
      - id: ok
        url: %s
      - id: bad
        url: %s
`, healthy.URL, failing.URL)
	p := startServeProcess(t, config, "--no-probes")
	cfgPath := filepath.Join(t.TempDir(), "route.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startRouteProcess(t, nil, "--nats", p.natsURL, "--config", cfgPath, "--source", "catalogue-test")
	for i := range 40 {
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}`, i)
		res, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	checkMetricsCatalogue(t, "## fleetwatch route", base+"/metrics")
}
