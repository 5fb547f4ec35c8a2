package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// reloadBody is the JSON answer of POST /-/reload.
type reloadBody struct {
	Status   string          `json:"status"`
	Summary  string          `json:"summary"`
	Error    string          `json:"error"`
	Key      string          `json:"key"`
	Line     int             `json:"line"`
	Restart  []config.Change `json:"restart"`
	Analyzer struct {
		PoolsAdded      []string `json:"pools_added"`
		BackendsRemoved []string `json:"backends_removed"`
	} `json:"analyzer"`
	Probes string `json:"probes"`
}

func postReload(t *testing.T, base string) (int, reloadBody) {
	t.Helper()
	resp, err := http.Post(base+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var body reloadBody
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("POST /-/reload: %d %s: %v", resp.StatusCode, data, err)
	}
	return resp.StatusCode, body
}

// reloadMetric reads one series of /metrics (-1 when absent).
func reloadMetric(t *testing.T, base, series string) float64 {
	t.Helper()
	_, text := testkit.HTTPGet(t, base+"/metrics")
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// TestReloadEndToEnd: a real serve on a real NATS server reloads its file
// while a breaker is open: a pool is added and a threshold changed, by the
// SIGHUP path (Reload) and by POST /-/reload; the open breaker stays open
// with the same open_until, the new pool is published, the drift probes
// follow the new targets and schedule. A file with a key of the wrong type,
// or one that changes a key only a restart applies, is refused with its key
// and line, and the running configuration keeps running.
func TestReloadEndToEnd(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	url, _ := feedtest.NewServer(t)
	fakes := testkit.StartFakeBackends(t, 3)
	dir := t.TempDir()
	file := filepath.Join(dir, "fleetwatch.yaml")
	head := fmt.Sprintf("nats: {url: %q}\nprobes: {schedule: \"@every 1h\", enrol_min: 0s}\n", url)
	p1 := `  - id: p1
    analyzer: {open_base: 10m, open_max: 20m}
    backends:
      - {id: bad, url: "` + fakes[0].URL() + `"}
      - {id: good}
      - {id: g2}
      - {id: g3}
`
	write := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(head + "pools:\n" + p1)
	data := filepath.Join(dir, "data")
	adjust := func(c *config.Config) error { // what newServer sets over the file
		c.HTTP.Listen, c.Data = "127.0.0.1:0", data
		return nil
	}
	yaml, _ := os.ReadFile(file)
	var logs testkit.Lines
	srv := newServer(t, string(yaml), data, Options{ConfigFile: file, AdjustConfig: adjust, Logf: logs.Logf}).run(t)

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "p1", "good")
	if got := reloadMetric(t, srv.httpURL, "fleetwatch_config_last_reload_successful"); got != 1 {
		t.Errorf("fleetwatch_config_last_reload_successful = %v at start, want 1", got)
	}

	// Trip p1/bad: five failures in a row.
	for range 5 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("p1", "bad", 500, 3))
	}
	testkit.Eventually(t, 10*time.Second, "p1/bad to open", func() bool {
		b, ok := snaps.Backend("p1", "bad")
		return ok && b.State == fleetwatch.StateOpen
	})
	open, _ := snaps.Backend("p1", "bad")
	before, _ := snaps.Snapshot("p1")
	targets := func() []string {
		srv.mu.Lock()
		d := srv.drift
		srv.mu.Unlock()
		if d == nil {
			return nil
		}
		var out []string
		for _, st := range d.prober.Statuses() {
			out = append(out, st.Pool+"/"+st.Backend)
		}
		return out
	}
	if diff := slices.Compare([]string{"p1/bad"}, targets()); diff != 0 {
		t.Fatalf("probe targets at start = %v, want [p1/bad]", targets())
	}

	// The SIGHUP path: pool p2 is added, p1's consecutive_failures goes
	// from 5 to 3, the probe schedule changes.
	p1v2 := strings.Replace(p1, "open_max: 20m}", "open_max: 20m, consecutive_failures: 3}", 1)
	p2 := `  - id: p2
    mode: failover
    backends:
      - {id: n1, url: "` + fakes[1].URL() + `"}
      - {id: n2, priority: 1}
`
	write(strings.Replace(head, "@every 1h", "@every 2h", 1) + "pools:\n" + p1v2 + p2)
	res, err := srv.Reload()
	if err != nil {
		t.Fatalf("Reload: %v\n%s", err, logs.String())
	}
	if !slices.Equal(res.Analyzer.PoolsAdded, []string{"p2"}) || !slices.Equal(res.Analyzer.PoolsChanged, []string{"p1"}) || res.Probes != "restarted" {
		t.Errorf("Reload = %+v, want p2 added, p1 changed, probes restarted", res)
	}
	testkit.Eventually(t, 10*time.Second, "the new pool p2 to be published", func() bool {
		s, ok := snaps.Snapshot("p2")
		return ok && len(s.Backends) == 2 && s.Mode == fleetwatch.ModeFailover
	})
	testkit.Eventually(t, 10*time.Second, "a snapshot of p1 after the reload", func() bool {
		s, _ := snaps.Snapshot("p1")
		return s.Seq > before.Seq+1
	})
	after, _ := snaps.Snapshot("p1")
	if b := after.Find("bad"); b == nil || b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(open.OpenUntil.Time) || b.Trips != open.Trips {
		t.Errorf("p1/bad after the reload = %+v, want still open until %v", b, open.OpenUntil)
	}
	if after.Epoch != before.Epoch {
		t.Errorf("the epoch changed across a reload: %s -> %s", before.Epoch, after.Epoch)
	}
	if got := targets(); !slices.Equal(got, []string{"p1/bad", "p2/n1"}) {
		t.Errorf("probe targets after the reload = %v, want [p1/bad p2/n1]", got)
	}
	// The new threshold: three failures in a row open p1/g3 (the cap
	// allows two of four open).
	for range 3 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("p1", "g3", 500, 3))
	}
	testkit.Eventually(t, 10*time.Second, "p1/g3 to open after three failures", func() bool {
		b, ok := snaps.Backend("p1", "g3")
		return ok && b.State == fleetwatch.StateOpen
	})

	// POST /-/reload: p3 added, p1/g2 removed (it had no event: gone at
	// the next evaluation).
	p1v3 := strings.Replace(p1v2, "      - {id: g2}\n", "", 1)
	write(strings.Replace(head, "@every 1h", "@every 2h", 1) + "pools:\n" + p1v3 + p2 + "  - id: p3\n    backends: [{id: z}]\n")
	code, body := postReload(t, srv.httpURL)
	if code != http.StatusOK || body.Status != "success" || !slices.Equal(body.Analyzer.PoolsAdded, []string{"p3"}) ||
		!slices.Equal(body.Analyzer.BackendsRemoved, []string{"p1/g2"}) || body.Probes != "unchanged" {
		t.Fatalf("POST /-/reload = %d %+v", code, body)
	}
	testkit.Eventually(t, 10*time.Second, "p3 published and p1/g2 gone", func() bool {
		_, p3 := snaps.Snapshot("p3")
		_, g2 := snaps.Backend("p1", "g2")
		return p3 && !g2
	})
	if b, _ := snaps.Backend("p1", "bad"); b.State != fleetwatch.StateOpen || !b.OpenUntil.Equal(open.OpenUntil.Time) {
		t.Errorf("p1/bad after the second reload = %+v, want still open until %v", b, open.OpenUntil)
	}
	if got := reloadMetric(t, srv.httpURL, `fleetwatch_config_reloads_total{result="success"}`); got != 2 {
		t.Errorf(`reloads_total{result="success"} = %v, want 2`, got)
	}

	// A key of the wrong type: refused with its key and line, by both
	// paths; the running configuration keeps running.
	good, _ := os.ReadFile(file)
	write(string(good) + "analyzer:\n  min_requests: many\n")
	wantLine := strings.Count(string(good), "\n") + 2
	_, err = srv.Reload()
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "analyzer.min_requests" || ce.Line != wantLine {
		t.Errorf("Reload of a bad file: %v, want analyzer.min_requests at line %d", err, wantLine)
	}
	code, body = postReload(t, srv.httpURL)
	if code != http.StatusBadRequest || body.Key != "analyzer.min_requests" || body.Line != wantLine || !strings.Contains(body.Error, "min_requests") {
		t.Errorf("POST /-/reload of a bad file = %d %+v, want 400 naming analyzer.min_requests at line %d", code, body, wantLine)
	}
	if got := reloadMetric(t, srv.httpURL, "fleetwatch_config_last_reload_successful"); got != 0 {
		t.Errorf("fleetwatch_config_last_reload_successful = %v after a refused reload, want 0", got)
	}
	if got := reloadMetric(t, srv.httpURL, `fleetwatch_config_reloads_total{result="failure"}`); got != 2 {
		t.Errorf(`reloads_total{result="failure"} = %v, want 2`, got)
	}
	// A key only a restart applies: refused, naming it.
	write(strings.Replace(string(good), "nats: {url: ", "prefix: other\nnats: {url: ", 1))
	code, body = postReload(t, srv.httpURL)
	if code != http.StatusBadRequest || len(body.Restart) != 1 || body.Restart[0].Key != "prefix" || body.Restart[0].Line != 1 {
		t.Errorf("POST /-/reload changing the prefix = %d %+v, want 400 naming prefix at line 1", code, body)
	}
	// Still the last good configuration: p3 is there, p1/bad open, and a
	// new event is still taken.
	if srv.config().Prefix != "fw" || len(srv.config().Pools) != 3 {
		t.Errorf("running configuration after refused reloads: prefix %q, %d pools", srv.config().Prefix, len(srv.config().Pools))
	}
	testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("p3", "z", 200, 50))
	testkit.Eventually(t, 10*time.Second, "p3/z to count an event after the refused reloads", func() bool {
		b, ok := snaps.Backend("p3", "z")
		return ok && b.Requests == 1
	})
	if b, _ := snaps.Backend("p1", "bad"); b.State != fleetwatch.StateOpen {
		t.Errorf("p1/bad = %s after the refused reloads, want open", b.State)
	}
	// Back to a good file: the gauge is 1 again.
	write(string(good))
	if _, err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := reloadMetric(t, srv.httpURL, "fleetwatch_config_last_reload_successful"); got != 1 {
		t.Errorf("fleetwatch_config_last_reload_successful = %v after a good reload, want 1", got)
	}
	if !strings.Contains(logs.String(), "reload refused, the running configuration is kept") {
		t.Errorf("a refused reload was not logged:\n%s", logs.String())
	}
}

