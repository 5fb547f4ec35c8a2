package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/router"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// shadowRig is a real serve (with its own NATS server), a real router
// following its decisions over NATS and publishing outcome events, and
// three fake backends b0, b1, b2 in pool p.
type shadowRig struct {
	srv      *running
	snaps    *testkit.SnapshotLog
	rt       *router.Router
	applied  appliedLog // what the router applied
	backends []*fakeai.Server
	chat     *testkit.ChatClient
}

func startShadowRig(t *testing.T, mode fleetwatch.Shadow) *shadowRig {
	t.Helper()
	url, _ := feedtest.NewServer(t)
	// open_base 5m: an open breaker stays open for the whole test. The
	// 429 trip is far away, so that a throttling backend is only
	// down-weighted.
	yaml := fmt.Sprintf(`nats: {url: %q}
probes: {disabled: true}
analyzer: {open_base: 5m, open_max: 5m, throttle_rate: 0.95}
pools:
  - id: p
    shadow: %s
    backends: [{id: b0}, {id: b1}, {id: b2}]
`, url, mode)
	r := &shadowRig{srv: startServer(t, yaml, Options{})}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r.snaps = testkit.SubscribeSnapshots(t, nc)
	r.backends = testkit.StartFakeBackends(t, 3)
	r.rt = startRouter(t, url, r.backends, &r.applied)
	r.chat = testkit.NewChatClient(r.rt.URL())
	return r
}

