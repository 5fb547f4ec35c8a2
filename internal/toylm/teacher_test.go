package toylm

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func TestScorePrompt(t *testing.T) {
	ref := New(Config{})
	req := fakeai.CompletionRequest{Prompt: "the quick brown fox jumps over the lazy dog", TopLogprobs: 3}
	a, ok := ref.ScorePrompt(req)
	if !ok || len(a) != 9 {
		t.Fatalf("%d tokens (ok %v), want 9", len(a), ok)
	}
	if a[0].Token != "the" || a[1].Token != " quick" || a[0].Logprob != 0 || a[0].Top != nil {
		t.Errorf("first tokens %+v: want the words, the first one unscored", a[:2])
	}
	for _, tok := range a[1:] {
		if tok.Logprob >= 0 || len(tok.Top) != 3 || tok.Top[0].Logprob < tok.Logprob {
			t.Errorf("token %+v: want a negative logprob under its top-3", tok)
		}
	}
	b, _ := ref.ScorePrompt(req)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("noiseless scores differ between calls:\n%s", diff)
	}
	// the text's own tokens are fed back: a swapped model scores the same
	// tokens, differently
	sw, _ := ref.Swapped(5).ScorePrompt(req)
	same := 0
	for i := 1; i < len(a); i++ {
		if sw[i].Token != a[i].Token {
			t.Fatalf("swapped model scored token %q at %d, want %q", sw[i].Token, i, a[i].Token)
		}
		if sw[i].Logprob == a[i].Logprob {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d of %d logprobs unchanged by a swap", same, len(a)-1)
	}
	// fp16 rounding moves them by far less than 0.01 nats
	fp, _ := ref.FP16().ScorePrompt(req)
	for i := 1; i < len(a); i++ {
		if d := math.Abs(fp[i].Logprob - a[i].Logprob); d > 0.01 {
			t.Errorf("fp16 moved token %d by %.4f nats", i, d)
		}
	}
	for name, m := range map[string]*Model{
		"no prompt logprobs": ref.With(Options{NoPromptLogprobs: true}),
		"no logprobs":        ref.With(Options{NoLogprobs: true}),
	} {
		if _, ok := m.ScorePrompt(req); ok {
			t.Errorf("%s: scored", name)
		}
	}
}

func TestTeacherScoresFollowSwitchAndMix(t *testing.T) {
	s, err := drift.LoadSuite("")
	if err != nil {
		t.Fatal(err)
	}
	ref := New(Config{})
	want := TeacherScores(s, ref)
	if len(want) != len(s.Teacher) {
		t.Fatalf("%d scores for %d texts", len(want), len(s.Teacher))
	}
	if diff := cmp.Diff(want, TeacherScores(s, NewSwitch(ref))); diff != "" {
		t.Errorf("through a Switch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, TeacherScores(s, &Mix{Base: ref, Variant: ref.Swapped(3), Fraction: 0})); diff != "" {
		t.Errorf("through a Mix that never routes to the variant (-want +got):\n%s", diff)
	}
	if got := TeacherScores(s, ref.With(Options{NoPromptLogprobs: true})); got != nil {
		t.Errorf("a model without prompt logprobs gave %d scores", len(got))
	}
	if got := TeacherScores(s, fakeai.Echo{}); got != nil {
		t.Errorf("a completer that does not score gave %d scores", len(got))
	}
}

func TestTierMode(t *testing.T) {
	for tier, want := range map[string]drift.TeacherMode{"": drift.TeacherOnly, "both": drift.TeacherBoth,
		"teacher": drift.TeacherOnly, "sampled": drift.TeacherOff} {
		if got, err := TierMode(tier); err != nil || got != want {
			t.Errorf("TierMode(%q) = %q, %v; want %q", tier, got, err, want)
		}
	}
	if _, err := TierMode("logits"); err == nil {
		t.Error("an unknown tier was accepted")
	}
}

// The requirement of docs/DRIFT.md "Teacher-forced probes", seeded and
// short: q8-like at sigma 0.1 leaves ok within 10 cycles on the teacher
// tier alone (the sampled probes alone take 8 cycles in the median and
// miss 7 of 50 trials), and reaches drifted.
func TestTeacherQ8CaughtWithinTenCyclesAtSigma01(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := teacherHarness(t)
	// no gross rule: with one sampled prompt S3 is one noisy position and
	// would catch q8-like at once; the teacher CUSUM must do it alone
	h.Params.GrossZ = math.Inf(1)
	r, err := h.Power(vs["q8-like"], 0.1, 2, 10, 21)
	if err != nil {
		t.Fatal(err)
	}
	if r.Within(10) != r.Trials || r.DriftedWithin(10) != r.Trials || r.SuspectDelay[0] < 2 {
		t.Errorf("q8-like at sigma 0.1: left ok within 10 cycles in %d of %d trials, drifted in %d (%v, %v)",
			r.Within(10), r.Trials, r.DriftedWithin(10), r.SuspectDelay, r.DriftedDelay)
	}
}

// Unchanged and fp16-rounded backends stay ok on the teacher tier, at a
// fixed noise level and in the load regime.
// teacherNullLevels are the noise levels TestTeacherNullStaysOK runs.
var teacherNullLevels = []float64{0.1, LoadRegime}

func TestTeacherNullStaysOK(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := teacherHarness(t)
	fp16 := vs["fp16"]
	for _, sigma := range teacherNullLevels {
		for _, v := range []*Variant{nil, &fp16} {
			r, err := h.Null(sigma, v, 1, nullCycles/2, 22)
			if err != nil {
				t.Fatal(err)
			}
			if r.Alarms != 0 || r.Gross != 0 {
				t.Errorf("sigma %s, fp16 %v: %d alarms and %d gross signals in %d cycles", SigmaName(sigma), v != nil, r.Alarms, r.Gross, r.Cycles)
			}
		}
	}
}

// teacherHarness is testHarness on the teacher tier, with the default
// suite's fixed texts and one sampled prompt: the teacher tier decides
// subtle changes, and the other 15 prompts would only slow the toy model
// (tenfold under the race detector).
func teacherHarness(t *testing.T) (*Harness, map[string]Variant) {
	t.Helper()
	h, vs := testHarness(t)
	s := *h.Suite
	s.Prompts = s.Prompts[:1]
	s.Hash += "-one-prompt"
	h.Suite, h.Teacher = &s, drift.TeacherOnly
	return h, vs
}
