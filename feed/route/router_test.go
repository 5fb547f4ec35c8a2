package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

func TestRouteProxiesAndPublishesEvents(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := testkit.CollectEvents(t, nc)
	backends := testkit.StartFakeBackends(t, 2)
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	c := testkit.NewChatClient(rt.url)

	direct := &testkit.ChatClient{Base: backends[0].URL(), HTTP: http.DefaultClient}
	want, err := direct.Chat("be brief", "hello world", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		got, err := c.Chat("be brief", "hello world", stream)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != 200 || got.Text != want.Text || got.Backend == "" || got.Header.Get("X-Fleetwatch-Attempts") != "1" {
			t.Errorf("stream=%v: status %d backend %q attempts %q text %q, want 200 and %q", stream, got.Status,
				got.Backend, got.Header.Get("X-Fleetwatch-Attempts"), got.Text, want.Text)
		}
	}
	// Embeddings, and with one pool a request for an unknown model still
	// goes there.
	if r, err := c.Post("/v1/embeddings", map[string]any{"model": "llama", "input": "x"}); err != nil || r.Status != 200 {
		t.Errorf("embeddings: %v status %d", err, r.Status)
	}
	if r, err := c.Post("/v1/completions", map[string]any{"model": "other", "prompt": "x"}); err != nil || r.Status != 200 {
		t.Errorf("unknown model with one pool: %v status %d", err, r.Status)
	}
	resp, err := http.Get(rt.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct{ Data []struct{ ID string } }
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if diff := cmp.Diff([]string{"llama", "llama-3.1-70b"}, []string{models.Data[0].ID, models.Data[1].ID}); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}
	// Paths the router does not serve are 404s; /metrics is the embedder's.
	for _, path := range []string{"/metrics", "/v1/unknown"} {
		resp, err := http.Get(rt.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}

	eventually(t, 30*time.Second, "4 outcome events", func() bool { return len(log.Events()) >= 4 })
	testkit.CheckEchoChatEvents(t, log.Events(), "llama", "test-route")
	if log.Messages("fw.outcomes.test-route") == 0 {
		t.Errorf("no message on fw.outcomes.test-route")
	}

	// The router's metrics count what happened.
	metricsText := rt.metricsText()
	for _, want := range []string{
		`fleetwatch_route_requests_total{pool="llama",code="200"} 4`,
		`fleetwatch_route_attempts_total{pool="llama",backend="b`,
		`fleetwatch_route_events_published_total 4`,
		`fleetwatch_route_decision_age_seconds{pool="llama"} -1`, // no decision yet
		`fleetwatch_route_pick_candidates{pool="llama"} 3`,       // no router counted yet: 3 sampled
		`fleetwatch_route_backend_weight{pool="llama",backend="b0"} 1`,
		`fleetwatch_route_backend_open{pool="llama",backend="b1"} 0`,
		`fleetwatch_route_in_flight{pool="llama",backend="b0"} 0`,
		`fleetwatch_route_pick_duration_seconds_count 4`,
	} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("metrics lack %q:\n%s", want, metricsText)
		}
	}
}

func TestRouteRetriesFailuresTheClientHasNotSeen(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 3)
	backends[0].SetBehavior(fakeai.Behavior{InstantError: true})
	backends[1].SetBehavior(fakeai.Behavior{Refuse: true})
	// A generous retry budget: this test is about the retry mechanics; the
	// budget is p2c's and tested there.
	pool := llamaPool(backends)
	pool.Picker.RetryRatio = 10
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}})
	c := testkit.NewChatClient(rt.url)
	codes := map[int]int{}
	for i := range 60 {
		r, err := c.Chat("", fmt.Sprintf("q%d", i), i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		codes[r.Status]++
		if r.Status == 200 && r.Backend != "b2" {
			t.Errorf("a 200 from %s, want only b2 healthy", r.Backend)
		}
	}
	// Three attempts reach the one healthy backend whatever the first two
	// picks were.
	if diff := cmp.Diff(map[int]int{200: 60}, codes); diff != "" {
		t.Errorf("client codes (-want +got):\n%s", diff)
	}
	if backends[2].Stats().OK != 60 || backends[0].Stats().Errors == 0 {
		t.Errorf("b0 %+v b2 %+v", backends[0].Stats(), backends[2].Stats())
	}
	// Every pick, retry or substitute was finished: nothing is left in
	// flight, and nothing was finished twice.
	for _, id := range []string{"b0", "b1", "b2"} {
		p := rt.core.pools["llama"].picker
		if n := p.InFlight(id); n != 0 || p.UnbalancedDone() != 0 {
			t.Errorf("%s: in flight %d, unbalanced Done %d; want 0, 0", id, n, p.UnbalancedDone())
		}
	}
	if !strings.Contains(rt.metricsText(), `fleetwatch_route_retries_total{pool="llama"}`) {
		t.Errorf("no retries counted:\n%s", rt.metricsText())
	}
}

