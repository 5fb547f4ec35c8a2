package alert

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)

// sink is a real HTTP receiver on loopback that records the bodies posted
// to it and answers with the codes of fail first, then 200.
type sink struct {
	*httptest.Server
	mu     sync.Mutex
	paths  []string
	bodies [][]byte
	auth   []string
	fail   []int
}

func newSink(t *testing.T, fail ...int) *sink {
	s := &sink{fail: fail}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		code := http.StatusOK
		if len(s.fail) > 0 {
			code, s.fail = s.fail[0], s.fail[1:]
		} else {
			s.paths = append(s.paths, r.Method+" "+r.URL.Path)
			s.bodies = append(s.bodies, body)
			s.auth = append(s.auth, r.Header.Get("Authorization"))
		}
		s.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sink) received() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.bodies...)
}

// waitFor polls cond until it holds, failing after a generous deadline
// (the test asserts what arrives, never how fast).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, what, cond)
}

// start runs a notifier for s until the test ends.
func start(t *testing.T, s Settings) *Notifier {
	t.Helper()
	if s.RateLimit == 0 {
		s.RateLimit, s.Burst = 1000, 1000
	}
	if s.Backoff == 0 {
		s.Backoff = time.Millisecond
	}
	if s.Now == nil {
		s.Now = func() time.Time { return t0 }
	}
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Run(context.Background()) }()
	t.Cleanup(func() {
		n.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return n
}

func open(pool, backend string, at time.Time, from fleetwatch.State, cause, reason string) analyzer.Transition {
	return analyzer.Transition{Pool: pool, Backend: backend, From: from, To: fleetwatch.StateOpen, At: at, Cause: cause, Reason: reason}
}

// TestWebhookEpisode: a breaker episode is one firing and one resolved
// notification, however often the backend reopens from half-open in
// between; a second backend is an episode of its own.
func TestWebhookEpisode(t *testing.T) {
	s := newSink(t)
	n := start(t, Settings{Receivers: []Receiver{{Name: "hook", URL: s.URL + "/fw", BearerToken: "sesame"}}, ExternalURL: "http://fw.example/"})
	n.Transition(open("p", "a", t0, fleetwatch.StateClosed, analyzer.CauseFailureRate, "error rate 0.80 >= 0.50 over 40 requests in 30s"))
	n.Transition(analyzer.Transition{Pool: "p", Backend: "a", From: fleetwatch.StateOpen, To: fleetwatch.StateHalfOpen, At: t0.Add(30 * time.Second)})
	n.Transition(open("p", "a", t0.Add(31*time.Second), fleetwatch.StateHalfOpen, analyzer.CauseHalfOpenFailure, "failure while half-open"))
	n.Transition(open("p", "b", t0.Add(40*time.Second), fleetwatch.StateClosed, analyzer.CauseConsecutive, "5 consecutive failures"))
	n.Transition(analyzer.Transition{Pool: "p", Backend: "a", From: fleetwatch.StateHalfOpen, To: fleetwatch.StateClosed, At: t0.Add(2 * time.Minute), Reason: "5 ok in a row while half-open"})
	waitFor(t, "three notifications", func() bool { return len(s.received()) == 3 })

	var got []Notification
	for _, body := range s.received() {
		var note Notification
		if err := json.Unmarshal(body, &note); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		got = append(got, note)
	}
	ended := fleetwatch.At(t0.Add(2 * time.Minute))
	want := []Notification{
		{V: 1, Event: EventBreakerOpen, Status: StatusFiring, Key: "breaker/p/a", Pool: "p", Backend: "a",
			Summary: "breaker open: a in pool p", Reason: "error rate 0.80 >= 0.50 over 40 requests in 30s", Cause: "failure_rate",
			StartsAt: fleetwatch.At(t0), URL: "http://fw.example/"},
		{V: 1, Event: EventBreakerOpen, Status: StatusFiring, Key: "breaker/p/b", Pool: "p", Backend: "b",
			Summary: "breaker open: b in pool p", Reason: "5 consecutive failures", Cause: "consecutive",
			StartsAt: fleetwatch.At(t0.Add(40 * time.Second)), URL: "http://fw.example/"},
		{V: 1, Event: EventBreakerOpen, Status: StatusResolved, Key: "breaker/p/a", Pool: "p", Backend: "a",
			Summary: "breaker open: a in pool p", Reason: "5 ok in a row while half-open", Cause: "failure_rate",
			StartsAt: fleetwatch.At(t0), EndsAt: &ended, URL: "http://fw.example/"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}
	if d := n.deduplicated.Get(); d != 1 {
		t.Errorf("deduplicated %d, want 1 (the reopening)", d)
	}
	rc := n.receivers[0]
	waitFor(t, "three sent", func() bool { return rc.sent.Get() == 3 })
	if rc.failures.Get() != 0 {
		t.Errorf("sent %d failures %d", rc.sent.Get(), rc.failures.Get())
	}
	s.mu.Lock()
	if s.paths[0] != "POST /fw" || s.auth[0] != "Bearer sesame" {
		t.Errorf("request %s with authorization %q", s.paths[0], s.auth[0])
	}
	s.mu.Unlock()
	if active := n.Active(); len(active) != 1 || active[0].Key != "breaker/p/b" {
		t.Errorf("active episodes %+v, want b's", active)
	}
}

// TestQuotaNotification: an opening for a spent quota says "out of quota".
func TestQuotaNotification(t *testing.T) {
	s := newSink(t)
	n := start(t, Settings{Receivers: []Receiver{{Name: "hook", URL: s.URL + "/fw"}}})
	n.Transition(open("p", "a", t0, fleetwatch.StateClosed, analyzer.CauseQuota, "out of quota until 2026-12-05T10:00:00Z (in 3d4h): the backend's retry hint"))
	waitFor(t, "one notification", func() bool { return len(s.received()) == 1 })
	var note Notification
	if err := json.Unmarshal(s.received()[0], &note); err != nil {
		t.Fatal(err)
	}
	if note.Summary != "out of quota: a in pool p" || note.Cause != analyzer.CauseQuota {
		t.Errorf("notification %+v, want an out-of-quota summary", note)
	}
}

// TestSlackPayload: text for notifications, blocks with the reason, and
// mrkdwn's special characters escaped in ids and reasons.
func TestSlackPayload(t *testing.T) {
	s := newSink(t)
	n := start(t, Settings{Receivers: []Receiver{{Kind: KindSlack, URL: s.URL}}})
	n.Transition(open("p", "<!channel>", t0, fleetwatch.StateClosed, analyzer.CauseConsecutive, "5 consecutive failures & more"))
	waitFor(t, "a message", func() bool { return len(s.received()) == 1 })
	var msg struct {
		Text   string `json:"text"`
		Blocks []struct {
			Type string `json:"type"`
			Text struct {
				Type, Text string
			} `json:"text"`
			Elements []struct{ Type, Text string } `json:"elements"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal(s.received()[0], &msg); err != nil {
		t.Fatal(err)
	}
	if msg.Text != "[FIRING] fleetwatch: breaker open: <!channel> in pool p" {
		t.Errorf("text %q", msg.Text)
	}
	if len(msg.Blocks) != 2 || msg.Blocks[0].Type != "section" || msg.Blocks[0].Text.Type != "mrkdwn" {
		t.Fatalf("blocks %+v", msg.Blocks)
	}
	wantBody := "*[FIRING] fleetwatch: breaker open: &lt;!channel&gt; in pool p*\n5 consecutive failures &amp; more"
	if msg.Blocks[0].Text.Text != wantBody {
		t.Errorf("section %q, want %q", msg.Blocks[0].Text.Text, wantBody)
	}
	if n.receivers[0].name != "slack-0" {
		t.Errorf("name %q", n.receivers[0].name)
	}
}

// TestAlertmanager: alerts go to /api/v2/alerts as an array with labels,
// annotations, startsAt and endsAt; a firing alert is re-sent while its
// episode lasts, and its resolution carries the episode's end as endsAt.
// The review digest is not sent to Alertmanager.
func TestAlertmanager(t *testing.T) {
	s := newSink(t)
	n := start(t, Settings{Receivers: []Receiver{{Name: "am", Kind: KindAlertmanager, URL: s.URL + "/"}},
		ResendInterval: 20 * time.Millisecond, ExternalURL: "http://fw.example/"})
	n.PoolState("p", 3, 0, 3, t0)
	waitFor(t, "a re-send", func() bool { return len(s.received()) >= 2 })
	n.PoolState("p", 2, 0, 3, t0.Add(30*time.Second)) // one probing half-open: the same episode
	if len(n.Active()) != 1 {
		t.Fatalf("active episodes %+v, want the pool's", n.Active())
	}
	n.PoolState("p", 3, 0, 3, t0.Add(40*time.Second)) // its probe failed
	n.Review(fleetwatch.DriftReview{V: 1, At: fleetwatch.At(t0), Summary: "nothing drifted"})
	n.PoolState("p", 2, 1, 3, t0.Add(time.Minute))
	var last []amAlert
	waitFor(t, "the resolution", func() bool {
		bodies := s.received()
		last = nil
		json.Unmarshal(bodies[len(bodies)-1], &last)
		return len(last) == 1 && last[0].EndsAt == "2026-12-03T07:01:00.000Z"
	})
	var first []amAlert
	if err := json.Unmarshal(s.received()[0], &first); err != nil {
		t.Fatal(err)
	}
	want := amAlert{
		Labels:       map[string]string{"alertname": "FleetwatchPoolAllOpen", "source": "fleetwatch", "pool": "p", "severity": "critical"},
		Annotations:  map[string]string{"summary": "every backend of pool p is open", "description": "all 3 backends open: routers follow the pool's all_open policy"},
		StartsAt:     "2026-12-03T07:00:00.000Z",
		EndsAt:       "2026-12-03T07:00:00.080Z", // four re-send intervals after now (t0)
		GeneratorURL: "http://fw.example/",
	}
	if diff := cmp.Diff([]amAlert{want}, first); diff != "" {
		t.Errorf("firing alert (-want +got):\n%s", diff)
	}
	want.EndsAt = "2026-12-03T07:01:00.000Z"
	want.Annotations["description"] = "1 of 3 backends closed again"
	if diff := cmp.Diff([]amAlert{want}, last); diff != "" {
		t.Errorf("resolved alert (-want +got):\n%s", diff)
	}
	s.mu.Lock()
	for _, p := range s.paths {
		if p != "POST /api/v2/alerts" {
			t.Errorf("request %s", p)
		}
	}
	s.mu.Unlock()
	for _, body := range s.received() {
		if strings.Contains(string(body), "Review") {
			t.Errorf("the review digest went to Alertmanager: %s", body)
		}
	}
	if len(n.Active()) != 0 {
		t.Errorf("active episodes after the resolution: %+v", n.Active())
	}
}

// TestFailingReceiver: a 5xx is retried with backoff and counted; a receiver
// that keeps failing is given up on and counted; a 4xx is not retried.
func TestFailingReceiver(t *testing.T) {
	flaky := newSink(t, 500, 503)
	down := newSink(t, 502, 502, 502, 502)
	wrong := newSink(t, 400)
	n := start(t, Settings{MaxAttempts: 3, Receivers: []Receiver{
		{Name: "flaky", URL: flaky.URL}, {Name: "down", URL: down.URL}, {Name: "wrong", URL: wrong.URL},
	}})
	n.Drift(fleetwatch.DriftAlert{V: 1, Pool: "p", Backend: "b", At: fleetwatch.At(t0), Status: fleetwatch.DriftDrifted, Score: 7.3, Threshold: 3, Reason: "greedy output changed"})
	byName := map[string]*receiver{}
	for _, rc := range n.receivers {
		byName[rc.name] = rc
	}
	waitFor(t, "every receiver done", func() bool {
		return byName["flaky"].sent.Get() == 1 && byName["down"].gaveUp.Get() == 1 && byName["wrong"].rejectedDrop.Get() == 1
	})
	for name, want := range map[string]uint64{"flaky": 2, "down": 3, "wrong": 1} {
		if got := byName[name].failures.Get(); got != want {
			t.Errorf("%s: %d failed attempts, want %d", name, got, want)
		}
	}
	var note Notification
	if err := json.Unmarshal(flaky.received()[0], &note); err != nil || note.Drift == nil || note.Drift.Score != 7.3 || note.Event != EventDrift {
		t.Errorf("drift notification %+v (%v)", note, err)
	}
}

// TestDedupAndQueue: a drift episode is notified once until the backend is
// ok again; suspect says nothing; a full queue drops and counts, without
// blocking the caller.
func TestDedupAndQueue(t *testing.T) {
	n, err := New(Settings{QueueSize: 2, Receivers: []Receiver{{Name: "x", URL: "http://127.0.0.1:1/"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	drift := func(status fleetwatch.DriftStatus) fleetwatch.DriftAlert {
		return fleetwatch.DriftAlert{Pool: "p", Backend: "b", At: fleetwatch.At(t0), Status: status}
	}
	n.Drift(drift(fleetwatch.DriftSuspect))
	n.Drift(drift(fleetwatch.DriftDrifted))
	n.Drift(drift(fleetwatch.DriftDrifted))
	n.Drift(drift(fleetwatch.DriftOK))
	n.Drift(drift(fleetwatch.DriftOK))
	n.Drift(drift(fleetwatch.DriftDrifted)) // a new episode, beyond the queue
	rc := n.receivers[0]
	if len(rc.queue) != 2 || rc.queueFull.Get() != 1 || n.deduplicated.Get() != 1 {
		t.Errorf("queued %d, dropped %d, deduplicated %d; want 2, 1, 1", len(rc.queue), rc.queueFull.Get(), n.deduplicated.Get())
	}
	if a, b := <-rc.queue, <-rc.queue; a.Status != StatusFiring || b.Status != StatusResolved || a.Key != b.Key {
		t.Errorf("queued %s %s then %s %s", a.Key, a.Status, b.Key, b.Status)
	}
}

func TestTokenBucket(t *testing.T) {
	b := tokenBucket{rate: 2, burst: 3}
	var waits []time.Duration
	for _, at := range []time.Duration{0, 0, 0, 0, 0, 2 * time.Second, 2 * time.Second} {
		waits = append(waits, b.take(t0.Add(at)))
	}
	// Three at once (the burst), then 0.5 s and 1 s of wait at 2/s; two
	// seconds later four tokens came back, of which two are owed.
	want := []time.Duration{0, 0, 0, 500 * time.Millisecond, time.Second, 0, 0}
	if diff := cmp.Diff(want, waits); diff != "" {
		t.Errorf("waits (-want +got):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		s    Settings
		ok   bool
	}{
		{"zero value", Settings{}, true},
		{"three kinds", Settings{Receivers: []Receiver{{URL: "http://a/"}, {Kind: KindSlack, URL: "https://hooks.slack.com/x"}, {Kind: KindAlertmanager, URL: "http://am:9093"}}}, true},
		{"unknown kind", Settings{Receivers: []Receiver{{Kind: "pager", URL: "http://a/"}}}, false},
		{"no URL", Settings{Receivers: []Receiver{{Kind: KindSlack}}}, false},
		{"not http", Settings{Receivers: []Receiver{{URL: "ftp://a/"}}}, false},
		{"duplicate names", Settings{Receivers: []Receiver{{Name: "x", URL: "http://a/"}, {Name: "x", URL: "http://b/"}}}, false},
		{"unknown event", Settings{Receivers: []Receiver{{URL: "http://a/", Events: []Event{"everything"}}}}, false},
		{"negative queue", Settings{QueueSize: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidSettings)) {
				t.Errorf("Validate() = %v, want ok %v", err, tt.ok)
			}
		})
	}
	if err := (Settings{Receivers: []Receiver{{URL: "https://hooks.slack.com/services/SECRET"}}}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := (Settings{Receivers: []Receiver{{URL: "https//hooks.slack.com/services/SECRET"}}}).Validate()
	if err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		n, err := New(Settings{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return testkit.Lifecycle{Run: n.Run, Close: n.Close, Once: true}
	}, ErrRunning, ErrClosed)
}
