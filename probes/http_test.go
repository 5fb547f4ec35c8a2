package probes_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

// toyServer serves c over real HTTP through the fake OpenAI-compatible
// server.
func toyServer(t *testing.T, c fakeai.Completer, b fakeai.Behavior) (*fakeai.Server, *httptest.Server) {
	t.Helper()
	fs := fakeai.New(fakeai.Settings{Completer: c, Behavior: b})
	hs := httptest.NewServer(fs)
	t.Cleanup(hs.Close)
	return fs, hs
}

func defaultSuite(t *testing.T) *probes.Suite {
	t.Helper()
	s, err := probes.LoadSuite("")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestClientCycleMatchesTheModel(t *testing.T) {
	m := toylm.New(toylm.Config{}).With(toylm.Options{Fingerprint: "fp_toy"})
	_, hs := toyServer(t, m, fakeai.Behavior{Model: "toy-model"})
	s := defaultSuite(t)
	c := probes.NewClient(probes.Target{Pool: "p", Backend: "b", URL: hs.URL + "/v1"}, nil)
	cy, caps, err := c.RunCycle(t.Context(), s, time.Unix(0, 0), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(probes.Capabilities{Logprobs: true, TopLogprobsCap: 5, Fingerprint: true, Version: true}, caps); diff != "" {
		t.Errorf("capabilities (-want +got):\n%s", diff)
	}
	wantID := probes.Identity{Fingerprint: "fp_toy", ModelIDs: []string{"toy-model"}, Version: "fakeai-1"}
	gotID := cy.Identity
	gotID.PromptTokens = nil
	if diff := cmp.Diff(wantID, gotID); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}
	// Over HTTP the probe must see exactly what the model produced for the
	// canonical chat request (the fake server renders chat as "user: ...").
	direct := toylm.Cycle(s, m, time.Unix(0, 0))
	if len(cy.Obs) != len(s.Prompts) {
		t.Fatalf("%d observations, want %d", len(cy.Obs), len(s.Prompts))
	}
	for i := range cy.Obs {
		got, want := cy.Obs[i], direct.Obs[i]
		want.Model = "toy-model"
		got.PromptTokens, want.PromptTokens = 0, 0 // the server counts its own way
		if diff := cmp.Diff(want, got, floatTolerance); diff != "" {
			t.Fatalf("prompt %s over HTTP (-want +got):\n%s", s.Prompts[i].ID, diff)
		}
	}
}

var floatTolerance = cmp.Comparer(func(a, b float64) bool { return a == b || (a-b < 1e-9 && b-a < 1e-9) })

func TestCompletionsEndpoint(t *testing.T) {
	_, hs := toyServer(t, toylm.New(toylm.Config{}), fakeai.Behavior{})
	c := probes.NewClient(probes.Target{URL: hs.URL, Endpoint: probes.EndpointCompletions}, nil)
	o, err := c.Probe(t.Context(), "fake-model", probes.Prompt{ID: "x", Text: "hello there", MaxTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	if !o.HasLogprobs || len(o.Tokens) != 6 || len(o.Tokens[0].Top) != 5 {
		t.Fatalf("observation %+v: want 6 tokens with 5 alternatives", o)
	}
	for _, tk := range o.Tokens {
		if !slices.IsSortedFunc(tk.Top, func(a, b probes.Alt) int {
			switch {
			case a.Logprob > b.Logprob:
				return -1
			case a.Logprob < b.Logprob:
				return 1
			}
			return 0
		}) {
			t.Errorf("alternatives not most likely first: %v", tk.Top)
		}
	}
}

func TestRequestBodyIsCanonical(t *testing.T) {
	p := probes.Prompt{ID: "x", Kind: probes.KindStable, Text: "Say \"hi\"", MaxTokens: 50}
	want := `{"model":"m","messages":[{"role":"user","content":"Say \"hi\""}],"temperature":0,"top_p":1,"max_tokens":20,"logprobs":true,"top_logprobs":5,"seed":1}`
	if got := string(probes.RequestBody(probes.EndpointChat, "m", p)); got != want {
		t.Errorf("chat body\n got %s\nwant %s", got, want)
	}
	wantC := `{"model":"m","prompt":"Say \"hi\"","temperature":0,"top_p":1,"max_tokens":20,"logprobs":5,"seed":1}`
	if got := string(probes.RequestBody(probes.EndpointCompletions, "m", p)); got != wantC {
		t.Errorf("completions body\n got %s\nwant %s", got, wantC)
	}
	if !bytes.Equal(probes.RequestBody("", "m", p), probes.RequestBody(probes.EndpointChat, "m", p)) {
		t.Error("the same request gave different bytes")
	}
}

// malformedServer answers /v1/models properly and generation with broken
// JSON.
func malformedServer(t *testing.T) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
		case "/version":
			http.NotFound(w, r)
		default:
			w.Write([]byte(`{"choices":[{"message":{"content":"hi"`))
		}
	}))
	t.Cleanup(hs.Close)
	return hs
}