// send routes n requests; a request may fail (a failing backend and a
// spent retry budget), what counts is where the attempts went.
func (r *shadowRig) send(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		if _, err := r.chat.Post("/v1/completions", map[string]any{"model": "p", "prompt": fmt.Sprint("x", i)}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}

func (r *shadowRig) stats() fleetwatch.Snapshot {
	s, _ := r.snaps.Snapshot("p")
	return s
}

func (r *shadowRig) resetBackendStats() {
	for _, b := range r.backends {
		b.ResetStats()
	}
}

// TestShadowEndToEnd runs shadow mode through a real serve, NATS, router
// and fake backends: b0 fails at once and its breaker opens.
//
// In observe mode the router keeps sending b0 its share, and counts every
// such pick as one the decisions exclude. In breakers mode b0 gets nothing,
// but b2, throttling and down-weighted by the analyzer, still gets as much
// as the healthy b1: the weights are ignored, and the router counts the
// picks that differ from the weighted decision.
func TestShadowEndToEnd(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	t.Run("observe", func(t *testing.T) {
		r := startShadowRig(t, fleetwatch.ShadowObserve)
		r.backends[0].SetBehavior(fakeai.Behavior{InstantError: true})
		testkit.Eventually(t, 30*time.Second, "b0 open in a snapshot the router applied", func() bool {
			r.send(t, 6)
			b, _ := r.snaps.Backend("p", "b0")
			return b.State == fleetwatch.StateOpen && r.applied.backend("b0").State == fleetwatch.StateOpen
		})
		snap := r.stats()
		if snap.Shadow != fleetwatch.ShadowObserve {
			t.Errorf("snapshot shadow = %q, want observe", snap.Shadow)
		}
		if err := snap.Validate(); err != nil {
			t.Errorf("snapshot: %v", err)
		}
		before, _ := r.rt.Route().ShadowStats("p")
		r.resetBackendStats()
		r.send(t, 60)
		after, _ := r.rt.Route().ShadowStats("p")
		if got := r.backends[0].Stats().Requests; got == 0 {
			t.Errorf("the open b0 got no request in observe mode")
		}
		if b, _ := r.snaps.Backend("p", "b0"); b.State != fleetwatch.StateOpen {
			t.Errorf("b0 is %s by the end, want still open (open_base 5m)", b.State)
		}
		if after.ExcludedOpen <= before.ExcludedOpen || after.Differed <= before.Differed {
			t.Errorf("shadow counts before %+v, after %+v: want excluded (open) and differed to move", before, after)
		}
		checkShadowMetrics(t, r, "observe")
		// The status API carries the pool's shadow mode for the page.
		_, body := testkit.HTTPGet(t, r.srv.httpURL+"/api/status")
		var status struct {
			Pools []struct {
				Pool   string            `json:"pool"`
				Shadow fleetwatch.Shadow `json:"shadow"`
			} `json:"pools"`
		}
		if err := json.Unmarshal([]byte(body), &status); err != nil || len(status.Pools) != 1 || status.Pools[0].Shadow != fleetwatch.ShadowObserve {
			t.Errorf("/api/status pools = %+v (%v), want p in shadow observe", status.Pools, err)
		}

		// An operator's drain is honoured even in observe mode: it is an
		// instruction, not fleetwatch's judgement.
		code, reply := postOverride(t, r.srv.httpURL, control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b2", Reason: "rack maintenance", For: "10m", Who: "carol"})
		if code != 200 || reply.Override == nil {
			t.Fatalf("drain: %d %+v", code, reply)
		}
		testkit.Eventually(t, 10*time.Second, "the router to apply the drain", func() bool {
			o := r.applied.backend("b2").Override
			return o != nil && o.Kind == fleetwatch.OverrideDrain
		})
		r.resetBackendStats()
		r.send(t, 40)
		if b0, b2 := r.backends[0].Stats().Requests, r.backends[2].Stats().Requests; b2 != 0 || b0 == 0 {
			t.Errorf("after the drain in observe mode: b0 got %d requests, b2 %d; want b0 some (open, observed) and b2 none (drained)", b0, b2)
		}

		// The status page of this serve shows the mode and the override.
		ctx, problems := newBrowser(t)
		navCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(navCtx, chromedp.Navigate(r.srv.httpURL+"/")); err != nil {
			t.Fatalf("navigate: %v", err)
		}
		waitFor(t, ctx, "the shadow badge", `(() => { const b = document.querySelector("details.pool[data-shadow='observe'] summary .shadow"); return b && !b.hidden && b.textContent === "shadow: observe"; })()`, 30*time.Second)
		waitFor(t, ctx, "b2's drain", `(() => { const c = document.querySelector("tr[data-backend='b2'] td.override"); return c && ["drain", "by carol", "rack maintenance", "(in 10m)"].every(s => c.textContent.includes(s)); })()`, 30*time.Second)
		saveScreenshot(t, ctx, "status-page-shadow.png")
		for _, p := range problems.get() {
			t.Errorf("page problem: %s", p)
		}
	})
	t.Run("breakers", func(t *testing.T) {
		r := startShadowRig(t, fleetwatch.ShadowBreakers)
		r.backends[0].SetBehavior(fakeai.Behavior{InstantError: true})
		r.backends[2].SetBehavior(fakeai.Behavior{ThrottleRate: 0.8})
		testkit.Eventually(t, 40*time.Second, "b0 open and b2 down-weighted in a snapshot the router applied", func() bool {
			r.send(t, 10)
			b0, _ := r.snaps.Backend("p", "b0")
			b2, _ := r.snaps.Backend("p", "b2")
			a0, a2 := r.applied.backend("b0"), r.applied.backend("b2")
			return b0.State == fleetwatch.StateOpen && b2.State == fleetwatch.StateClosed && b2.Weight <= 0.4 &&
				a0.State == fleetwatch.StateOpen && a2.Weight <= 0.4
		})
		if snap := r.stats(); snap.Shadow != fleetwatch.ShadowBreakers {
			t.Errorf("snapshot shadow = %q, want breakers", snap.Shadow)
		}
		before, _ := r.rt.Route().ShadowStats("p")
		r.resetBackendStats()
		const n = 300
		r.send(t, n)
		after, _ := r.rt.Route().ShadowStats("p")
		if got := r.backends[0].Stats().Requests; got != 0 {
			t.Errorf("the open b0 got %d requests in breakers mode, want 0", got)
		}
		// b2's requests are first attempts only (its 429s are retried on
		// b1). Weighted by the decision (at most 0.4) it would get at most
		// 0.4/1.4 of them, under 29%; weighted 1 like b1, a half.
		b1, b2 := r.backends[1].Stats(), r.backends[2].Stats()
		if b2.Requests < n*40/100 {
			t.Errorf("b2 got %d of %d first attempts (b1 %d requests): the weight was not ignored", b2.Requests, n, b1.Requests)
		}
		if after.Differed <= before.Differed || after.Excluded() != before.Excluded() {
			t.Errorf("shadow counts before %+v, after %+v: want differed to move and nothing excluded", before, after)
		}
		b2d, _ := r.snaps.Backend("p", "b2")
		t.Logf("b2 at published weight %.2f got %d of %d requests; picks differing from the decision: %d",
			b2d.Weight, b2.Requests, n, after.Differed-before.Differed)
		checkShadowMetrics(t, r, "breakers")
	})
}

// checkShadowMetrics checks the router's shadow series against its counts,
// and that docs/METRICS.md lists every one under "## fleetwatch route".
func checkShadowMetrics(t *testing.T, r *shadowRig, mode string) {
	t.Helper()
	var b bytes.Buffer
	r.rt.Metrics().WritePrometheus(&b)
	text := b.String()
	st, _ := r.rt.Route().ShadowStats("p")
	for _, line := range []string{
		fmt.Sprintf(`fleetwatch_route_shadow_mode{pool="p",mode=%q} 1`, mode),
		fmt.Sprintf(`fleetwatch_route_shadow_picks_total{pool="p"} %d`, st.Picks),
		fmt.Sprintf(`fleetwatch_route_shadow_differed_total{pool="p"} %d`, st.Differed),
		fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="p",reason="open"} %d`, st.ExcludedOpen),
		fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="p",reason="weight"} %d`, st.ExcludedWeight),
		fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="p",reason="shed"} %d`, st.ExcludedShed),
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("the router's /metrics lacks %s", line)
		}
	}
	doc, err := os.ReadFile("../../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(doc)
	section = section[strings.Index(section, "\n## fleetwatch route"):]
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	for _, name := range regexp.MustCompile(`(?m)^(fleetwatch_route_shadow_[a-z_]+)`).FindAllString(text, -1) {
		if !strings.Contains(section, "| `"+name+"` |") {
			t.Errorf("docs/METRICS.md (## fleetwatch route) does not list %s", name)
		}
	}
}