// With MaxAttempts 1 a failure reaches the client: the backend's own 5xx,
// or the ErrorHandler's 502 for a refused connection.
func TestRouteMaxAttemptsOne(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{InstantError: true})
	backends[1].SetBehavior(fakeai.Behavior{Refuse: true})
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}, MaxAttempts: 1})
	c := testkit.NewChatClient(rt.url)
	codes := map[string]int{}
	for i := 0; i < 400 && len(codes) < 2; i++ {
		r, err := c.Chat("", fmt.Sprint(i), false)
		if err != nil {
			t.Fatal(err)
		}
		codes[fmt.Sprintf("%s %d %s", r.Backend, r.Status, r.Header.Get("X-Fleetwatch-Attempts"))]++
	}
	if diff := cmp.Diff([]string{"b0 500 1", "b1 502 "}, sortedKeys(codes)); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
}

func TestRouteFollowsDecisions(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	script := feedtest.NewScript(t, nc, "")
	backends := testkit.StartFakeBackends(t, 3)
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	c := testkit.NewChatClient(rt.url)

	now := time.Now()
	openB0 := feedtest.Snapshot("llama", "e1", 1, now,
		feedtest.Open("b0", now.Add(time.Hour), "test"), feedtest.Closed("b1"), feedtest.Closed("b2"))
	openB0.TTLMs = 3_600_000
	script.Publish(openB0)
	// Eventually the open backend gets nothing: wait until a run of
	// requests avoids it, then check a longer run does too.
	eventually(t, 30*time.Second, "the open breaker to be followed", func() bool {
		before := backends[0].Stats().Requests
		for i := range 20 {
			c.Chat("", fmt.Sprint(i), false)
		}
		return backends[0].Stats().Requests == before
	})
	before := backends[0].Stats().Requests
	for i := range 100 {
		if r, err := c.Chat("", fmt.Sprint(i), i%3 == 0); err != nil || r.Status != 200 {
			t.Fatalf("request %d: %v %d", i, err, r.Status)
		}
	}
	if got := backends[0].Stats().Requests - before; got != 0 {
		t.Errorf("open backend b0 got %d requests", got)
	}
	if text := rt.metricsText(); !strings.Contains(text, `fleetwatch_route_backend_open{pool="llama",backend="b0"} 1`) ||
		strings.Contains(text, `fleetwatch_route_decision_age_seconds{pool="llama"} -1`) {
		t.Errorf("metrics do not show the decision:\n%s", text)
	}

	// Every backend open with all_open=shed: 503 with Retry-After at once.
	// Retry-After says when the first breaker half-opens (b1, in 20s).
	allOpen := feedtest.Snapshot("llama", "e1", 2, now, feedtest.Open("b0", now.Add(time.Hour), "x"),
		feedtest.Open("b1", now.Add(20*time.Second), "x"), feedtest.Open("b2", now.Add(time.Hour), "x"))
	allOpen.TTLMs = 3_600_000
	script.Publish(allOpen)
	var shed testkit.ChatReply
	eventually(t, 30*time.Second, "shedding", func() bool {
		r, err := c.Chat("", "x", false)
		shed = r
		return err == nil && r.Status == 503
	})
	if ra, err := strconv.Atoi(shed.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 20 {
		t.Errorf("Retry-After %q, want 1..20 seconds", shed.Header.Get("Retry-After"))
	}
	if text := rt.metricsText(); !strings.Contains(text, `fleetwatch_route_shed_total{pool="llama"}`) ||
		!strings.Contains(text, `fleetwatch_route_requests_total{pool="llama",code="503"}`) {
		t.Errorf("shed not counted:\n%s", text)
	}
}

// A decision naming a backend the configuration lacks: the router has no
// URL for it, routes only to configured backends, and writes no series for
// it.
func TestRouteIgnoresUnconfiguredBackends(t *testing.T) {
	backends := testkit.StartFakeBackends(t, 2)
	var logged []string
	rt, err := New(Settings{Pools: []Pool{llamaPool(backends)}, Logf: func(format string, args ...any) {
		logged = append(logged, fmt.Sprintf(format, args...))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	now := time.Now()
	snap := feedtest.Snapshot("llama", "e1", 1, now, feedtest.Closed("b0"), feedtest.Closed("intruder\"}"))
	snap.TTLMs = 3_600_000
	rt.Apply(snap)
	snap.Seq = 2
	// The same unconfigured backend again is logged once; another pool is
	// ignored.
	rt.Apply(snap)
	rt.Apply(feedtest.Snapshot("other-pool", "e1", 1, now, feedtest.Closed("x")))
	rt.Apply(nil)
	if len(logged) != 1 || !strings.Contains(logged[0], `intruder"}`) {
		t.Errorf("logged %q, want one line naming the unconfigured backend", logged)
	}
	var text strings.Builder
	rt.metrics.set.WritePrometheus(&text)
	if strings.Contains(text.String(), "intruder") || strings.Contains(text.String(), "other-pool") ||
		!strings.Contains(text.String(), `backend="b1"`) {
		t.Errorf("metrics:\n%s", text.String())
	}
	srv := newTestServer(t, rt)
	c := testkit.NewChatClient(srv)
	for i := range 50 {
		r, err := c.Chat("", fmt.Sprint(i), false)
		if err != nil || r.Status != 200 || (r.Backend != "b0" && r.Backend != "b1") {
			t.Fatalf("request %d: %v %d from %q", i, err, r.Status, r.Backend)
		}
	}
}

func TestRouteAffinityKeepsAPromptOnOneBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 3)
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	c := testkit.NewChatClient(rt.url)
	for _, system := range []string{"you are a pirate", "you are a lawyer", "you are a poet"} {
		seen := map[string]int{}
		for i := range 30 {
			r, err := c.Chat(system, fmt.Sprint("question ", i), i%2 == 0)
			if err != nil || r.Status != 200 {
				t.Fatalf("%v %d", err, r.Status)
			}
			seen[r.Backend]++
		}
		if len(seen) != 1 {
			t.Errorf("system prompt %q spread over %v, want one backend", system, seen)
		}
	}
}

// PrefixFrom none: no prefix in the events, and prompts spread.
func TestRoutePrefixFromNone(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	backends := testkit.StartFakeBackends(t, 3)
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}, PrefixFrom: PrefixNone})
	c := testkit.NewChatClient(rt.url)
	seen := map[string]int{}
	for i := range 60 {
		r, err := c.Chat("you are a pirate", fmt.Sprint("question ", i), false)
		if err != nil || r.Status != 200 {
			t.Fatalf("%v %d", err, r.Status)
		}
		seen[r.Backend]++
	}
	if len(seen) < 2 {
		t.Errorf("without affinity one prompt went only to %v", seen)
	}
	eventually(t, 30*time.Second, "60 events", func() bool { return len(log.Events()) == 60 })
	for _, ev := range log.Events() {
		if ev.Prefix != "" {
			t.Fatalf("event with prefix %q, want none", ev.Prefix)
		}
	}
}

