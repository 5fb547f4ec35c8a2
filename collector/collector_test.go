package collector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// recordingSink keeps a copy of every event it observes.
type recordingSink struct {
	delay  time.Duration // per batch, to play a slow analyzer
	urgent bool          // what Observe returns

	mu     sync.Mutex // guards events
	events []fleetwatch.Event
}

func (s *recordingSink) Observe(batch []fleetwatch.Event) bool {
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	s.mu.Lock()
	s.events = append(s.events, batch...)
	s.mu.Unlock()
	return s.urgent
}

func (s *recordingSink) snapshot() []fleetwatch.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func (s *recordingSink) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.events)
}

// fakeClock is an injected Now that tests move by hand.
type fakeClock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// startCollector runs a collector until the test ends. stop cancels Run and
// waits for it to return (after its last flush).
func startCollector(t testing.TB, nc *nats.Conn, sink Sink, s Settings) (c *Collector, stop func()) {
	t.Helper()
	c, err := New(nc, sink, s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	// Run subscribes asynchronously: Ready says when the server has its
	// subscriptions, so that nothing published after it is missed.
	select {
	case <-c.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("the collector never became ready")
	}
	return c, stop
}

// waitFor polls cond until it holds, failing the test after 15 seconds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyEvery(t, 15*time.Second, 2*time.Millisecond, what, cond)
}

var t0 = time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC)

