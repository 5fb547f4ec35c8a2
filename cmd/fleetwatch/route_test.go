package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// fakeBackends starts n fake backends named b0, b1, ...
func startFakeBackends(t testing.TB, n int) []*fakeai.Server {
	t.Helper()
	out := make([]*fakeai.Server, n)
	for i := range out {
		srv, err := fakeai.Listen(fakeai.Settings{Name: fmt.Sprintf("b%d", i), Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		out[i] = srv
	}
	return out
}

// routeConfig writes a config with one pool "llama" (model alias
// "llama-3.1-70b") whose backends are the fakes, and returns its path.
func routeConfig(t testing.TB, natsURL string, backends []*fakeai.Server, extra string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "nats: {url: %q}\npools:\n  - id: llama\n    models: [llama-3.1-70b]\n%s    backends:\n", natsURL, extra)
	for _, s := range backends {
		fmt.Fprintf(&b, "      - id: %s\n        url: %s\n", s.Name(), s.URL())
	}
	path := filepath.Join(t.TempDir(), "fleetwatch.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startRouteCmd runs `fleetwatch route` in-process on a free port and
// returns its base URL; it stops in t.Cleanup.
func startRouteCmd(t testing.TB, configPath string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	all := append([]string{"--config", configPath, "--listen", "127.0.0.1:0", "--source", "test-route"}, args...)
	go func() { done <- runRoute(ctx, all, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("route: %v\nstderr:\n%s", err, stderr.String())
		}
	})
	var url string
	eventually(t, 30*time.Second, "route to listen", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("route exited: %v\nstderr:\n%s", err, stderr.String())
		default:
		}
		out := stdout.String()
		if i := strings.Index(out, "listening on "); i >= 0 {
			url = strings.Fields(out[i+len("listening on "):])[0]
			return true
		}
		return false
	})
	return url
}

// collectEvents subscribes to every outcome subject and decodes the batches.
type routeEventLog struct {
	mu      sync.Mutex
	events  []fleetwatch.Event
	subject map[string]int
}

func collectRouteEvents(t *testing.T, nc *nats.Conn) *routeEventLog {
	t.Helper()
	l := &routeEventLog{subject: map[string]int{}}
	var dec fleetwatch.Decoder
	sub, err := nc.Subscribe(fleetwatch.Subjects{}.OutcomesWildcard(), func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.subject[m.Subject]++
		dec.DecodeBatch(m.Data, func(line []byte, ev *fleetwatch.Event, err error) {
			if err != nil {
				t.Errorf("bad event %s: %v", line, err)
				return
			}
			l.events = append(l.events, *ev)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *routeEventLog) snapshot() []fleetwatch.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]fleetwatch.Event(nil), l.events...)
}

// client sends OpenAI requests to the router.
type routeClient struct {
	t    testing.TB
	base string
	http *http.Client
}

type routeReply struct {
	status  int
	backend string
	text    string // content (non-streaming) or the concatenated deltas
	body    []byte
	header  http.Header
}

func (c *routeClient) chat(system, user string, stream bool) (routeReply, error) {
	msgs := []map[string]string{{"role": "user", "content": user}}
	if system != "" {
		msgs = append([]map[string]string{{"role": "system", "content": system}}, msgs...)
	}
	return c.post("/v1/chat/completions", map[string]any{
		"model": "llama-3.1-70b", "messages": msgs, "max_tokens": 4, "stream": stream,
		"stream_options": map[string]any{"include_usage": stream},
	})
}

func (c *routeClient) post(path string, body any) (routeReply, error) {
	b, _ := json.Marshal(body)
	resp, err := c.http.Post(c.base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return routeReply{}, err
	}
	defer resp.Body.Close()
	// A body cut off is returned as far as it came, with the read error.
	data, readErr := io.ReadAll(resp.Body)
	r := routeReply{status: resp.StatusCode, backend: resp.Header.Get("X-Fleetwatch-Backend"), body: data, header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var chunk struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &chunk) == nil {
				for _, ch := range chunk.Choices {
					r.text += ch.Delta.Content
				}
			}
		}
	} else {
		var full struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &full) == nil && len(full.Choices) > 0 {
			r.text = full.Choices[0].Message.Content
		}
	}
	return r, readErr
}

func newRouteClient(t testing.TB, base string) *routeClient {
	return &routeClient{t: t, base: base, http: &http.Client{Timeout: 30 * time.Second}}
}