func TestClientErrors(t *testing.T) {
	s := defaultSuite(t)
	toy := toylm.New(toylm.Config{})
	_, fail := toyServer(t, toy, fakeai.Behavior{InstantError: true})
	_, hang := toyServer(t, toy, fakeai.Behavior{Hang: true})
	bad := malformedServer(t)
	for _, tc := range []struct {
		name   string
		url    string
		kind   string
		status int
	}{
		{"500", fail.URL, probes.ErrKindStatus, 500},
		{"hang", hang.URL, probes.ErrKindTimeout, 0},
		{"malformed JSON", bad.URL, probes.ErrKindMalformed, 0},
		{"connection refused", "http://127.0.0.1:1", probes.ErrKindTransport, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := probes.NewClient(probes.Target{URL: tc.url}, nil)
			_, _, err := c.RunCycle(t.Context(), s, time.Now(), 200*time.Millisecond)
			var pe *probes.ProbeError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ProbeError", err)
			}
			if pe.Kind != tc.kind || pe.Status != tc.status {
				t.Errorf("kind %q status %d, want %q %d (%v)", pe.Kind, pe.Status, tc.kind, tc.status, err)
			}
			if tc.kind == probes.ErrKindMalformed && !errors.Is(err, probes.ErrBadResponse) {
				t.Errorf("malformed: %v does not wrap ErrBadResponse", err)
			}
		})
	}
}

// recordingSink keeps what a Prober reports.
type recordingSink struct {
	mu       sync.Mutex
	alerts   []fleetwatch.DriftAlert
	statuses map[string]fleetwatch.DriftStatus
	errs     map[string][]error
}

func newSink() *recordingSink {
	return &recordingSink{statuses: map[string]fleetwatch.DriftStatus{}, errs: map[string][]error{}}
}

func (s *recordingSink) Alert(a fleetwatch.DriftAlert) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alerts = append(s.alerts, a)
}

func (s *recordingSink) Status(pool, backend string, st fleetwatch.DriftStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses[backend] = st
}

func (s *recordingSink) ProbeError(pool, backend string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[backend] = append(s.errs[backend], err)
}

func (s *recordingSink) alertsFor(backend string) []fleetwatch.DriftAlert {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []fleetwatch.DriftAlert
	for _, a := range s.alerts {
		if a.Backend == backend {
			out = append(out, a)
		}
	}
	return out
}

