package probes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
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
	"github.com/fleetwatch/fleetwatch/probes/drift"
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

func defaultSuite(t *testing.T) *drift.Suite {
	t.Helper()
	s, err := drift.LoadSuite("")
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
	wantID := drift.Identity{Fingerprint: "fp_toy", ModelIDs: []string{"toy-model"}, ModelRoot: "/models/toy-model", MaxModelLen: 4096,
		Version: "fakeai-1", InfoMeasured: true, Info: map[string]string{
			"vllm:cache_config_info.cache_dtype":       "auto",
			"vllm:model_config_info.dtype":             "bfloat16",
			"vllm:model_config_info.max_model_len":     "4096",
			"vllm:model_config_info.model":             "/models/toy-model",
			"vllm:model_config_info.quantization":      "None",
			"vllm:model_config_info.served_model_name": "toy-model",
		}}
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
	o, err := c.Probe(t.Context(), "fake-model", drift.Prompt{ID: "x", Text: "hello there", MaxTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	if !o.HasLogprobs || len(o.Tokens) != 6 || len(o.Tokens[0].Top) != 5 {
		t.Fatalf("observation %+v: want 6 tokens with 5 alternatives", o)
	}
	for _, tk := range o.Tokens {
		if !slices.IsSortedFunc(tk.Top, func(a, b drift.Alt) int {
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
	p := drift.Prompt{ID: "x", Kind: drift.KindStable, Text: "Say \"hi\"", MaxTokens: 50}
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
		{"500", fail.URL, drift.ErrKindStatus, 500},
		{"hang", hang.URL, drift.ErrKindTimeout, 0},
		{"malformed JSON", bad.URL, drift.ErrKindMalformed, 0},
		{"connection refused", "http://127.0.0.1:1", drift.ErrKindTransport, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := probes.NewClient(probes.Target{URL: tc.url}, nil)
			_, _, err := c.RunCycle(t.Context(), s, time.Now(), 200*time.Millisecond)
			var pe *drift.ProbeError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ProbeError", err)
			}
			if pe.Kind != tc.kind || pe.Status != tc.status {
				t.Errorf("kind %q status %d, want %q %d (%v)", pe.Kind, pe.Status, tc.kind, tc.status, err)
			}
			if tc.kind == drift.ErrKindMalformed && !errors.Is(err, drift.ErrBadResponse) {
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
	if got := len(sink.errs["lost-logprobs"]); got != 2 || !errors.Is(sink.errs["lost-logprobs"][0], drift.ErrNoLogprobs) {
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
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
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
	s := defaultSuite(t)
	if got, want := fs.Stats().Requests-before, int64(2*(len(s.Prompts)+len(s.Teacher))); got != want {
		t.Errorf("%d generation requests, want %d: the fingerprint change runs an extra cycle", got, want)
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
		Sink: sink, Enrol: 4, EnrolMin: -1, Params: drift.Params{Permutations: 199}})
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

// mapStore is a baseline Store in a map, shared between two Probers to
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
	other, err := drift.ParseSuite([]byte(`{"name":"other","prompts":[{"id":"a","kind":"stable","text":"Say hi."}]}`))
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

// TestDriftStateSurvivesARestart: a drifted, quarantined backend is still
// drifted after a restart, before any cycle, with its CUSUM cooldown and
// its last alert; the state was not the baseline's "ok".
func TestDriftStateSurvivesARestart(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	sw := toylm.NewSwitch(ref.With(toylm.Options{Sigma: 0.03}))
	_, hs := toyServer(t, sw, fakeai.Behavior{})
	baselines, states := &mapStore{m: map[string][]byte{}}, &mapStore{m: map[string][]byte{}}
	settings := probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		Store: baselines, States: states, Quarantine: true, Enrol: 3, EnrolMin: -1}
	first, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := first.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	sw.Set(ref.Swapped(7).With(toylm.Options{Sigma: 0.03}))
	if err := first.ProbeBackend(t.Context(), "p", "b"); err != nil {
		t.Fatal(err)
	}
	before := first.Statuses()[0]
	if before.Status != fleetwatch.DriftDrifted || !before.Quarantined || before.Cooldown != 3 || before.LastAlert == nil {
		t.Fatalf("after the swap: %+v, want drifted, quarantined, cooldown 3, with its alert", before)
	}

	sink := newSink()
	settings.Sink = sink
	second, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	second.LoadBaselines(t.Context())
	after := second.Statuses()[0]
	if sink.statuses["b"] != fleetwatch.DriftDrifted {
		t.Errorf("the sink was told %q after the restart, want drifted", sink.statuses["b"])
	}
	if diff := cmp.Diff(keepState(before), keepState(after)); diff != "" {
		t.Errorf("drift state across a restart (-before +after):\n%s", diff)
	}
	if len(sink.alertsFor("b")) != 0 {
		t.Errorf("a restart raised alerts: %+v", sink.alertsFor("b"))
	}
	if !math.IsNaN(after.Z) {
		t.Errorf("S2 z %v after a restart: the statistics are not stored, want NaN (no gauge)", after.Z)
	}

	// Restore reloads on demand (a takeover): the same state, told again.
	sink3 := newSink()
	settings.Sink = sink3
	third, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Restore(t.Context(), []string{"p"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(keepState(before), keepState(third.Statuses()[0])); diff != "" || sink3.statuses["b"] != fleetwatch.DriftDrifted {
		t.Errorf("after Restore (sink told %s), (-before +after):\n%s", sink3.statuses["b"], diff)
	}
	if err := third.Restore(t.Context(), []string{"other-pool"}); err != nil {
		t.Errorf("Restore of a pool without targets: %v", err)
	}
}

// keepState is the part of a status that the drift state carries; the
// last alert is compared as JSON (it went through JSON in the store).
func keepState(s probes.BackendStatus) any {
	alert, _ := json.Marshal(s.LastAlert)
	return struct {
		Status, Baseline, Peers fleetwatch.DriftStatus
		Since                   time.Time
		CUSUM, Score, Threshold float64
		Cooldown                int
		Quarantined, Pending    bool
		BaselineCreated         time.Time
		LastAlert               string
	}{s.Status, s.Baseline, s.Peers, s.Since, s.CUSUM, s.Score, s.Threshold, s.Cooldown, s.Quarantined, s.IdentityPending,
		s.BaselineCreated, string(alert)}
}

// TestCUSUMContinuesAcrossARestart: two Probers watch the same noiseless
// backend through a q8-like change, one of them restarted (from its stored
// state) right after the change. Every cycle after that they must agree:
// status, CUSUM, cooldown, score, alerts. A restart that forgot the CUSUM,
// the cooldown or the previous cycle (S4 needs it) would lag behind.
func TestCUSUMContinuesAcrossARestart(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	ref := toylm.New(toylm.Config{})
	q8, _ := ref.Quantized(toylm.KLQ8)
	noise := toylm.Options{Sigma: 0.003, NoiseSeed: 1}
	// Each Prober has its own backend with the same noise stream: both
	// see the same answers when they ask the same questions in order.
	serve := func() (*toylm.Switch, string) {
		sw := toylm.NewSwitch(ref.With(noise))
		_, hs := toyServer(t, sw, fakeai.Behavior{})
		return sw, hs.URL
	}
	twinSwitch, twinURL := serve()
	sw, url := serve()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	settings := func(url string, states probes.Store, sink probes.Sink) probes.Settings {
		return probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: url}},
			Store: &mapStore{m: map[string][]byte{}}, States: states, Sink: sink, Enrol: 8, EnrolMin: -1, Now: clock}
	}
	states := &mapStore{m: map[string][]byte{}}
	twinSink, restartedSink := newSink(), newSink()
	twin, err := probes.New(settings(twinURL, &mapStore{m: map[string][]byte{}}, twinSink))
	if err != nil {
		t.Fatal(err)
	}
	firstSettings := settings(url, states, newSink())
	first, err := probes.New(firstSettings)
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(ps ...*probes.Prober) {
		t.Helper()
		now = now.Add(5 * time.Minute)
		for _, p := range ps {
			if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 9 { // enrolment, then one judged cycle
		cycle(twin, first)
	}
	twinSwitch.Set(q8.With(noise))
	sw.Set(q8.With(noise))
	cycle(twin, first)
	// restart "first" on its stores: same baseline store, same states
	restartedSettings := firstSettings
	restartedSettings.Sink = restartedSink
	restarted, err := probes.New(restartedSettings)
	if err != nil {
		t.Fatal(err)
	}
	restarted.LoadBaselines(t.Context())
	sawAlarm := false
	for i := range 8 {
		cycle(twin, restarted)
		want, got := twin.Statuses()[0], restarted.Statuses()[0]
		sawAlarm = sawAlarm || want.Status != fleetwatch.DriftOK
		if diff := cmp.Diff(keepState(want), keepState(got)); diff != "" {
			t.Fatalf("cycle %d after the restart (-never restarted +restarted):\n%s", i+1, diff)
		}
	}
	if !sawAlarm {
		t.Fatal("the q8-like change never left ok: the test proves nothing")
	}
	if w, g := len(twinSink.alertsFor("b")), len(restartedSink.alertsFor("b")); w == 0 || g == 0 {
		t.Errorf("alerts: %d without restart, %d after it", w, g)
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

// ctxStore is a mapStore that, like a KV put, fails once its context is
// done.
type ctxStore struct{ mapStore }

func (s *ctxStore) Save(ctx context.Context, pool, backend string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.mapStore.Save(ctx, pool, backend, data)
}

// cancelOnAlert cancels the probe's context when the alert comes: a
// shutdown right after a verdict.
type cancelOnAlert struct {
	*recordingSink
	cancel context.CancelFunc
}

func (s *cancelOnAlert) Alert(a fleetwatch.DriftAlert) {
	s.recordingSink.Alert(a)
	s.cancel()
}

// TestStateSavedAtShutdown: the verdict of a cycle whose context is
// canceled right after it (serve stopping) is still stored.
func TestStateSavedAtShutdown(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	sw := toylm.NewSwitch(ref)
	_, hs := toyServer(t, sw, fakeai.Behavior{})
	states := &ctxStore{mapStore{m: map[string][]byte{}}}
	ctx, cancel := context.WithCancel(t.Context())
	sink := &cancelOnAlert{recordingSink: newSink(), cancel: cancel}
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		States: states, Sink: sink, Enrol: 3, EnrolMin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := p.ProbeBackend(ctx, "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	sw.Set(ref.Swapped(3))
	if err := p.ProbeBackend(ctx, "p", "b"); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Fatal("no alert canceled the context: the test proves nothing")
	}
	data, err := states.Load(t.Context(), "p", "b")
	if err != nil {
		t.Fatal(err)
	}
	st, err := drift.UnmarshalState(data)
	if err != nil || st.Status != fleetwatch.DriftDrifted {
		t.Errorf("stored state %+v (%v), want drifted", st, err)
	}
}