func TestRouteProxiesAndPublishesEvents(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := collectRouteEvents(t, nc)
	backends := startFakeBackends(t, 2)
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	c := newRouteClient(t, base)

	direct := &routeClient{t: t, base: backends[0].URL(), http: http.DefaultClient}
	want, err := direct.chat("be brief", "hello world", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		got, err := c.chat("be brief", "hello world", stream)
		if err != nil {
			t.Fatal(err)
		}
		if got.status != 200 || got.text != want.text || got.backend == "" {
			t.Errorf("stream=%v: status %d backend %q text %q, want 200 and %q", stream, got.status, got.backend, got.text, want.text)
		}
	}
	// Embeddings and an unknown model.
	if r, err := c.post("/v1/embeddings", map[string]any{"model": "llama", "input": "x"}); err != nil || r.status != 200 {
		t.Errorf("embeddings: %v status %d", err, r.status)
	}
	// One pool: a request for an unknown model still goes there.
	if r, err := c.post("/v1/completions", map[string]any{"model": "other", "prompt": "x"}); err != nil || r.status != 200 {
		t.Errorf("unknown model with one pool: %v status %d", err, r.status)
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct{ Data []struct{ ID string } }
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if diff := cmp.Diff([]string{"llama", "llama-3.1-70b"}, []string{models.Data[0].ID, models.Data[1].ID}); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}

	eventually(t, 30*time.Second, "4 outcome events", func() bool { return len(log.snapshot()) >= 4 })
	evs := log.snapshot()
	for _, ev := range evs {
		if ev.Pool != "llama" || ev.Status != 200 || ev.Outcome != fleetwatch.OutcomeOK || !ev.HasTTFT ||
			!ev.HasDuration || ev.Source != "test-route" || ev.TTFTMs > ev.DurationMs {
			t.Errorf("event %+v", ev)
		}
	}
	if evs[0].Prefix == "" || evs[0].Prefix != evs[1].Prefix || evs[0].Fingerprint != "fp_echo" || evs[0].OutputTokens != 4 {
		t.Errorf("chat events: prefix %q %q fingerprint %q output %d", evs[0].Prefix, evs[1].Prefix, evs[0].Fingerprint, evs[0].OutputTokens)
	}
	log.mu.Lock()
	if log.subject["fw.outcomes.test-route"] == 0 {
		t.Errorf("subjects %v, want fw.outcomes.test-route", log.subject)
	}
	log.mu.Unlock()

	// The router's metrics count what happened.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`fleetwatch_route_requests_total{pool="llama",code="200"} 4`,
		`fleetwatch_route_events_published_total 4`,
		`fleetwatch_route_decision_age_seconds{pool="llama"} -1`, // no decision yet
		`fleetwatch_route_backend_weight{pool="llama",backend="b0"} 1`,
		`fleetwatch_route_backend_open{pool="llama",backend="b1"} 0`,
		`fleetwatch_route_pick_duration_seconds_count 4`,
	} {
		if !strings.Contains(string(metricsText), want) {
			t.Errorf("metrics lack %q:\n%s", want, metricsText)
		}
	}
}

func TestRouteRetriesFailuresTheClientHasNotSeen(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := startFakeBackends(t, 3)
	backends[0].SetBehavior(fakeai.Behavior{InstantError: true})
	backends[1].SetBehavior(fakeai.Behavior{Refuse: true})
	// A generous retry budget: this test is about the retry mechanics; the
	// budget is p2c's and tested there.
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""), "--retry-ratio", "10")
	c := newRouteClient(t, base)
	codes := map[int]int{}
	for i := range 60 {
		r, err := c.chat("", fmt.Sprintf("q%d", i), i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		codes[r.status]++
		if r.status == 200 && r.backend != "b2" {
			t.Errorf("a 200 from %s, want only b2 healthy", r.backend)
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
}

func TestRouteFollowsDecisions(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	script := feedtest.NewScript(t, nc, "")
	backends := startFakeBackends(t, 3)
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	c := newRouteClient(t, base)

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
			c.chat("", fmt.Sprint(i), false)
		}
		return backends[0].Stats().Requests == before
	})
	before := backends[0].Stats().Requests
	for i := range 100 {
		if r, err := c.chat("", fmt.Sprint(i), i%3 == 0); err != nil || r.status != 200 {
			t.Fatalf("request %d: %v %d", i, err, r.status)
		}
	}
	if got := backends[0].Stats().Requests - before; got != 0 {
		t.Errorf("open backend b0 got %d requests", got)
	}

	// Every backend open with all_open=shed: 503 with Retry-After at once.
	// Retry-After says when the first breaker half-opens (b1, in 20s).
	allOpen := feedtest.Snapshot("llama", "e1", 2, now, feedtest.Open("b0", now.Add(time.Hour), "x"),
		feedtest.Open("b1", now.Add(20*time.Second), "x"), feedtest.Open("b2", now.Add(time.Hour), "x"))
	allOpen.TTLMs = 3_600_000
	script.Publish(allOpen)
	var shed routeReply
	eventually(t, 30*time.Second, "shedding", func() bool {
		r, err := c.chat("", "x", false)
		shed = r
		return err == nil && r.status == 503
	})
	if ra, err := strconv.Atoi(shed.header.Get("Retry-After")); err != nil || ra < 1 || ra > 20 {
		t.Errorf("Retry-After %q, want 1..20 seconds", shed.header.Get("Retry-After"))
	}
}

