package serve

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"github.com/fleetwatch/fleetwatch/probes"
)

const chromiumBin = "/usr/bin/chromium"

// pageProblems collects what a page must never produce: console errors,
// uncaught exceptions, error log entries (failed loads, CSP violations) and
// JavaScript dialogs (an injected alert()).
type pageProblems struct {
	mu   sync.Mutex // guards list
	list []string
}

func (p *pageProblems) add(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

func (p *pageProblems) get() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.list...)
}

func (p *pageProblems) listen(ev any) {
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			p.add("console.%s: %s", ev.Type, strings.Join(args, " "))
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		p.add("exception at %s:%d: %s", d.URL, d.LineNumber, msg)
	case *cdplog.EventEntryAdded:
		if ev.Entry.Level == cdplog.EntryLevelError {
			p.add("log %s: %s (%s)", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
		}
	case *page.EventJavascriptDialogOpening:
		p.add("javascript dialog %s: %q", ev.Type, ev.Message)
	}
}

// newBrowser starts a headless Chromium with a fresh profile and returns a
// tab context whose problems are collected. The browser stops in t.Cleanup.
func newBrowser(t *testing.T) (context.Context, *pageProblems) {
	t.Helper()
	bin := testkit.RequireTool(t, chromiumBin, "chromium")
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	problems := &pageProblems{}
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(problems.listen))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, cdplog.Enable, cdp.Empty{})
		return err
	}))
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx, problems
}

// evalIn evaluates expr in the page with a timeout and decodes the result.
func evalIn[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls the JavaScript predicate until it is true, failing the test
// after limit (a bound for a broken page, not a performance requirement).
func waitFor(t *testing.T, ctx context.Context, what, predicate string, limit time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		t.Fatalf("waiting for %s (%s): %v", what, predicate, err)
	}
}

func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(testkit.ArtifactDir(t), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// xssBackend is a valid backend id (printable) that would run script if the
// page ever parsed ids as HTML.
const xssBackend = `<img src=x onerror="window.__xss=1;alert(1)"><script>window.__xss=2</script>`

// fleetFixture is a status source driven like serve drives it: a heartbeat
// goroutine builds every pool's snapshot and records it in the history.
type fleetFixture struct {
	src   *fixedStatus
	hist  *history
	openB atomic.Bool // vllm-b's breaker is open
	// overrideUntil is when the fixture's operator overrides end: ten
	// minutes after it starts.
	overrideUntil time.Time
	seq           uint64
	stopped       chan struct{}
}

func (f *fleetFixture) beat(now time.Time) {
	f.seq++
	small := []fleetwatch.Backend{testBackend("vllm-a", 180), testBackend("vllm-b", 210), testBackend("vllm-c", 250), testBackend(xssBackend, 300)}
	small[2].Drift = fleetwatch.DriftDrifted
	small[0].P95TPOTMs = new(float64(23.5))
	small[3].State, small[3].Weight, small[3].Reason = fleetwatch.StateHalfOpen, 0.05, "open time 30s elapsed"
	// Operator overrides: vllm-c drained by alice; vllm-a forced closed
	// with a hostile reason, which must stay text.
	small[2].Weight = 0
	small[2].Override = &fleetwatch.Override{Kind: fleetwatch.OverrideDrain, Reason: "kernel upgrade", Who: "alice", Until: fleetwatch.At(f.overrideUntil)}
	small[0].Override = &fleetwatch.Override{Kind: fleetwatch.OverrideForceClosed, Reason: xssBackend, Who: "bob", Until: fleetwatch.At(f.overrideUntil)}
	if f.openB.Load() {
		small[1] = openBackend(small[1], now, "error rate 0.80 >= 0.50 over 40 requests in 30s")
		// The hostile id also moves, so that it appears in the transitions
		// list, with a hostile reason.
		small[3] = openBackend(small[3], now, xssBackend)
	}
	big := make([]fleetwatch.Backend, 196)
	for i := range big {
		big[i] = testBackend(fmt.Sprintf("gpu-%03d.example:8000", i), 150+float64(i%17)*10+float64(f.seq%5))
	}
	// One out of quota for days (a spend limit).
	big[7] = openBackend(big[7], now, "out of quota until the provider's reset")
	quota := fleetwatch.At(now.Add(72 * time.Hour))
	big[7].OpenUntil, big[7].QuotaUntil = &quota, &quota
	snaps := []fleetwatch.Snapshot{
		testSnapshot("llama-3.1-70b", f.seq, now, small...),
		testSnapshot("meta-llama/Llama-3.1-8B-Instruct", f.seq, now, big...),
	}
	snaps[0].Shadow = fleetwatch.ShadowObserve // the small pool is in shadow mode
	f.src.set(snaps)
	f.hist.record(snaps)
}

func startFleetFixture(t *testing.T) (*fleetFixture, *httptest.Server) {
	f := &fleetFixture{
		src: &fixedStatus{
			ingest: ingestCounts{Received: 12000, Accepted: 11890, Rejected: 110, RejectsByReason: map[string]int64{"ttft_ms out of range": 100, "invalid backend": 9, xssBackend: 1}},
			alerts: []fleetwatch.DriftAlert{
				{V: 1, Pool: "llama-3.1-70b", Backend: "vllm-c", At: fleetwatch.At(time.Now().Add(-time.Minute)), Status: fleetwatch.DriftDrifted, Previous: fleetwatch.DriftOK, Score: 7.3, Threshold: 3, Reason: "greedy output changed on 9 of 16 prompts"},
				{V: 1, Pool: "llama-3.1-70b", Backend: xssBackend, At: fleetwatch.At(time.Now().Add(-2 * time.Minute)), Status: fleetwatch.DriftSuspect, Previous: fleetwatch.DriftOK, Score: 3.1, Threshold: 3, Reason: xssBackend},
			},
			next: time.Now().Add(3 * time.Hour),
			budgets: budgetsOf([]probes.BackendStatus{{Pool: "llama-3.1-70b", Backend: "vllm-b", Status: fleetwatch.DriftOK,
				Budget: &probes.BudgetStatus{TokensPerDay: 581, Spent: map[string]int64{probes.TierTeacher: 385}, SpentTotal: 385,
					Skipped: []string{probes.TierSampled, probes.TierTools}}}}),
		},
		hist:          newHistory(0),
		stopped:       make(chan struct{}),
		overrideUntil: time.Now().Add(10 * time.Minute).Truncate(time.Second),
	}
	f.beat(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // owned by the test; exits on cancel in t.Cleanup
		defer close(f.stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				f.beat(now)
			}
		}
	}()
	mux := http.NewServeMux()
	statusRoutes(mux, f.src, f.hist)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-f.stopped
	})
	return f, srv
}