func publish(t testing.TB, nc *nats.Conn, subject string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if err := nc.Publish(subject, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestReadyMeansSubscribed: an event published on another connection the
// moment Ready is closed reaches the sink (core NATS delivers only to
// subscriptions the server already has).
func TestReadyMeansSubscribed(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	other := feedtest.Connect(t, url)
	sink := &recordingSink{}
	c, err := New(nc, sink, Settings{NoJetStream: true, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	<-c.Ready()
	publish(t, other, "fw.outcomes.p", `{"pool":"p","backend":"b","status":200}`)
	waitFor(t, "the event published right after Ready", func() bool { return sink.len() == 1 })
}

func TestEventsReachSink(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	clock := &fakeClock{now: t0}
	sink := &recordingSink{}
	startCollector(t, nc, sink, Settings{Now: clock.Now})

	publish(t, nc, "fw.outcomes",
		`{"v":1,"pool":"llama-3.1-70b","backend":"vllm-a","ts":"2026-12-02T07:49:59.000Z","status":200,"ttft_ms":183.2,"duration_ms":2300.5,"input_tokens":1200,"output_tokens":350,"prefix":"9f2c1a","cache_hit":true,"fingerprint":"fp_1","source":"edge-3"}`)
	publish(t, nc, "fw.outcomes.edge-7",
		"{\"pool\":\"meta-llama/Llama-3.1-70B-Instruct\",\"backend\":\"http://10.0.0.1:8000\",\"status\":429,\"retry_after_ms\":1500}\n"+
			"\n"+
			"{\"pool\":\"p2\",\"backend\":\"b\",\"outcome\":\"error\",\"cold\":true}\n")

	waitFor(t, "3 events", func() bool { return sink.len() == 3 })
	got := sink.snapshot()
	slices.SortFunc(got, func(a, b fleetwatch.Event) int { return strings.Compare(a.Pool, b.Pool) })
	want := []fleetwatch.Event{
		{Pool: "llama-3.1-70b", Backend: "vllm-a", TS: time.Date(2026, 12, 2, 7, 49, 59, 0, time.UTC),
			Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK, TTFTMs: 183.2, HasTTFT: true,
			DurationMs: 2300.5, HasDuration: true, InputTokens: 1200, OutputTokens: 350,
			Prefix: "9f2c1a", CacheHit: true, Fingerprint: "fp_1", Source: "edge-3"},
		{Pool: "meta-llama/Llama-3.1-70B-Instruct", Backend: "http://10.0.0.1:8000", TS: t0,
			Status: 429, HasStatus: true, Outcome: fleetwatch.OutcomeThrottled, RetryAfterMs: 1500},
		{Pool: "p2", Backend: "b", TS: t0, Outcome: fleetwatch.OutcomeError, Cold: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestRejectsByReason(t *testing.T) {
	good := `{"pool":"p","backend":"b","status":200,"ttft_ms":10}`
	tests := []struct {
		name string
		line string
		want fleetwatch.Reason
	}{
		{"bad json", `{"pool":"p","backend":`, fleetwatch.ReasonBadJSON},
		{"missing pool", `{"backend":"b","status":200}`, fleetwatch.ReasonMissingField},
		{"invalid pool id", `{"pool":"a..b","backend":"b"}`, fleetwatch.ReasonInvalidPool},
		{"string for a number", `{"pool":"p","backend":"b","ttft_ms":"fast"}`, fleetwatch.ReasonWrongType},
		{"negative ttft", `{"pool":"p","backend":"b","ttft_ms":-1}`, fleetwatch.ReasonOutOfRange},
		{"1e400 ttft", `{"pool":"p","backend":"b","ttft_ms":1e400}`, fleetwatch.ReasonOutOfRange},
		{"300-byte backend id", `{"pool":"p","backend":"` + strings.Repeat("x", 300) + `"}`, fleetwatch.ReasonInvalidBackend},
		{"unknown v", `{"v":2,"pool":"p","backend":"b"}`, fleetwatch.ReasonBadVersion},
		{"with a source", `{"source":"edge-9","pool":"p","backend":"b","ttft_ms":-5}`, fleetwatch.ReasonOutOfRange},
	}
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	rejects, err := nc.SubscribeSync("fw.rejects")
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{}
	c, _ := startCollector(t, nc, sink, Settings{RejectBurst: 100})

	wantRejected := map[fleetwatch.Reason]uint64{}
	for _, r := range fleetwatch.Reasons {
		wantRejected[r] = 0
	}
	for i, tt := range tests {
		// The bad line sits between two good ones in one NDJSON message.
		publish(t, nc, "fw.outcomes.proxy", good+"\n"+tt.line+"\n"+good+"\n")
		wantRejected[tt.want]++
		msg, err := rejects.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: no reject notice: %v", tt.name, err)
		}
		var notice fleetwatch.Reject
		if err := json.Unmarshal(msg.Data, &notice); err != nil {
			t.Fatalf("%s: reject notice %q: %v", tt.name, msg.Data, err)
		}
		if notice.Code != tt.want || notice.Subject != "fw.outcomes.proxy" || notice.V != 1 || notice.Reason == "" {
			t.Errorf("%s: notice = %+v, want code %s on fw.outcomes.proxy", tt.name, notice, tt.want)
		}
		if wantSource := map[bool]string{true: "edge-9"}[strings.Contains(tt.line, "edge-9")]; notice.Source != wantSource {
			t.Errorf("%s: source = %q, want %q", tt.name, notice.Source, wantSource)
		}
		if wantSample := tt.line[:min(len(tt.line), fleetwatch.MaxSampleLen)]; notice.Sample != wantSample {
			t.Errorf("%s: sample = %q, want %q", tt.name, notice.Sample, wantSample)
		}
		waitFor(t, tt.name+" good events", func() bool { return sink.len() == 2*(i+1) })
	}
	waitFor(t, "counts", func() bool { return c.Stats().AcceptedTotal() == uint64(2*len(tests)) })
	if diff := cmp.Diff(wantRejected, c.Stats().Rejected); diff != "" {
		t.Errorf("rejected by reason (-want +got):\n%s", diff)
	}
}

func TestEmptyMessageIsRejected(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	c, _ := startCollector(t, nc, &recordingSink{}, Settings{})
	publish(t, nc, "fw.outcomes", "", " \n \n")
	waitFor(t, "2 bad_json rejects", func() bool { return c.Stats().Rejected[fleetwatch.ReasonBadJSON] == 2 })
}

func TestRejectRateLimit(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	rejects, err := nc.SubscribeSync("fw.rejects")
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: t0}
	c, _ := startCollector(t, nc, &recordingSink{}, Settings{Now: clock.Now, RejectRate: 10, RejectBurst: 10})

	bad := strings.Repeat(`{"pool":"p"}`+"\n", 25) // missing backend, 25 times
	publish(t, nc, "fw.outcomes", bad)
	waitFor(t, "25 rejects", func() bool { return c.Stats().Rejected[fleetwatch.ReasonMissingField] == 25 })
	for i := 0; i < 10; i++ {
		if _, err := rejects.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("notice %d: %v", i, err)
		}
	}
	if msg, err := rejects.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatalf("an 11th notice within the burst: %s", msg.Data)
	}
	// A wrong type is another reason, with a bucket of its own.
	publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"b","status":"x"}`)
	if _, err := rejects.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("another reason's notice was suppressed: %v", err)
	}

	clock.Advance(time.Second) // 10 tokens again
	publish(t, nc, "fw.outcomes", `{"pool":"p"}`)
	msg, err := rejects.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var notice fleetwatch.Reject
	if err := json.Unmarshal(msg.Data, &notice); err != nil {
		t.Fatal(err)
	}
	if notice.Suppressed != 15 || notice.Code != fleetwatch.ReasonMissingField {
		t.Errorf("notice after the pause = %+v, want 15 suppressed missing_field", notice)
	}
	// The counter is incremented after the publish: the notice can reach
	// the subscriber first.
	waitFor(t, "12 notices counted", func() bool { return c.Stats().RejectsPublished >= 12 })
	st := c.Stats()
	if st.RejectsPublished != 12 || st.RejectsSuppressed != 15 {
		t.Errorf("published %d, suppressed %d; want 12 and 15", st.RejectsPublished, st.RejectsSuppressed)
	}
}

func TestRejectLimiter(t *testing.T) {
	l := newRejectLimiter(2, 3)
	type step struct {
		at             time.Duration
		wantOK         bool
		wantSuppressed int64
	}
	steps := []step{
		{0, true, 0}, {0, true, 0}, {0, true, 0}, // the burst
		{0, false, 0}, {100 * time.Millisecond, false, 0}, // 0.2 tokens
		{500 * time.Millisecond, true, 2}, // 1 token: the notice reports 2 suppressed
		{500 * time.Millisecond, false, 0},
		{10 * time.Second, true, 1}, // refilled to the burst, not beyond
		{10 * time.Second, true, 0},
		{10 * time.Second, true, 0},
		{10 * time.Second, false, 0},
	}
	for i, s := range steps {
		ok, suppressed := l.allow(fleetwatch.ReasonBadJSON, t0.Add(s.at))
		if ok != s.wantOK || suppressed != s.wantSuppressed {
			t.Errorf("step %d at %v: allow = %v, %d; want %v, %d", i, s.at, ok, suppressed, s.wantOK, s.wantSuppressed)
		}
	}
}

func TestSkewReplacement(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	clock := &fakeClock{now: t0}
	sink := &recordingSink{}
	c, _ := startCollector(t, nc, sink, Settings{Now: clock.Now})

	tests := []struct {
		ts     time.Time // zero: no ts field
		wantTS time.Time
	}{
		{t0.Add(-10 * time.Minute), t0},
		{t0.Add(10 * time.Minute), t0},
		{t0.Add(-fleetwatch.MaxSkew), t0.Add(-fleetwatch.MaxSkew)}, // at the bound: kept
		{t0.Add(-time.Minute), t0.Add(-time.Minute)},
		{time.Time{}, t0},
	}
	var payload []byte
	for i, tt := range tests {
		ev := fleetwatch.Event{Pool: "p", Backend: string(rune('a' + i)), TS: tt.ts, Outcome: fleetwatch.OutcomeOK}
		payload = fleetwatch.AppendEvent(payload, &ev)
		payload = append(payload, '\n')
	}
	publish(t, nc, "fw.outcomes", string(payload))
	waitFor(t, "events", func() bool { return sink.len() == len(tests) })
	got := sink.snapshot()
	for i, tt := range tests {
		if !got[i].TS.Equal(tt.wantTS) {
			t.Errorf("event %d: ts %v, want %v", i, got[i].TS, tt.wantTS)
		}
	}
	if got := c.Stats().Skewed; got != 2 {
		t.Errorf("skewed = %d, want 2", got)
	}
}

func TestOnUrgent(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	urgent := make(chan struct{}, 10)
	startCollector(t, nc, &recordingSink{urgent: true}, Settings{OnUrgent: func() {
		select {
		case urgent <- struct{}{}:
		default:
		}
	}})
	publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"b","status":500}`)
	select {
	case <-urgent:
	case <-time.After(10 * time.Second):
		t.Fatal("OnUrgent not called")
	}
}

func TestWithoutJetStream(t *testing.T) {
	tests := []struct {
		name     string
		opts     []feedtest.Option
		settings Settings
	}{
		{"server without JetStream", []feedtest.Option{feedtest.WithoutJetStream()}, Settings{}},
		{"NoJetStream setting", nil, Settings{NoJetStream: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := feedtest.NewServer(t, tt.opts...)
			nc := feedtest.Connect(t, url)
			var logged []string
			var logMu sync.Mutex
			s := tt.settings
			s.Logf = func(format string, args ...any) {
				logMu.Lock()
				logged = append(logged, format)
				logMu.Unlock()
			}
			sink := &recordingSink{}
			c, _ := startCollector(t, nc, sink, s)
			if c.JetStream() || c.Stats().JetStream {
				t.Error("JetStream() = true")
			}
			logMu.Lock()
			said := slices.ContainsFunc(logged, func(l string) bool { return strings.Contains(l, "without capture") })
			logMu.Unlock()
			if !said {
				t.Errorf("no log line says it runs without capture; logged %q", logged)
			}
			var out bytes.Buffer
			c.Metrics().WritePrometheus(&out)
			if !strings.Contains(out.String(), "fleetwatch_collector_jetstream 0\n") {
				t.Errorf("metrics lack fleetwatch_collector_jetstream 0:\n%s", out.String())
			}
			publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"b","status":200}`)
			waitFor(t, "the event", func() bool { return sink.len() == 1 })
			if _, err := c.Replay(t.Context(), t0, func([]fleetwatch.Event) {}); !errors.Is(err, ErrNoJetStream) {
				t.Errorf("Replay error = %v, want ErrNoJetStream", err)
			}
		})
	}
}

func TestMetricsPreregistered(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	c, err := New(nc, &recordingSink{}, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c.Metrics().WritePrometheus(&out)
	for _, want := range []string{
		`fleetwatch_ingest_messages_total 0`,
		`fleetwatch_ingest_events_total{outcome="ok"} 0`,
		`fleetwatch_ingest_events_total{outcome="client_error"} 0`,
		`fleetwatch_ingest_events_total{outcome="stalled"} 0`,
		`fleetwatch_ingest_rejects_total{reason="bad_json"} 0`,
		`fleetwatch_ingest_rejects_total{reason="bad_version"} 0`,
		`fleetwatch_ingest_skewed_total 0`,
		`fleetwatch_ingest_dropped_total 0`,
		`fleetwatch_ingest_batches_total 0`,
		`fleetwatch_stream_published_total 0`,
		`fleetwatch_rejects_published_total 0`,
		`fleetwatch_rejects_suppressed_total 0`,
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestSlowSinkDropsAreCounted(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	// Slow-consumer errors are reported to the connection's error handler
	// too; keep them quiet.
	nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	sink := &recordingSink{delay: time.Millisecond}
	c, stop := startCollector(t, nc, sink, Settings{Subscriptions: 1, PendingMsgs: 20, BatchSize: 1})

	pub := feedtest.Connect(t, url)
	const n = 3000
	for i := 0; i < n; i++ {
		if err := pub.Publish("fw.outcomes.fast", []byte(`{"pool":"p","backend":"b","status":200}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	// Every message is either received or counted as dropped.
	waitFor(t, "received + dropped == published", func() bool {
		st := c.Stats()
		return st.Messages+st.Dropped == n
	})
	stop()
	st := c.Stats()
	if st.Dropped == 0 || st.SlowConsumer == 0 {
		t.Errorf("dropped %d in %d slow-consumer episodes; want both > 0 with a pending limit of 20 and a slow sink",
			st.Dropped, st.SlowConsumer)
	}
	if got := uint64(sink.len()); got != st.AcceptedTotal() || got != st.Messages {
		t.Errorf("sink saw %d events; stats say %d accepted of %d messages", got, st.AcceptedTotal(), st.Messages)
	}
	t.Logf("published %d, received %d, dropped %d", n, st.Messages, st.Dropped)
}

func TestLifecycle(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		c, err := New(nc, &recordingSink{}, Settings{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return testkit.Lifecycle{Run: c.Run, Close: func() error { c.Close(); return nil }, Ready: c.Ready()}
	}, ErrRunning, ErrClosed)
}

// storedEvents counts the events in FW_OUTCOMES by reading every stored
// message with a plain consumer, independently of Replay.
func storedEvents(t *testing.T, nc *nats.Conn) (events int, messages int) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), "FW_OUTCOMES")
	if err != nil {
		t.Fatal(err)
	}
	info := stream.CachedInfo()
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		msg, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		events += bytes.Count(msg.Data, []byte{'\n'})
		messages++
	}
	return events, messages
}