func TestBadBackendsNeverGiveVerdictsNorStopOthers(t *testing.T) {
	toy := toylm.New(toylm.Config{})
	_, good := toyServer(t, toy.With(toylm.Options{Sigma: 0.03, NoiseSeed: 1}), fakeai.Behavior{})
	_, fail := toyServer(t, toy, fakeai.Behavior{InstantError: true})
	_, hang := toyServer(t, toy, fakeai.Behavior{Hang: true})
	bad := malformedServer(t)
	// enrols with logprobs, then loses them
	sw := toylm.NewSwitch(toy)
	_, nolp := toyServer(t, sw, fakeai.Behavior{})
	sink := newSink()
	set := metrics.NewSet()
	p, err := probes.New(probes.Settings{
		Targets: []probes.Target{
			{Pool: "p", Backend: "good", URL: good.URL},
			{Pool: "p", Backend: "fail", URL: fail.URL},
			{Pool: "p", Backend: "hang", URL: hang.URL},
			{Pool: "p", Backend: "malformed", URL: bad.URL},
			{Pool: "p", Backend: "lost-logprobs", URL: nolp.URL},
		},
		// The timeout is what each hanging probe costs, but it also bounds
		// the good backend's requests on a loaded machine under -race:
		// 200ms failed the good backend now and then.
		Sink: sink, Metrics: set, Enrol: 3, EnrolMin: -1, Timeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for cycle := range 5 {
		if cycle == 3 {
			sw.Set(toy.With(toylm.Options{NoLogprobs: true}))
		}
		var wg sync.WaitGroup
		for _, b := range []string{"good", "fail", "hang", "malformed", "lost-logprobs"} {
			wg.Go(func() { p.ProbeBackend(ctx, "p", b) })
		}
		wg.Wait()
	}
	st := map[string]probes.BackendStatus{}
	for _, s := range p.Statuses() {
		st[s.Backend] = s
	}
	if g := st["good"]; g.Enrolling || g.Status != fleetwatch.DriftOK || g.Errors != 0 {
		t.Errorf("good backend: %+v, want enrolled, ok, no errors", g)
	}
	for b, kind := range map[string]string{"fail": "status", "hang": "timeout", "malformed": "malformed", "lost-logprobs": "no_logprobs"} {
		s := st[b]
		if s.LastErrorKind != kind || s.Status == fleetwatch.DriftSuspect || s.Status == fleetwatch.DriftDrifted {
			t.Errorf("%s: status %s, last error %q (%s), want kind %s and no verdict", b, s.Status, s.LastErrorKind, s.LastError, kind)
		}
		if len(sink.alertsFor(b)) != 0 {
			t.Errorf("%s: alerts %+v, want none", b, sink.alertsFor(b))
		}
	}
	if got := len(sink.errs["lost-logprobs"]); got != 2 || !errors.Is(sink.errs["lost-logprobs"][0], probes.ErrNoLogprobs) {
		t.Errorf("lost-logprobs: errors %v, want 2 x ErrNoLogprobs", sink.errs["lost-logprobs"])
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	for _, want := range []string{
		`fleetwatch_probe_errors_total{pool="p",backend="fail",kind="status"} 5`,
		`fleetwatch_probe_errors_total{pool="p",backend="hang",kind="timeout"} 5`,
		`fleetwatch_probe_errors_total{pool="p",backend="malformed",kind="malformed"} 5`,
		`fleetwatch_probe_errors_total{pool="p",backend="lost-logprobs",kind="no_logprobs"} 2`,
		`fleetwatch_probe_cycles_total 8`,
		`fleetwatch_drift_status{pool="p",backend="good"} 0`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, buf.String())
		}
	}
	md := probes.RenderMarkdown(probes.BuildReview(time.Now(), time.Now().Add(-time.Hour), nil, p.Statuses()), p.Statuses())
	for _, want := range []string{"## Probe errors (not verdicts)", "| p | hang | 5 | timeout |", "| p | malformed | 5 | malformed |"} {
		if !strings.Contains(md, want) {
			t.Errorf("review lacks %q:\n%s", want, md)
		}
	}
}

// fakeClock is a settable clock for Prober.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Hour) // every reading is an hour later: cycles an hour apart
	return c.t
}