func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	ctx, problems := newBrowser(t)
	fixture, srv := startFleetFixture(t)

	navCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(navCtx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	waitFor(t, ctx, "200 backend rows", `document.querySelectorAll("tr[data-backend]").length === 200`, 30*time.Second)
	// The p95 TPOT column: a backend with one shows it, one without a dash.
	if got := evalIn[[]string](t, ctx, `["vllm-a", "vllm-b"].map(id => document.querySelector("tr[data-backend='" + id + "'] td.tpot").textContent)`); !slices.Equal(got, []string{"23.5ms", "–"}) {
		t.Errorf("p95 TPOT cells of vllm-a, vllm-b = %q, want 23.5ms and a dash", got)
	}

	// Shadow mode: a visible badge on the small pool only.
	badges := evalIn[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll("details.pool")].map(d => {
		const b = d.querySelector("summary .shadow"), r = b.getBoundingClientRect();
		return [d.querySelector(".name").textContent, b.hidden || r.width === 0 ? "" : b.textContent + " | " + b.title];
	}))`)
	if b := badges["llama-3.1-70b"]; !strings.HasPrefix(b, "shadow: observe | decisions are advisory") {
		t.Errorf("llama-3.1-70b's shadow badge = %q, want a visible \"shadow: observe\" saying the decisions are advisory", b)
	}
	if b := badges["meta-llama/Llama-3.1-8B-Instruct"]; b != "" {
		t.Errorf("the 8B pool (not in shadow mode) shows a shadow badge %q", b)
	}
	// Overrides: kind, who, until and reason in the row; none elsewhere.
	cells := evalIn[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll("tr[data-pool='llama-3.1-70b']")].map(r => [r.dataset.backend, r.querySelector("td.override").textContent]))`)
	untilText := evalIn[string](t, ctx, `new Date(`+fmt.Sprint(fixture.overrideUntil.UnixMilli())+`).toLocaleTimeString()`)
	for _, want := range []string{"drain", "by alice", "until " + untilText, "(in 10m)", "kernel upgrade"} {
		if !strings.Contains(cells["vllm-c"], want) {
			t.Errorf("vllm-c's override cell %q lacks %q", cells["vllm-c"], want)
		}
	}
	if c := cells["vllm-a"]; !strings.Contains(c, "force closed") || !strings.Contains(c, "by bob") || !strings.Contains(c, xssBackend) {
		t.Errorf("vllm-a's override cell %q lacks the kind, who or the reason as text", c)
	}
	if c := cells["vllm-b"]; c != "–" {
		t.Errorf("vllm-b (no override) shows %q, want a dash", c)
	}
	if kind := evalIn[string](t, ctx, `document.querySelector("tr[data-backend='vllm-c']").dataset.override`); kind != "drain" {
		t.Errorf("vllm-c's row data-override = %q, want drain", kind)
	}

	// The probe budget's note beside the drift status, never a bare "ok".
	if d := evalIn[string](t, ctx, `document.querySelector("tr[data-backend='vllm-b'] td.drift").textContent`); !strings.HasSuffix(d, "(sampled and tool-call tiers skipped by the probe budget)") {
		t.Errorf("vllm-b's drift cell = %q, want the tiers the budget skipped", d)
	}

	pools := evalIn[[]string](t, ctx, `[...document.querySelectorAll(".pool .name")].map(e => e.textContent)`)
	if got, want := strings.Join(pools, ","), "llama-3.1-70b,meta-llama/Llama-3.1-8B-Instruct"; got != want {
		t.Errorf("pools shown: %q, want %q", got, want)
	}
	states := evalIn[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll("tr[data-pool='llama-3.1-70b']")].map(r => [r.dataset.backend, r.querySelector(".state").textContent]))`)
	wantStates := map[string]string{"vllm-a": "closed", "vllm-b": "closed", "vllm-c": "closed", xssBackend: "half_open"}
	for id, want := range wantStates {
		if states[id] != want {
			t.Errorf("backend %q shows state %q, want %q (all: %v)", id, states[id], want, states)
		}
	}
	// The hostile id is shown as text and never parsed.
	if n := evalIn[int](t, ctx, `document.querySelectorAll("img, main script").length`); n != 0 {
		t.Errorf("page holds %d img/script elements made from data", n)
	}
	if v := evalIn[bool](t, ctx, `window.__xss !== undefined`); v {
		t.Error("a backend id ran script")
	}
	// Sparklines get drawn once a few heartbeats are recorded.
	waitFor(t, ctx, "sparklines", `document.querySelectorAll("svg.spark path.ttft[d^='M']").length === 200`, 30*time.Second)
	// The summary cards.
	summary := evalIn[string](t, ctx, `document.getElementById("summary").textContent`)
	for _, want := range []string{"ttft_ms out of range: 100", "vllm-c: ok → drifted", "next review",
		"llama-3.1-70b / vllm-b: 385 of 581 tokens (teacher 385)"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}

	// A backend out of quota says so, and until when.
	q := evalIn[[]string](t, ctx, `(() => { const r = document.querySelector("tr[data-backend='gpu-007.example:8000']"); return [r.dataset.state, r.querySelector(".state").textContent, r.querySelector(".state").parentElement.title]; })()`)
	if q[0] != "open" || q[1] != "out of quota" || !strings.HasPrefix(q[2], "out of quota until ") {
		t.Errorf("the backend out of quota shows %q, want state open, \"out of quota\" and its reset time", q)
	}

	// The breaker opens: the row turns open with its reason.
	fixture.openB.Store(true)
	waitFor(t, ctx, "vllm-b open", `(() => { const r = document.querySelector("tr[data-backend='vllm-b']"); return r && r.dataset.state === "open" && r.querySelector(".state").textContent === "open"; })()`, 10*time.Second)
	reason := evalIn[string](t, ctx, `document.querySelector("tr[data-backend='vllm-b'] td.reason").textContent`)
	if !strings.Contains(reason, "error rate 0.80 >= 0.50") {
		t.Errorf("reason cell %q lacks the reason", reason)
	}
	waitFor(t, ctx, "the transition listed", `document.getElementById("transitions").textContent.includes("vllm-b: closed → open")`, 10*time.Second)

	// The hostile id and reason, now in the transitions, alerts and reject
	// lists too, are still only text.
	waitFor(t, ctx, "the hostile transition listed", `document.getElementById("transitions").textContent.includes("half_open → open")`, 10*time.Second)
	if n := evalIn[int](t, ctx, `document.querySelectorAll("img, script:not([src])").length`); n != 0 {
		t.Errorf("page holds %d img or inline script elements made from data", n)
	}
	if v := evalIn[bool](t, ctx, `window.__xss !== undefined`); v {
		t.Error("a backend id ran script")
	}
	if n := evalIn[int](t, ctx, `document.body.textContent.split(`+"`"+xssBackend+"`"+`).length - 1`); n < 4 {
		t.Errorf("the hostile id appears %d times as text, want it in the row, transition, alert and reject lists", n)
	}

	// The filter box narrows 200 rows to the matches.
	evalIn[chromedp.Void](t, ctx, `(() => { const f = document.getElementById("filter"); f.value = "gpu-01"; f.dispatchEvent(new Event("input")); })()`)
	if n := evalIn[int](t, ctx, `document.querySelectorAll("tr[data-backend]").length`); n != 10 {
		t.Errorf("filter gpu-01 shows %d rows, want 10", n)
	}
	evalIn[chromedp.Void](t, ctx, `(() => { const f = document.getElementById("filter"); f.value = ""; f.dispatchEvent(new Event("input")); document.getElementById("collapse").click(); document.querySelector("details.pool").open = true; })()`)

	saveScreenshot(t, ctx, "status-page.png")
	for _, p := range problems.get() {
		t.Errorf("page problem: %s", p)
	}
}

// TestStatusPageWithServe opens the status page of a real `fleetwatch serve`
// fed with outcome events over NATS, and watches a backend's breaker open
// when its events turn to errors.
func TestStatusPageWithServe(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	ctx, problems := newBrowser(t)
	p := startServer(t, "prefix: fw\nprobes: {disabled: true}\n", Options{})
	traffic := &testkit.OutcomeTraffic{Pool: "llama-3.1-70b", Backends: []string{"vllm-a", "vllm-b", "vllm-c", xssBackend}}
	traffic.Start(t, p.NATSURL())

	navCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(navCtx, chromedp.Navigate(p.httpURL+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	waitFor(t, ctx, "4 closed backends", `[...document.querySelectorAll("tr[data-pool='llama-3.1-70b']")].filter(r => r.dataset.state === "closed").length === 4`, 30*time.Second)
	if n := evalIn[int](t, ctx, `document.querySelectorAll("img, main script").length`); n != 0 {
		t.Errorf("page holds %d img/script elements made from data", n)
	}
	ids := evalIn[[]string](t, ctx, `[...document.querySelectorAll("tr[data-pool='llama-3.1-70b'] td.id")].map(e => e.textContent)`)
	if got, want := strings.Join(ids, "|"), strings.Join([]string{xssBackend, "vllm-a", "vllm-b", "vllm-c"}, "|"); got != want {
		t.Errorf("backend ids shown %q, want %q", got, want)
	}

	traffic.SetFailing("vllm-b", true)
	waitFor(t, ctx, "vllm-b open", `(() => { const r = document.querySelector("tr[data-backend='vllm-b']"); return r && r.dataset.state === "open"; })()`, 15*time.Second)
	reason := evalIn[string](t, ctx, `document.querySelector("tr[data-backend='vllm-b'] td.reason").textContent`)
	if strings.TrimSpace(reason) == "" {
		t.Error("the open backend shows no reason")
	}
	waitFor(t, ctx, "the transition listed", `document.getElementById("transitions").textContent.includes("vllm-b: closed → open")`, 10*time.Second)
	summary := evalIn[string](t, ctx, `document.getElementById("ingest").textContent + " " + document.getElementById("rejects").textContent`)
	if !strings.Contains(summary, "bad_json") {
		t.Errorf("ingest and reject cards lack the bad_json rejects: %s", summary)
	}
	// The ingest card says what is kept while serve is down (the capture,
	// by default with JetStream) and what of it was lost.
	for _, want := range []string{"kept while down", "core + capture", "caught up", "lost period (s)"} {
		if !strings.Contains(summary, want) {
			t.Errorf("ingest card lacks %q: %s", want, summary)
		}
	}
	saveScreenshot(t, ctx, "status-page-serve.png")
	for _, p := range problems.get() {
		t.Errorf("page problem: %s", p)
	}
}