func TestJetStreamCaptureAndReplay(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	clock := &fakeClock{now: time.Now()} // not truncated: the collector stamps with ms precision
	sink := &recordingSink{}
	c, stop := startCollector(t, nc, sink, Settings{Now: clock.Now, StreamBatchBytes: 4096})
	if !c.JetStream() {
		t.Fatal("JetStream() = false on a JetStream server")
	}

	const singles, batches, perBatch = 300, 20, 50
	want := 0
	for i := 0; i < singles; i++ {
		ev := fleetwatch.Event{Pool: []string{"p1", "p2", "a/b"}[i%3], Backend: "b", Outcome: fleetwatch.OutcomeOK,
			TS: clock.Now().Add(-time.Duration(i) * time.Millisecond), TTFTMs: float64(i), HasTTFT: true}
		publish(t, nc, "fw.outcomes.one", string(fleetwatch.AppendEvent(nil, &ev)))
		want++
	}
	for i := 0; i < batches; i++ {
		var evs []fleetwatch.Event
		for j := 0; j < perBatch; j++ {
			evs = append(evs, fleetwatch.Event{Pool: "p1", Backend: "c", Status: 503, HasStatus: true, Outcome: fleetwatch.OutcomeError})
		}
		payload := fleetwatch.AppendNDJSON(nil, evs)
		payload = append(payload, "{\"pool\":\"p1\"}\n"...) // one bad line per batch
		publish(t, nc, "fw.outcomes", string(payload))
		want += perBatch
	}
	// Republished verbatim, encoded afresh, or both: an unknown field, a
	// pretty-printed object spanning lines, a skewed ts, a ts to the
	// millisecond and one with more digits.
	publish(t, nc, "fw.outcomes.odd",
		`{"pool":"p3","backend":"verbatim","status":200,"ts":"`+fleetwatch.FormatTime(clock.Now())+`","extra":{"a":[1,2]}}`,
		"{\n  \"pool\": \"p3\",\n  \"backend\": \"pretty\",\n  \"status\": 500\n}",
		`{"pool":"p3","backend":"skewed","status":200,"ts":"2000-01-01T00:00:00Z"}`,
		`{"pool":"p3","backend":"nanos","status":200,"ts":"`+clock.Now().UTC().Format(time.RFC3339Nano)+`"}`)
	want += 4

	waitFor(t, "accepted events", func() bool { return sink.len() == want })
	stop() // flushes the last republished batches
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	st := c.Stats()
	if st.AcceptedTotal() != uint64(want) {
		t.Fatalf("accepted %d, want %d", st.AcceptedTotal(), want)
	}
	var stored, messages int
	waitFor(t, "stored == accepted", func() bool {
		stored, messages = storedEvents(t, nc)
		return stored == want
	})
	if uint64(stored) != st.StreamPublishedEvents || uint64(messages) != st.StreamPublished {
		t.Errorf("stream holds %d events in %d messages; collector published %d in %d",
			stored, messages, st.StreamPublishedEvents, st.StreamPublished)
	}
	t.Logf("accepted %d events, stored %d in %d stream messages", want, stored, messages)

	var replayed []fleetwatch.Event
	n, err := c.Replay(t.Context(), clock.Now().Add(-time.Hour), func(batch []fleetwatch.Event) {
		replayed = append(replayed, batch...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Errorf("Replay returned %d events, want %d", n, want)
	}
	sortEvents := func(evs []fleetwatch.Event) {
		slices.SortFunc(evs, func(a, b fleetwatch.Event) int {
			if c := strings.Compare(a.Pool, b.Pool); c != 0 {
				return c
			}
			if c := strings.Compare(a.Backend, b.Backend); c != 0 {
				return c
			}
			if c := a.TS.Compare(b.TS); c != 0 {
				return c
			}
			return int(a.TTFTMs - b.TTFTMs)
		})
	}
	accepted := sink.snapshot()
	sortEvents(accepted)
	sortEvents(replayed)
	if diff := cmp.Diff(accepted, replayed); diff != "" {
		t.Errorf("replayed events differ from accepted ones (-accepted +replayed):\n%s", diff)
	}

	// Nothing was stored after now.
	n, err = c.Replay(t.Context(), time.Now().Add(time.Hour), func([]fleetwatch.Event) {
		t.Error("fn called for a replay from the future")
	})
	if err != nil || n != 0 {
		t.Errorf("Replay from the future = %d, %v; want 0, nil", n, err)
	}
}

func TestReplaySince(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	sink := &recordingSink{}
	c, _ := startCollector(t, nc, sink, Settings{})

	publish(t, nc, "fw.outcomes", `{"pool":"p","backend":"before","status":200}`)
	waitFor(t, "the first event stored", func() bool { n, _ := storedEvents(t, nc); return n == 1 })
	time.Sleep(20 * time.Millisecond) // the stream's clock must move past the first event
	since := time.Now()
	time.Sleep(20 * time.Millisecond)
	publish(t, nc, "fw.outcomes", "{\"pool\":\"p\",\"backend\":\"after\",\"status\":200}\n{\"pool\":\"q\",\"backend\":\"after\",\"status\":500}")
	waitFor(t, "all events stored", func() bool { n, _ := storedEvents(t, nc); return n == 3 })

	var backends []string
	n, err := c.Replay(t.Context(), since, func(batch []fleetwatch.Event) {
		for _, ev := range batch {
			backends = append(backends, ev.Pool+"/"+ev.Backend)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(backends)
	if diff := cmp.Diff([]string{"p/after", "q/after"}, backends); diff != "" || n != 2 {
		t.Errorf("Replay since the middle returned %d events (-want +got):\n%s", n, diff)
	}
}

func TestRunFlushesLastBatchOnStop(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	sink := &recordingSink{}
	// Nothing is flushed by time: only the stop can hand the batch over.
	c, stop := startCollector(t, nc, sink, Settings{FlushInterval: time.Hour, StreamFlushInterval: time.Hour, BatchSize: 1000})
	publish(t, nc, "fw.outcomes.x", strings.Repeat(`{"pool":"p","backend":"b","status":200}`+"\n", 5))
	publish(t, nc, "fw.outcomes", `{"pool":"q","backend":"b","status":200}`)
	waitFor(t, "both messages delivered", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var n int64
		for _, w := range c.workers {
			d, _ := w.sub.Delivered()
			n += d
		}
		return n == 2
	})
	if got := sink.len(); got != 0 {
		t.Fatalf("sink saw %d events before the stop", got)
	}
	stop()
	if got := sink.len(); got != 6 {
		t.Errorf("sink saw %d events after the stop, want 6", got)
	}
	if st := c.Stats(); st.Messages != 2 || st.AcceptedTotal() != 6 || st.StreamPublishedEvents != 6 {
		t.Errorf("stats after the stop: %d messages, %d accepted, %d republished; want 2, 6, 6",
			st.Messages, st.AcceptedTotal(), st.StreamPublishedEvents)
	}
}
