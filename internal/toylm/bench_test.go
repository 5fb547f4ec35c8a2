package toylm

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// BenchmarkComplete is one 20-token greedy completion with top-5 logprobs;
// BenchmarkCompleteNoTop is the same without alternatives (the baseline:
// the model's own cost).
func BenchmarkComplete(b *testing.B) {
	m := New(Config{}).With(Options{Sigma: 0.03})
	req := fakeai.CompletionRequest{Prompt: "user: hello world", MaxTokens: 20, TopLogprobs: 5, Logprobs: true}
	b.ReportAllocs()
	for b.Loop() {
		m.Complete(req)
	}
}

func BenchmarkCompleteNoTop(b *testing.B) {
	m := New(Config{}).With(Options{Sigma: 0.03})
	req := fakeai.CompletionRequest{Prompt: "user: hello world", MaxTokens: 20}
	b.ReportAllocs()
	for b.Loop() {
		m.Complete(req)
	}
}

// BenchmarkHarnessCycle is one probe cycle of the suite against the toy
// model (the sampled prompts and, as serve's default teacher tier wants,
// the fixed texts' teacher-forced scores) plus its evaluation by an
// enrolled Monitor.
func BenchmarkHarnessCycle(b *testing.B) {
	s, err := drift.LoadSuite("")
	if err != nil {
		b.Fatal(err)
	}
	h := &Harness{Suite: s}
	m := h.ref().With(Options{Sigma: 0.03})
	mon := h.monitor("bench")
	if _, err := h.enrol(mon, &backend{c: m, models: []*Model{m}, sigma: 0.03}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := mon.Observe(h.cycle(mon, m, epoch.Add(time.Duration(100+i)*time.Hour)), nil); err != nil {
			b.Fatal(err)
		}
	}
}