// TestReloadWithoutFile: serve started without a file refuses a reload.
func TestReloadWithoutFile(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	srv := startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{})
	if _, err := srv.Reload(); !errors.Is(err, ErrNoConfigFile) {
		t.Errorf("Reload without a file: %v, want ErrNoConfigFile", err)
	}
	if code, body := postReload(t, srv.httpURL); code != http.StatusBadRequest || body.Status != "error" {
		t.Errorf("POST /-/reload without a file = %d %+v, want 400", code, body)
	}
}

// TestReloadBehindAuth: POST /-/reload asks for the API's credentials.
func TestReloadBehindAuth(t *testing.T) {
	dir := t.TempDir()
	file, data := filepath.Join(dir, "fleetwatch.yaml"), filepath.Join(dir, "data")
	yaml := "probes:\n  disabled: true\nhttp:\n  bearer_token_env: TOKEN\npools:\n  - id: p\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	adjust := func(c *config.Config) error { // what newServer sets over the file
		c.HTTP.Listen, c.NATS.Listen, c.Data = "127.0.0.1:0", "127.0.0.1:-1", data
		return nil
	}
	r := newServer(t, yaml, data, Options{Getenv: func(string) string { return "tok" }, ConfigFile: file, AdjustConfig: adjust}).run(t)
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, r.httpURL+"/-/reload", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("POST /-/reload without a token: %d, want 401", code)
	}
	if code := post("tok"); code != http.StatusOK {
		t.Errorf("POST /-/reload with the token: %d, want 200", code)
	}
	if code, _ := get(t, http.DefaultClient, r.httpURL+"/-/reload", cred{bearer: "tok"}); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /-/reload: %d, want 405", code)
	}
}