func TestProberDetectsAChangeOverHTTP(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	q4, _ := ref.Quantized(toylm.KLQ4)
	o := toylm.Options{Sigma: 0.03, NoiseSeed: 3, Fingerprint: "fp_a"}
	sw := toylm.NewSwitch(ref.With(o))
	fs, hs := toyServer(t, sw, fakeai.Behavior{})
	sink := newSink()
	clock := &fakeClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		Sink: sink, Enrol: 4, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for range 6 { // 4 hours of enrolment are not the 2h minimum until the 3rd; 6 to be sure
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Statuses()[0]; s.Enrolling || s.Status != fleetwatch.DriftOK {
		t.Fatalf("after enrolment: %+v", s)
	}
	o.Fingerprint = "fp_b"
	sw.Set(q4.With(o))
	before := fs.Stats().Requests
	if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
		t.Fatal(err)
	}
	if got := fs.Stats().Requests - before; got != 32 {
		t.Errorf("%d generation requests, want 32: the fingerprint change runs an extra cycle", got)
	}
	alerts := sink.alertsFor("b")
	if len(alerts) != 1 {
		t.Fatalf("alerts %+v, want one", alerts)
	}
	a := alerts[0]
	if a.Status != fleetwatch.DriftDrifted || a.Previous != fleetwatch.DriftOK || a.Against != fleetwatch.AgainstBaseline || a.Suite != "default-v1" {
		t.Errorf("alert %+v", a)
	}
	if a.Evidence.MeanAbsLogprobDelta == nil || *a.Evidence.MeanAbsLogprobDelta < 0.1 || a.Evidence.Prompts != 16 {
		t.Errorf("evidence %+v", a.Evidence)
	}
	if changed, ok := a.Evidence.Extra["changed_prompts"].(map[string]string); !ok || len(changed) == 0 {
		t.Errorf("changed_prompts %v, want the prompts whose output changed", a.Evidence.Extra["changed_prompts"])
	}
	if a.Evidence.FingerprintBefore == nil || *a.Evidence.FingerprintBefore != "fp_a" || a.Evidence.FingerprintAfter == nil || *a.Evidence.FingerprintAfter != "fp_b" {
		t.Errorf("fingerprints %v %v", a.Evidence.FingerprintBefore, a.Evidence.FingerprintAfter)
	}
	if sink.statuses["b"] != fleetwatch.DriftDrifted {
		t.Errorf("sink status %s, want drifted", sink.statuses["b"])
	}
	// an explicit re-baseline is recorded and enrolment restarts
	ra, err := p.Rebaseline(t.Context(), "p", "b", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if ra.Status != fleetwatch.DriftUnknown || ra.Previous != fleetwatch.DriftDrifted || ra.Evidence.Extra["action"] != "rebaseline" {
		t.Errorf("rebaseline alert %+v", ra)
	}
	if s := p.Statuses()[0]; !s.Enrolling || s.Status != fleetwatch.DriftUnknown {
		t.Errorf("after rebaseline: %+v", s)
	}
}

func TestBlackBoxBackendSwapIsCaught(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	o := toylm.Options{NoLogprobs: true, Sigma: 0.003, NoiseSeed: 9}
	sw := toylm.NewSwitch(ref.With(o))
	_, hs := toyServer(t, sw, fakeai.Behavior{})
	sink := newSink()
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "bb", URL: hs.URL}},
		Sink: sink, Enrol: 4, EnrolMin: -1, Params: probes.Params{Permutations: 199}})
	if err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if err := p.ProbeBackend(t.Context(), "p", "bb"); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Statuses()[0]; s.Enrolling || s.Logprobs || s.Status != fleetwatch.DriftOK {
		t.Fatalf("black-box backend after 8 unchanged cycles: %+v", s)
	}
	sw.Set(ref.Swapped(77).With(o))
	if err := p.ProbeBackend(t.Context(), "p", "bb"); err != nil {
		t.Fatal(err)
	}
	alerts := sink.alertsFor("bb")
	if len(alerts) != 1 || alerts[0].Status != fleetwatch.DriftDrifted || alerts[0].Evidence.MeanAbsLogprobDelta != nil {
		t.Fatalf("alerts %+v, want one drifted with null logprob evidence", alerts)
	}
}

