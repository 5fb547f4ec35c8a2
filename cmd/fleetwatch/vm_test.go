package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/dashboards"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

const victoriaMetricsBin = "/usr/bin/victoria-metrics"

// freeLoopbackAddr returns a loopback address with a port that was free a
// moment ago, for programs that cannot report the port they bound.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// victoriaMetrics is a victoria-metrics process scraping one target.
type victoriaMetrics struct {
	url string // http://127.0.0.1:port
}

// startVictoriaMetrics starts Debian's victoria-metrics on a loopback port,
// scraping each job's target (host:port, path /metrics) every second. It
// stops in t.Cleanup.
func startVictoriaMetrics(t *testing.T, jobs map[string]string) *victoriaMetrics {
	t.Helper()
	bin := requireTool(t, victoriaMetricsBin, "victoria-metrics")
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

// lockedBuffer is a bytes.Buffer safe for a process writing and a test reading.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// buildServeBinary builds the fleetwatch binary into a test directory.
func buildServeBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fleetwatch")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// serveProcess is a running `fleetwatch serve` subprocess with its embedded
// NATS server.
type serveProcess struct {
	bin              string // the fleetwatch binary, for further subcommands
	natsURL, httpURL string
	logs             *lockedBuffer
}

var (
	serveNATSLine = regexp.MustCompile(`embedded NATS server at (nats://\S+)`)
	serveHTTPLine = regexp.MustCompile(`HTTP on (http://\S+)`)
)

// startServeProcess runs `fleetwatch serve` with config (YAML), an embedded
// NATS server and an HTTP listener on random loopback ports, and stops it
// (SIGTERM, then kill) in t.Cleanup.
func startServeProcess(t *testing.T, config string, extraArgs ...string) *serveProcess {
	t.Helper()
	return startServeProcessEnv(t, config, nil, extraArgs...)
}

// startServeProcessEnv is startServeProcess with extra environment
// variables. With --nats among extraArgs it uses that server instead of an
// embedded one.
func startServeProcessEnv(t *testing.T, config string, env []string, extraArgs ...string) *serveProcess {
	t.Helper()
	bin := buildServeBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fleetwatch.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--config", cfgPath, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1",
		"--data", filepath.Join(dir, "data")}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // reaps the process
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("fleetwatch serve output:\n%s", logs.String())
		}
	})
	p := &serveProcess{bin: bin, logs: logs}
	for i, a := range extraArgs {
		if a == "--nats" && i+1 < len(extraArgs) {
			p.natsURL = extraArgs[i+1]
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.natsURL == "" || p.httpURL == "" {
		out := logs.String()
		if m := serveNATSLine.FindStringSubmatch(out); m != nil {
			p.natsURL = m[1]
		}
		if m := serveHTTPLine.FindStringSubmatch(out); m != nil {
			p.httpURL = m[1]
		}
		select {
		case <-exited:
			t.Fatalf("fleetwatch serve exited:\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleetwatch serve did not report its NATS and HTTP addresses:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// outcomeTraffic publishes outcome events to a serve process the way a
// proxy does: every tick, okPerTick ok events per healthy backend and as
// many errors per failing backend, plus one malformed message.
type outcomeTraffic struct {
	pool     string
	backends []string

	mu      sync.Mutex // guards failing
	failing map[string]bool
}

func (o *outcomeTraffic) setFailing(backend string, fail bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failing[backend] = fail
}

func (o *outcomeTraffic) isFailing(backend string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failing[backend]
}

// start publishes until t's cleanup; the goroutine exits on the cancel.
func (o *outcomeTraffic) start(t *testing.T, natsURL string) {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.Name("test-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-stopped
		nc.Close()
	})
	const okPerTick = 10
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		subject := fleetwatch.Subjects{}.Outcomes() + ".test-proxy"
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ts := fleetwatch.FormatTime(time.Now())
			var batch bytes.Buffer
			for i, b := range o.backends {
				for k := range okPerTick {
					if o.isFailing(b) {
						fmt.Fprintf(&batch, `{"v":1,"pool":%q,"backend":%q,"ts":%q,"status":500,"outcome":"error","duration_ms":5}`+"\n", o.pool, b, ts)
						continue
					}
					ttft := 120 + 40*i + (n+k)%30
					fmt.Fprintf(&batch, `{"v":1,"pool":%q,"backend":%q,"ts":%q,"status":200,"outcome":"ok","ttft_ms":%d,"duration_ms":%d}`+"\n", o.pool, b, ts, ttft, ttft*5)
				}
			}
			_ = nc.Publish(subject, batch.Bytes())
			_ = nc.Publish(subject, []byte(`{"v":1,"pool":`)) // a reject
		}
	}()
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
	requireTool(t, victoriaMetricsBin, "victoria-metrics")
	config := serveTestConfig(t)
	p := startServeProcess(t, config)
	traffic := &outcomeTraffic{pool: "llama-3.1-70b", backends: []string{"vllm-a", "vllm-b", "vllm-c"}, failing: map[string]bool{}}
	traffic.start(t, p.natsURL)
	ctx, cancel := context.WithCancel(context.Background())
	flipped := make(chan struct{})
	go func() { // toggles vllm-b's failures; exits on cancel
		defer close(flipped)
		tick := time.NewTicker(1500 * time.Millisecond)
		defer tick.Stop()
		for fail := true; ; fail = !fail {
			traffic.setFailing("vllm-b", fail)
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
	route := startRouteProcess(t, p.bin, nil, "--nats", p.natsURL, "--config", cfgPath, "--source", "dashboards-test")
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
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	raw := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
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

var routeListenLine = regexp.MustCompile(`route: listening on (http://\S+)`)

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
	bin := p.bin
	cfgPath := filepath.Join(t.TempDir(), "route.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startRouteProcess(t, bin, nil, "--nats", p.natsURL, "--config", cfgPath, "--source", "catalogue-test")
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

// startRouteProcess runs `fleetwatch route` on a random loopback port and
// returns its base URL; it stops in t.Cleanup.
func startRouteProcess(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"route", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // reaps the process
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		out := logs.String()
		if t.Failed() {
			t.Logf("fleetwatch route output:\n%s", out)
		}
		if strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("fleetwatch route reports a permission problem:\n%s", out)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := routeListenLine.FindStringSubmatch(logs.String()); m != nil {
			return m[1]
		}
		select {
		case <-exited:
			t.Fatalf("fleetwatch route exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleetwatch route did not report its address:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricValue returns the value of one series (name with labels, exactly as
// exposed) of a /metrics page, and false when it is absent.
func metricValue(t *testing.T, url, series string) (float64, bool) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f, true
			}
		}
	}
	return 0, false
}
