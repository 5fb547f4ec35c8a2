package probes_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func toolSuite(t *testing.T) *drift.Suite {
	t.Helper()
	s, err := drift.LoadSuite("default-v1+tools-v1")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The reference fake answers every tool prompt of tools-v1 right over real
// HTTP: the call when one is expected, with valid arguments, and no call
// otherwise.
func TestToolCycleOverHTTP(t *testing.T) {
	s := toolSuite(t)
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 1})
	_, hs := toyServer(t, m, fakeai.Behavior{Model: "toy-model"})
	c := probes.NewClient(probes.Target{Pool: "p", Backend: "b", URL: hs.URL}, nil)
	cy, _, err := c.RunCycle(t.Context(), s, time.Unix(0, 0), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(cy.Obs) != len(s.Prompts) || len(cy.Tools) != len(s.Tools.Prompts) {
		t.Fatalf("%d text and %d tool observations, want %d and %d", len(cy.Obs), len(cy.Tools), len(s.Prompts), len(s.Tools.Prompts))
	}
	for _, o := range cy.Tools {
		if !o.Correct {
			t.Errorf("%s: %+v", o.Prompt, o)
		}
		if o.Expect != "" && (o.Calls != 1 || o.Name != o.Expect) {
			t.Errorf("%s: %d calls of %q, want one of %s", o.Prompt, o.Calls, o.Name, o.Expect)
		}
	}
	c0 := drift.CountTools(cy.Tools)
	want := drift.ToolCounts{ShouldCall: 40, Called: 40, RightName: 40, ArgsParse: 40, ArgsValid: 40, ShouldNotCall: 8, NoCall: 8}
	if c0 != want {
		t.Errorf("counts %+v, want %+v", c0, want)
	}
}

// A backend that breaks half of its tool calls after enrolment is caught by
// the scheduled cycles, with the tool-call evidence in the alert.
func TestProberCatchesBrokenToolCallsOverHTTP(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	s := toolSuite(t)
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 2})
	fs, hs := toyServer(t, m, fakeai.Behavior{})
	sink := newSink()
	clock := &fakeClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	p := newProber(t, hs.URL, probes.Settings{Suite: s, Sink: sink, Enrol: 4, Now: clock.Now})
	probeTimes(t, p, 6)
	if st := p.Statuses()[0]; st.Enrolling || st.Status != fleetwatch.DriftOK {
		t.Fatalf("after enrolment: %+v", st)
	}
	fs.SetToolModel(&fakeai.ToolModel{Break: 0.5, Modes: []string{fakeai.BreakMissingRequired}, Seed: 5})
	probeTimes(t, p, 2)
	alerts := sink.alertsFor("b")
	if len(alerts) == 0 {
		t.Fatalf("no alert after 2 cycles breaking half the tool calls; status %+v", p.Statuses()[0])
	}
	a := alerts[0]
	if a.Previous != fleetwatch.DriftOK || (a.Status != fleetwatch.DriftSuspect && a.Status != fleetwatch.DriftDrifted) {
		t.Errorf("alert %s -> %s, want ok -> suspect or drifted", a.Previous, a.Status)
	}
	if !strings.Contains(a.Reason, "tool calls") || !strings.Contains(a.Reason, "missing required field") {
		t.Errorf("reason %q lacks the tool-call evidence", a.Reason)
	}
	ev, ok := a.Evidence.Extra["tool_calls"].(map[string]any)
	if !ok {
		t.Fatalf("evidence %+v lacks tool_calls", a.Evidence.Extra)
	}
	if before, after := ev["valid_call_rate_before"].(float64), ev["valid_call_rate_after"].(float64); before != 1 || after > 0.8 {
		t.Errorf("valid-call rate %v -> %v, want 1 -> at most 0.8", before, after)
	}
	bad, ok := ev["bad_call"].(*drift.ToolObservation)
	if !ok || bad.Correct || !bad.ArgsParse || bad.ArgsValid || !strings.Contains(bad.Problem, "missing required field") {
		t.Errorf("bad call %+v", ev["bad_call"])
	}
}

// A backend that answers requests with tools 400 (vLLM without
// --enable-auto-tool-choice) enrols without a tool tier: no probe error,
// no verdict.
func TestBackendWithoutToolsIsNotJudgedOnThem(t *testing.T) {
	s := toolSuite(t)
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 3})
	fs := fakeai.New(fakeai.Settings{Completer: m})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"tools"`)) {
			http.Error(w, `{"error":{"message":"auto tool choice requires --enable-auto-tool-choice"}}`, http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fs.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	sink := newSink()
	clock := &fakeClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	p := newProber(t, hs.URL, probes.Settings{Suite: s, Sink: sink, Enrol: 4, Now: clock.Now})
	probeTimes(t, p, 8)
	st := p.Statuses()[0]
	if st.Enrolling || st.Status != fleetwatch.DriftOK || st.Errors != 0 {
		t.Errorf("status %+v, want ok without errors", st)
	}
	if a := sink.alertsFor("b"); len(a) != 0 {
		t.Errorf("alerts %+v, want none", a)
	}
}

// newProber returns a Prober of the one target p/b at url, with s's other
// settings.
func newProber(t *testing.T, url string, s probes.Settings) *probes.Prober {
	t.Helper()
	s.Targets = []probes.Target{{Pool: "p", Backend: "b", URL: url}}
	p, err := probes.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// probeTimes runs n probe cycles of p/b.
func probeTimes(t *testing.T, p *probes.Prober, n int) {
	t.Helper()
	for range n {
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
}