func TestRouteAffinityKeepsAPromptOnOneBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := startFakeBackends(t, 3)
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	c := newRouteClient(t, base)
	for _, system := range []string{"you are a pirate", "you are a lawyer", "you are a poet"} {
		seen := map[string]int{}
		for i := range 30 {
			r, err := c.chat(system, fmt.Sprint("question ", i), i%2 == 0)
			if err != nil || r.status != 200 {
				t.Fatalf("%v %d", err, r.status)
			}
			seen[r.backend]++
		}
		if len(seen) != 1 {
			t.Errorf("system prompt %q spread over %v, want one backend", system, seen)
		}
	}
}

func TestRouteKeepsServingWhenNATSIsGone(t *testing.T) {
	natsURL, ns := feedtest.NewServer(t)
	backends := startFakeBackends(t, 2)
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	c := newRouteClient(t, base)
	if r, err := c.chat("", "before", false); err != nil || r.status != 200 {
		t.Fatalf("before: %v %d", err, r.status)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	for i := range 200 {
		r, err := c.chat("", fmt.Sprint(i), i%2 == 0)
		if err != nil || r.status != 200 {
			t.Fatalf("request %d with NATS down: %v %d", i, err, r.status)
		}
	}
}

func TestRouteClientCancellationReachesTheBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	backends := startFakeBackends(t, 1)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
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
}

func TestRouteHeaderTimeoutRetriesAHangingBackend(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := collectRouteEvents(t, nc)
	backends := startFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{Hang: true})
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""), "--header-timeout", "100ms", "--retry-ratio", "10")
	c := newRouteClient(t, base)
	// Until the picker has tried the hanging backend at least once, every
	// request must still be answered by b1.
	for i := 0; i < 20 || backends[0].Stats().Requests == 0; i++ {
		r, err := c.chat("", fmt.Sprint(i), false)
		if err != nil || r.status != 200 || r.backend != "b1" {
			t.Fatalf("request %d: %v status %d from %q", i, err, r.status, r.backend)
		}
		if i > 1000 {
			t.Fatal("the picker never chose b0")
		}
	}
	eventually(t, 30*time.Second, "a timeout event for b0", func() bool {
		for _, ev := range log.snapshot() {
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
	log := collectRouteEvents(t, feedtest.Connect(t, natsURL))
	backends := startFakeBackends(t, 2)
	backends[0].SetBehavior(fakeai.Behavior{BreakAfterTokens: 2})
	base := startRouteCmd(t, routeConfig(t, natsURL, backends, ""), "--retry-ratio", "10")
	c := newRouteClient(t, base)
	cut, fromB1, requests := 0, 0, 0
	for i := 0; cut < 3; i++ {
		requests++
		if i > 1000 {
			t.Fatal("the picker never chose b0")
		}
		r, err := c.chat("", fmt.Sprint(i), true)
		if err != nil && !(r.backend == "b0" && errors.Is(err, io.ErrUnexpectedEOF)) {
			t.Fatal(err)
		}
		switch r.backend {
		case "b0":
			cut++
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("cut stream read error %v, want unexpected EOF", err)
			}
			if r.header.Get("X-Fleetwatch-Attempts") != "1" || strings.Contains(string(r.body), "[DONE]") ||
				r.text != fmt.Sprintf("user: %d", i) {
				t.Errorf("from b0: attempts %s, body %q: want one attempt and a stream cut after 2 tokens",
					r.header.Get("X-Fleetwatch-Attempts"), r.body)
			}
		case "b1":
			fromB1++
			if r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
				t.Errorf("from b1: status %d body %q", r.status, r.body)
			}
		}
	}
	if got := backends[1].Stats().Requests; got != int64(fromB1) {
		t.Errorf("b1 got %d requests but answered %d clients: a retry after the stream began?", got, fromB1)
	}
	eventually(t, 30*time.Second, "one event per request", func() bool { return len(log.snapshot()) == requests })
	eventually(t, 30*time.Second, "error events for the cut streams", func() bool {
		n := 0
		for _, ev := range log.snapshot() {
			if ev.Backend == "b0" && ev.Outcome == fleetwatch.OutcomeError && ev.Status == 200 {
				n++
			}
		}
		return n == 3
	})
}