func TestRouteKeepsServingWhenNATSIsGone(t *testing.T) {
	natsURL, ns := feedtest.NewServer(t)
	backends := testkit.StartFakeBackends(t, 2)
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	c := testkit.NewChatClient(rt.url)
	if r, err := c.Chat("", "before", false); err != nil || r.Status != 200 {
		t.Fatalf("before: %v %d", err, r.Status)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	for i := range 200 {
		r, err := c.Chat("", fmt.Sprint(i), i%2 == 0)
		if err != nil || r.Status != 200 {
			t.Fatalf("request %d with NATS down: %v %d", i, err, r.Status)
		}
	}
}

func TestRouteClientCancellationReachesTheBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	backends := testkit.StartFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rt.url+"/v1/completions",
			strings.NewReader(`{"model":"llama","prompt":"x"}`))
		_, err := http.DefaultClient.Do(req)
		errc <- err
	}()
	eventually(t, 30*time.Second, "the request to reach the backend", func() bool { return backends[0].Stats().InFlight == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v, want canceled", err)
	}
	eventually(t, 30*time.Second, "the backend to see the cancellation", func() bool { return backends[0].Stats().Canceled == 1 })
	eventually(t, 30*time.Second, "a canceled event and a 499", func() bool {
		evs := log.Events()
		return len(evs) == 1 && evs[0].Outcome == fleetwatch.OutcomeCanceled &&
			strings.Contains(rt.metricsText(), `fleetwatch_route_requests_total{pool="llama",code="499"} 1`)
	})
	if n := rt.core.pools["llama"].picker.InFlight("b0"); n != 0 {
		t.Errorf("in flight after the cancellation: %d", n)
	}
}