// TestReloadScrapeTargets: a reload that gives a backend a metrics_url
// starts reading it (its load appears in the snapshots), and one that
// takes it away stops, leaving no scrape series of it in /metrics.
func TestReloadScrapeTargets(t *testing.T) {
	fake, err := fakeai.Listen(fakeai.Settings{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Close() })
	dir := t.TempDir()
	file, data := filepath.Join(dir, "fleetwatch.yaml"), filepath.Join(dir, "data")
	without := "probes: {disabled: true}\npools:\n  - id: p\n    backends:\n      - id: a\n        url: " + fake.URL() + "\n"
	with := without + "        metrics_url: auto\n"
	if err := os.WriteFile(file, []byte(without), 0o644); err != nil {
		t.Fatal(err)
	}
	adjust := func(c *config.Config) error {
		c.HTTP.Listen, c.NATS.Listen, c.Data = "127.0.0.1:0", "127.0.0.1:-1", data
		return nil
	}
	p := newServer(t, without, data, Options{ConfigFile: file, AdjustConfig: adjust}).run(t)
	_, snaps := snapshotsOn(t, p)
	series := `fleetwatch_load_scrapes_total{pool="p",backend="a"}`

	if err := os.WriteFile(file, []byte(with), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Reload(); err != nil || res.Scrape != "restarted" {
		t.Fatalf("Reload = %+v, %v; want the scraper restarted", res, err)
	}
	testkit.Eventually(t, 20*time.Second, "a's scraped load in a snapshot", func() bool {
		b, ok := snaps.Backend("p", "a")
		return ok && b.Load != nil && b.Load.Source == fleetwatch.LoadSourceMetrics
	})
	if _, page := testkit.HTTPGet(t, p.httpURL+"/metrics"); !strings.Contains(page, series) {
		t.Errorf("/metrics lacks %s while a is scraped", series)
	}

	if err := os.WriteFile(file, []byte(without), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Reload(); err != nil || res.Scrape != "restarted" {
		t.Fatalf("Reload = %+v, %v; want the scraper restarted", res, err)
	}
	testkit.Eventually(t, 10*time.Second, "a's scrape series to leave /metrics", func() bool {
		_, page := testkit.HTTPGet(t, p.httpURL+"/metrics")
		return !strings.Contains(page, series)
	})
}

// TestReloadNoProbes: on a serve whose probes are disabled (--no-probes
// sets probes.disabled over every file), a reload that changes the probes
// block starts nothing and says the probes are disabled, not "stopped":
// none were running.
func TestReloadNoProbes(t *testing.T) {
	dir := t.TempDir()
	file, data := filepath.Join(dir, "fleetwatch.yaml"), filepath.Join(dir, "data")
	yaml := "probes:\n  schedule: \"@every 5m\"\npools:\n  - id: p\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	adjust := func(c *config.Config) error { // newServer's overrides, and --no-probes
		c.HTTP.Listen, c.NATS.Listen, c.Data = "127.0.0.1:0", "127.0.0.1:-1", data
		c.Probes.Disabled = true
		return nil
	}
	started := strings.Replace(yaml, "probes:\n", "probes:\n  disabled: true\n", 1)
	var logs testkit.Lines
	r := newServer(t, started, data, Options{ConfigFile: file, AdjustConfig: adjust, Logf: logs.Logf}).run(t)
	nc := feedtest.Connect(t, r.NATSURL())
	testkit.WaitConsuming(t, nc, testkit.SubscribeSnapshots(t, nc), "p", "b") // Run is past the probes' start
	if err := os.WriteFile(file, []byte(strings.Replace(yaml, "5m", "10m", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if res.Probes != "disabled" || strings.Contains(logs.String(), "probes stopped") {
		t.Errorf("probes %q, log:\n%s\nwant probes disabled", res.Probes, logs.String())
	}
}
