package probes_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// The default suite's fixed texts are scored over HTTP exactly as the toy
// model scores them in process (the harness's path).
func TestTeacherScoresOverHTTPMatchTheModel(t *testing.T) {
	m := toylm.New(toylm.Config{})
	_, hs := toyServer(t, m, fakeai.Behavior{Model: "toy"})
	s := defaultSuite(t)
	if len(s.Teacher) < 8 {
		t.Fatalf("default suite has %d teacher texts, want 8 or more", len(s.Teacher))
	}
	c := probes.NewClient(probes.Target{Pool: "p", Backend: "b", URL: hs.URL}, nil)
	got, err := c.ScoreTexts(t.Context(), "toy", s.Teacher, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := toylm.TeacherScores(s, m)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scores over HTTP (-in process +over HTTP):\n%s", diff)
	}
	for i, o := range got {
		if words := len(strings.Fields(s.Teacher[i].Text)); len(o.Tokens) != words-1 || o.PromptTokens != words {
			t.Errorf("%s: %d scored tokens of %d prompt tokens, want %d of %d", o.Prompt, len(o.Tokens), o.PromptTokens, words-1, words)
		}
	}
}

// enrolTeacher enrols one backend served by c and returns the prober and
// the fake server.
func enrolTeacher(t *testing.T, c fakeai.Completer, store *mapStore) (*probes.Prober, *fakeai.Server, *recordingSink) {
	t.Helper()
	fs, hs := toyServer(t, c, fakeai.Behavior{})
	sink := newSink()
	p := newProber(t, hs.URL, probes.Settings{Sink: sink, Store: store, Enrol: 4, EnrolMin: -1})
	probeTimes(t, p, 4)
	if s := p.Statuses()[0]; s.Enrolling || s.Status != fleetwatch.DriftOK {
		t.Fatalf("after enrolment: %+v", s)
	}
	return p, fs, sink
}

func storedBaseline(t *testing.T, store *mapStore) *drift.Baseline {
	t.Helper()
	data, err := store.Load(t.Context(), "p", "b")
	if err != nil {
		t.Fatal(err)
	}
	b, err := drift.UnmarshalBaseline(data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A backend that scores prompts enrols a teacher tier; a later change is
// judged on it too, and the alert carries its figures.
func TestProberEnrolsTeacherTierAndJudgesIt(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	ref := toylm.New(toylm.Config{})
	q6, _ := ref.Quantized(toylm.KLQ6)
	o := toylm.Options{Sigma: 0.03, NoiseSeed: 5}
	sw := toylm.NewSwitch(ref.With(o))
	store := &mapStore{m: map[string][]byte{}}
	p, fs, sink := enrolTeacher(t, sw, store)
	if s := p.Statuses()[0]; !s.Caps.PromptLogprobs {
		t.Errorf("capabilities %+v: want prompt logprobs seen", s.Caps)
	}
	b := storedBaseline(t, store)
	s := defaultSuite(t)
	if b.Teacher == nil || len(b.Teacher.Prompts) != len(s.Teacher) || b.Teacher.Null.S2.Sigma == 0 {
		t.Fatalf("stored baseline's teacher tier %+v, want one per text with a null", b.Teacher)
	}
	for _, pb := range b.Teacher.Prompts {
		if len(pb.Samples) != 0 || len(pb.Positions) == 0 || pb.Positions[0].Var <= 0 {
			t.Errorf("teacher text %s: %d samples, %d positions: want no samples and positions with a variance", pb.ID, len(pb.Samples), len(pb.Positions))
		}
	}
	before := fs.Stats().Requests
	sw.Set(q6.With(o))
	var drifted *fleetwatch.DriftAlert
	for range 6 {
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
		for _, a := range sink.alertsFor("b") {
			if a.Status == fleetwatch.DriftDrifted {
				drifted = &a
			}
		}
		if drifted != nil {
			break
		}
	}
	if drifted == nil {
		t.Fatalf("q6-like at sigma 0.03 not drifted within 6 cycles: %+v", sink.alertsFor("b"))
	}
	for _, k := range []string{"teacher_s2", "teacher_t4", "teacher_persistent_shift", "teacher_cusum", "teacher_positions"} {
		if _, ok := drifted.Evidence.Extra[k]; !ok {
			t.Errorf("evidence lacks %s: %v", k, drifted.Evidence.Extra)
		}
	}
	if n := fs.Stats().Requests - before; n%int64(len(s.Prompts)+len(s.Teacher)) != 0 {
		t.Errorf("%d requests: not whole cycles of %d prompts and %d texts", n, len(s.Prompts), len(s.Teacher))
	}
}

// echoIgnorer serves h but drops "echo" from every request, like a server
// that ignores the parameter: the answer is an ordinary completion.
func echoIgnorer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		var body map[string]any
		if json.Unmarshal(data, &body) == nil {
			delete(body, "echo")
			data, _ = json.Marshal(body)
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
		r.ContentLength = int64(len(data))
		h.ServeHTTP(w, r)
	})
}