func TestRouteHeaderTimeoutRetriesAHangingBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := testkit.CollectEvents(t, nc)
	backends := testkit.StartFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	pool := llamaPool(backends)
	pool.Picker.RetryRatio = 10
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}, HeaderTimeout: 100 * time.Millisecond})
	c := testkit.NewChatClient(rt.url)
	// Until the picker has tried the hanging backend at least once, every
	// request must still be answered by b1.
	for i := 0; i < 20 || backends[0].Stats().Requests == 0; i++ {
		r, err := c.Chat("", fmt.Sprint(i), false)
		if err != nil || r.Status != 200 || r.Backend != "b1" {
			t.Fatalf("request %d: %v status %d from %q", i, err, r.Status, r.Backend)
		}
		if i > 1000 {
			t.Fatal("the picker never chose b0")
		}
	}
	eventually(t, 30*time.Second, "a timeout event for b0", func() bool {
		for _, ev := range log.Events() {
			if ev.Backend == "b0" && ev.Outcome == fleetwatch.OutcomeTimeout && ev.Status == 0 && ev.HasStatus {
				return true
			}
		}
		return false
	})
}

// TestRouteNeverRetriesAfterTheStreamBegan: a backend that dies mid-stream
// leaves the client with a cut stream (it saw bytes: a retry would
// duplicate them) whose connection drops, one attempt, and an error event.
func TestRouteNeverRetriesAfterTheStreamBegan(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	backends := testkit.StartFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{BreakAfterTokens: 2})
	pool := llamaPool(backends)
	pool.Picker.RetryRatio = 10
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{pool}})
	c := testkit.NewChatClient(rt.url)
	cut, fromB1, requests := 0, 0, 0
	for i := 0; cut < 3; i++ {
		requests++
		if i > 1000 {
			t.Fatal("the picker never chose b0")
		}
		r, err := c.Chat("", fmt.Sprint(i), true)
		if err != nil && !(r.Backend == "b0" && errors.Is(err, io.ErrUnexpectedEOF)) {
			t.Fatal(err)
		}
		switch r.Backend {
		case "b0":
			cut++
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("cut stream read error %v, want unexpected EOF", err)
			}
			if r.Header.Get("X-Fleetwatch-Attempts") != "1" || strings.Contains(string(r.Body), "[DONE]") ||
				r.Text != fmt.Sprintf("user: %d", i) {
				t.Errorf("from b0: attempts %s, body %q: want one attempt and a stream cut after 2 tokens",
					r.Header.Get("X-Fleetwatch-Attempts"), r.Body)
			}
		case "b1":
			fromB1++
			if r.Status != 200 || !strings.Contains(string(r.Body), "[DONE]") {
				t.Errorf("from b1: status %d body %q", r.Status, r.Body)
			}
		}
	}
	if got := backends[1].Stats().Requests; got != int64(fromB1) {
		t.Errorf("b1 got %d requests but answered %d clients: a retry after the stream began?", got, fromB1)
	}
	eventually(t, 30*time.Second, "one event per request", func() bool { return len(log.Events()) == requests })
	eventually(t, 30*time.Second, "error events for the cut streams", func() bool {
		n := 0
		for _, ev := range log.Events() {
			if ev.Backend == "b0" && ev.Outcome == fleetwatch.OutcomeError && ev.Status == 200 {
				n++
			}
		}
		return n == 3
	})
}

// TestRouteTTFTIsTheFirstToken checks that a stream's TTFT is taken at the
// first content chunk, not at the headers (which the fake sends at once with
// a role-only chunk). A lower bound only: a timer never fires early.
func TestRouteTTFTIsTheFirstToken(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	log := testkit.CollectEvents(t, feedtest.Connect(t, natsURL))
	backends := testkit.StartFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{TTFT: 150 * time.Millisecond})
	rt := startRouter(t, natsURL, Settings{Pools: []Pool{llamaPool(backends)}})
	c := testkit.NewChatClient(rt.url)
	if r, err := c.Chat("", "hello", true); err != nil || r.Status != 200 {
		t.Fatalf("%v %d", err, r.Status)
	}
	eventually(t, 30*time.Second, "the event", func() bool { return len(log.Events()) == 1 })
	ev := log.Events()[0]
	if !ev.HasTTFT || ev.TTFTMs < 150 || ev.DurationMs < ev.TTFTMs || ev.OutputTokens != 4 {
		t.Errorf("event ttft %v (has %v) duration %v output %d: want ttft >= 150 and 4 tokens",
			ev.TTFTMs, ev.HasTTFT, ev.DurationMs, ev.OutputTokens)
	}
}
