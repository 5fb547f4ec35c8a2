package toylm

import (
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// TestCalibrationByMeasuredKL is the calibration of the variants: each
// quantization-like variant's KL against the reference, measured, is within
// 5% of its target; fp16 rounding is about zero and a swap is far.
func TestCalibrationByMeasuredKL(t *testing.T) {
	statistical(t)
	ref := New(Config{})
	for _, target := range calibrationTargets {
		v, kl := ref.Quantized(target)
		if again := MeasureKL(ref, v); again != kl {
			t.Errorf("target %g: reported KL %g, measured again %g", target, kl, again)
		}
		if math.Abs(kl/target-1) > 0.05 {
			t.Errorf("target %g: measured KL %g", target, kl)
		}
		t.Logf("target KL %g: measured %.5f nats/token, greedy top-1 agreement %.3f", target, kl, Top1Agreement(ref, v))
	}
	if kl := MeasureKL(ref, ref.FP16()); kl > 1e-5 {
		t.Errorf("fp16 KL %g, want about 0", kl)
	}
	if kl := MeasureKL(ref, ref.Swapped(2)); kl < 1 {
		t.Errorf("swap KL %g, want large", kl)
	}
	if kl := MeasureKL(ref, ref); kl != 0 {
		t.Errorf("KL of the reference against itself %g", kl)
	}
}

func TestVocabularyIsUnique(t *testing.T) {
	for _, n := range []int{128, 256, 512} {
		seen := map[string]bool{}
		for i, s := range renderVocab(n) {
			if i != eos && (s == "" || seen[s]) {
				t.Fatalf("vocab %d: token %d %q empty or repeated", n, i, s)
			}
			seen[s] = true
		}
	}
}

func TestGreedyIsDeterministicWithoutNoise(t *testing.T) {
	m := New(Config{Vocab: 128, Hidden: 16})
	req := fakeai.CompletionRequest{Prompt: "user: hello", MaxTokens: 12, TopLogprobs: 5}
	a, b := m.Complete(req), m.Complete(req)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("two greedy calls differ (-first +second):\n%s", diff)
	}
	if len(a.Tokens) == 0 || len(a.Tokens[0].Top) != 5 || a.Tokens[0].Top[0].Token != a.Tokens[0].Token {
		t.Fatalf("completion %+v: want the greedy token first among 5 alternatives", a)
	}
	text := ""
	for i, tk := range a.Tokens {
		text += tk.Token
		if i > 0 && tk.Logprob > 0 {
			t.Errorf("positive logprob %v", tk.Logprob)
		}
	}
	if text != a.Text || a.CompletionTokens != len(a.Tokens) {
		t.Errorf("text %q is not the concatenation %q", a.Text, text)
	}
}

func TestNoiseIsSeededPerCall(t *testing.T) {
	req := fakeai.CompletionRequest{Prompt: "user: hello", MaxTokens: 8, TopLogprobs: 1}
	a := New(Config{}).With(Options{Sigma: 0.1, NoiseSeed: 4})
	b := New(Config{}).With(Options{Sigma: 0.1, NoiseSeed: 4})
	a1, b1 := a.Complete(req), b.Complete(req)
	if diff := cmp.Diff(a1, b1); diff != "" {
		t.Errorf("same seed, same call number: differ (-a +b):\n%s", diff)
	}
	if a2 := a.Complete(req); a2.Tokens[0].Logprob == a1.Tokens[0].Logprob {
		t.Error("the second call repeated the first call's noise")
	}
	a.SetSigma(0)
	if a.Sigma() != 0 {
		t.Errorf("Sigma after SetSigma(0) = %v", a.Sigma())
	}
}

func TestMixServesTheFraction(t *testing.T) {
	ref := New(Config{})
	mix := &Mix{Base: ref, Variant: ref.Swapped(5), Fraction: 0.25, Seed: 1}
	want := ref.Complete(fakeai.CompletionRequest{Prompt: "p", MaxTokens: 4}).Text
	variant := 0
	const n = 2000
	for range n {
		if mix.Complete(fakeai.CompletionRequest{Prompt: "p", MaxTokens: 4}).Text != want {
			variant++
		}
	}
	if f := float64(variant) / n; math.Abs(f-0.25) > 0.04 {
		t.Errorf("variant share %.3f, want 0.25", f)
	}
}

func TestSwitchChangesTheServedModel(t *testing.T) {
	ref := New(Config{})
	sw := NewSwitch(ref)
	req := fakeai.CompletionRequest{Prompt: "p", MaxTokens: 6}
	before := sw.Complete(req).Text
	sw.Set(ref.Swapped(3))
	if sw.Complete(req).Text == before {
		t.Error("Set did not change the output")
	}
}

func TestNoLogprobsAndFingerprintPassThrough(t *testing.T) {
	c := New(Config{}).With(Options{NoLogprobs: true, Fingerprint: "fp_x", PromptOverhead: 3}).
		Complete(fakeai.CompletionRequest{Prompt: "one two", MaxTokens: 2})
	if !c.NoLogprobs || c.Fingerprint != "fp_x" || c.PromptTokens != 5 {
		t.Errorf("completion %+v: want NoLogprobs, fp_x and 2+3 prompt tokens", c)
	}
}

func TestTopKMatchesASort(t *testing.T) {
	m := New(Config{Vocab: 128, Hidden: 16})
	lp := make([]float64, 128)
	for i := range lp {
		lp[i] = -float64((i*37)%128) / 10 // a permutation, with no ties
	}
	lp[5], lp[9] = 0.5, 0.5 // one tie: lower id first
	got := m.topK(lp, 6)
	want := []fakeai.TopLogprob{
		{Token: m.tokens[5], Logprob: 0.5}, {Token: m.tokens[9], Logprob: 0.5},
		{Token: m.tokens[0], Logprob: 0}, {Token: m.tokens[45], Logprob: -0.1},
		{Token: m.tokens[90], Logprob: -0.2}, {Token: m.tokens[7], Logprob: -0.3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("topK (-want +got):\n%s", diff)
	}
}

// The logit cache gives the bits the product gives: the same completions,
// noise and sampling included, from a model whose cache is warm and from
// one that computes every context afresh.
func TestLogitCacheChangesNothing(t *testing.T) {
	m := New(Config{}).With(Options{Sigma: 0.05, NoiseSeed: 3})
	for _, temp := range []float64{0, 0.7} {
		for i := range 6 {
			req := fakeai.CompletionRequest{Prompt: fmt.Sprintf("prompt %d", i%3), MaxTokens: 12, TopLogprobs: 5, Temperature: temp}
			warm := m.Complete(req)
			fresh := m.derive(m.weights) // its own empty cache
			fresh.calls.Store(m.calls.Load() - 1)
			if diff := cmp.Diff(warm, fresh.Complete(req)); diff != "" {
				t.Fatalf("temperature %g, call %d (-cached +fresh):\n%s", temp, i, diff)
			}
		}
	}
}