func TestProberRejectsBadSettings(t *testing.T) {
	for _, s := range []probes.Settings{
		{Schedule: "not a schedule"},
		{Targets: []probes.Target{{Pool: "p", URL: "http://x"}}},
		{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: "http://x"}, {Pool: "p", Backend: "b", URL: "http://y"}}},
	} {
		if _, err := probes.New(s); err == nil {
			t.Errorf("New(%+v) accepted", s)
		}
	}
	p, err := probes.New(probes.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ProbeBackend(context.Background(), "p", "nope"); !errors.Is(err, probes.ErrUnknownBackend) {
		t.Errorf("unknown backend: %v", err)
	}
}

// mapStore is a BaselineStore in a map, shared between two Probers to
// play a restart.
type mapStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *mapStore) Load(_ context.Context, pool, backend string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[pool+"/"+backend]
	if !ok {
		return nil, probes.ErrNoBaseline
	}
	return d, nil
}

func (s *mapStore) Save(_ context.Context, pool, backend string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[pool+"/"+backend] = data
	return nil
}

func TestBaselinesSurviveARestart(t *testing.T) {
	_, hs := toyServer(t, toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.03}), fakeai.Behavior{})
	store := &mapStore{m: map[string][]byte{}}
	settings := probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}}, Store: store, Enrol: 3, EnrolMin: -1}
	first, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := first.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	sink := newSink()
	settings.Sink = sink
	second, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	second.LoadBaselines(t.Context())
	s := second.Statuses()[0]
	if s.Enrolling || s.Status != fleetwatch.DriftOK || s.BaselineCycles != 3 || sink.statuses["b"] != fleetwatch.DriftOK {
		t.Errorf("after a restart, before any cycle: %+v (sink %s), want the stored baseline, ok", s, sink.statuses["b"])
	}
	// a different suite forces enrolment again
	other, err := probes.ParseSuite([]byte(`{"name":"other","prompts":[{"id":"a","kind":"stable","text":"Say hi."}]}`))
	if err != nil {
		t.Fatal(err)
	}
	settings.Suite = other
	third, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	third.LoadBaselines(t.Context())
	if s := third.Statuses()[0]; !s.Enrolling || s.Status != fleetwatch.DriftUnknown {
		t.Errorf("with another suite: %+v, want enrolling", s)
	}
}

// rebaselineOnDrift re-baselines a backend from inside Sink.Alert, as an
// automation might: the Prober must not hold the backend's lock then.
type rebaselineOnDrift struct {
	*recordingSink
	p    *probes.Prober
	done chan fleetwatch.DriftAlert
}

func (s *rebaselineOnDrift) Alert(a fleetwatch.DriftAlert) {
	s.recordingSink.Alert(a)
	if a.Status == fleetwatch.DriftDrifted {
		ra, err := s.p.Rebaseline(context.Background(), a.Pool, a.Backend, "automation")
		if err == nil {
			s.done <- ra
		}
	}
}

func TestSinkMayCallBackIntoTheProber(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	sw := toylm.NewSwitch(ref)
	_, hs := toyServer(t, sw, fakeai.Behavior{})
	sink := &rebaselineOnDrift{recordingSink: newSink(), done: make(chan fleetwatch.DriftAlert, 1)}
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		Sink: sink, Enrol: 3, EnrolMin: -1})
	if err != nil {
		t.Fatal(err)
	}
	sink.p = p
	for range 3 {
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	sw.Set(ref.Swapped(5))
	finished := make(chan error, 1)
	go func() { finished <- p.ProbeBackend(t.Context(), "p", "b") }()
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ProbeBackend did not return: the Sink was called with the backend's lock held")
	}
	if ra := <-sink.done; ra.Status != fleetwatch.DriftUnknown || ra.Previous != fleetwatch.DriftDrifted {
		t.Errorf("re-baseline from the sink: %+v", ra)
	}
}