// Backends that do not score prompts (a 400, or echo ignored) enrol on the
// sampled probes alone: no error, no teacher tier, and no scoring requests
// once they are known not to score.
func TestProberFallsBackToSampledProbes(t *testing.T) {
	s := defaultSuite(t)
	ref := toylm.New(toylm.Config{})
	for name, c := range map[string]fakeai.Completer{
		"400 from a backend without prompt logprobs": ref.With(toylm.Options{NoPromptLogprobs: true}),
		"400 from the echo completer":                fakeai.Echo{},
	} {
		t.Run(name, func(t *testing.T) {
			store := &mapStore{m: map[string][]byte{}}
			p, fs, sink := enrolTeacher(t, c, store)
			if b := storedBaseline(t, store); b.Teacher != nil {
				t.Errorf("baseline has a teacher tier")
			}
			if st := p.Statuses()[0]; st.Caps.PromptLogprobs || st.Errors != 0 || len(sink.errs["b"]) != 0 {
				t.Errorf("status %+v, errors %v: want no prompt logprobs and no errors", st, sink.errs["b"])
			}
			// the first enrolment cycle tried one text; none since
			if got, want := fs.Stats().BadRequests, int64(1); got != want {
				t.Errorf("%d refused scoring requests, want %d", got, want)
			}
			before := fs.Stats().Requests
			if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
				t.Fatal(err)
			}
			if got := fs.Stats().Requests - before; got != int64(len(s.Prompts)) {
				t.Errorf("%d requests in a judged cycle, want the %d prompts alone", got, len(s.Prompts))
			}
		})
	}
	t.Run("echo ignored", func(t *testing.T) {
		fs := fakeai.New(fakeai.Settings{Completer: ref})
		hs := httptest.NewServer(echoIgnorer(fs))
		t.Cleanup(hs.Close)
		c := probes.NewClient(probes.Target{Pool: "p", Backend: "b", URL: hs.URL}, nil)
		_, err := c.Score(t.Context(), "fake-model", s.Teacher[0])
		if !errors.Is(err, drift.ErrNoPromptLogprobs) || drift.ErrorKind(err) != drift.ErrKindNoPromptLogprobs {
			t.Errorf("score from a server ignoring echo: %v, want ErrNoPromptLogprobs", err)
		}
	})
}

// A backend enrolled with teacher scores that stops giving them fails its
// cycles with a probe error, never a verdict.
func TestLostPromptLogprobsIsAProbeError(t *testing.T) {
	ref := toylm.New(toylm.Config{})
	sw := toylm.NewSwitch(ref)
	p, _, sink := enrolTeacher(t, sw, &mapStore{m: map[string][]byte{}})
	sw.Set(ref.With(toylm.Options{NoPromptLogprobs: true}))
	err := p.ProbeBackend(t.Context(), "p", "b")
	if !errors.Is(err, drift.ErrNoPromptLogprobs) {
		t.Fatalf("cycle error %v, want ErrNoPromptLogprobs", err)
	}
	st := p.Statuses()[0]
	if st.LastErrorKind != drift.ErrKindNoPromptLogprobs || st.Status != fleetwatch.DriftOK || len(sink.alertsFor("b")) != 0 {
		t.Errorf("status %+v alerts %v: want a %s probe error and no verdict", st, sink.alertsFor("b"), drift.ErrKindNoPromptLogprobs)
	}
}

func TestTeacherRequestBodyIsCanonical(t *testing.T) {
	got := string(probes.TeacherRequestBody("m", "a b"))
	want := `{"model":"m","prompt":"a b","temperature":0,"max_tokens":1,"echo":true,"logprobs":1,"seed":1}`
	if got != want {
		t.Errorf("body %s, want %s", got, want)
	}
}

func TestSuiteTeacherSection(t *testing.T) {
	base := `{"name":"s","prompts":[{"id":"a","kind":"stable","text":"x"}]`
	tests := []struct {
		name, teacher string
		ok            bool
	}{
		{"none", ``, true},
		{"two texts", `,"teacher":[{"id":"t1","text":"one two"},{"id":"t2","text":"three four five"}]`, true},
		{"repeated id", `,"teacher":[{"id":"t1","text":"one two"},{"id":"t1","text":"three four"}]`, false},
		{"empty id", `,"teacher":[{"id":"","text":"one two"}]`, false},
		{"one word", `,"teacher":[{"id":"t1","text":"one"}]`, false},
		{"too long", `,"teacher":[{"id":"t1","text":"` + strings.Repeat("ab ", 2000) + `"}]`, false},
		{"unknown field", `,"teacher":[{"id":"t1","text":"one two","x":1}]`, false},
	}
	for _, tt := range tests {
		s, err := drift.ParseSuite([]byte(base + tt.teacher + `}`))
		if tt.ok != (err == nil) {
			t.Errorf("%s: error %v, want ok %v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, drift.ErrSuite) {
			t.Errorf("%s: error %v is not ErrSuite", tt.name, err)
		}
		if tt.name == "two texts" && err == nil {
			plain, _ := drift.ParseSuite([]byte(base + `}`))
			if s.Hash == plain.Hash {
				t.Errorf("teacher texts do not change the suite's hash")
			}
		}
	}
}
