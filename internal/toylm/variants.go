package toylm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// calibrationContexts is how many contexts MeasureKL averages over.
const calibrationContexts = 400

// MeasureKL is the mean KL divergence KL(ref || variant) in nats per token,
// over calibrationContexts contexts: seeded prompts followed by 0 to 15
// greedy tokens of the reference. Noise is not applied. ref and variant must
// share their vocabulary and context (variant derived from ref).
func MeasureKL(ref, variant *Model) float64 {
	r := rand.New(rand.NewPCG(0xca1, 0xb4a7e))
	p := make([]float64, ref.vocab)
	q := make([]float64, ref.vocab)
	total := 0.0
	for n := 0; n < calibrationContexts; n++ {
		s := ref.promptState(fmt.Sprintf("calibration prompt %d", r.Uint64()))
		steps := r.IntN(16)
		for range steps {
			ref.logits(s, p)
			ref.advance(&s, argmax(p))
		}
		ref.logits(s, p)
		variant.logits(s, q)
		logSoftmax(p)
		logSoftmax(q)
		kl := 0.0
		for i := range p {
			kl += math.Exp(p[i]) * (p[i] - q[i])
		}
		total += kl
	}
	return total / calibrationContexts
}

// Quantized returns m with per-row uniformly quantized weights whose
// measured KL against m is as close to target as the search finds (within a
// few percent), and that measured KL. The search bisects the relative
// quantization step in log space; KL grows about as the step squared.
func (m *Model) Quantized(target float64) (*Model, float64) {
	lo, hi := math.Log(1e-5), math.Log(1.0)
	var best *Model
	bestKL, bestErr := 0.0, math.Inf(1)
	for range 40 {
		mid := (lo + hi) / 2
		v := m.derive(m.quantizeRows(math.Exp(mid)))
		kl := MeasureKL(m, v)
		if e := math.Abs(math.Log(kl / target)); e < bestErr {
			best, bestKL, bestErr = v, kl, e
		}
		if kl < target {
			lo = mid
		} else {
			hi = mid
		}
		if bestErr < 0.01 {
			break
		}
	}
	return best, bestKL
}

// Mix serves Fraction of requests from Variant and the rest from Base: a
// load balancer in front of two artefacts (partial routing). Which request
// goes where is a seeded function of the call number.
type Mix struct {
	Base, Variant fakeai.Completer
	Fraction      float64
	Seed          uint64

	calls atomic.Uint64
}

// Complete implements fakeai.Completer.
func (x *Mix) Complete(req fakeai.CompletionRequest) fakeai.Completion {
	n := x.calls.Add(1)
	u := rand.New(rand.NewPCG(x.Seed, n)).Float64()
	if u < x.Fraction {
		return x.Variant.Complete(req)
	}
	return x.Base.Complete(req)
}

// Switch serves whatever completer was last Set: a change point in the
// middle of a run (a redeploy behind the same name).
type Switch struct {
	cur atomic.Pointer[completerBox]
}

type completerBox struct{ c fakeai.Completer }

// NewSwitch returns a Switch serving c.
func NewSwitch(c fakeai.Completer) *Switch {
	s := &Switch{}
	s.Set(c)
	return s
}

// Set makes later requests go to c.
func (s *Switch) Set(c fakeai.Completer) { s.cur.Store(&completerBox{c}) }

// Complete implements fakeai.Completer.
func (s *Switch) Complete(req fakeai.CompletionRequest) fakeai.Completion {
	return s.cur.Load().c.Complete(req)
}

// Top1Agreement is the share of calibration contexts where variant's most
// likely token is the reference's (llama.cpp reports 97.7% for Q8_0, 91.9%
// for Q4_K_M).
func Top1Agreement(ref, variant *Model) float64 {
	r := rand.New(rand.NewPCG(0xca1, 0xb4a7e))
	p := make([]float64, ref.vocab)
	q := make([]float64, ref.vocab)
	same := 0
	for range calibrationContexts {
		s := ref.promptState(fmt.Sprintf("calibration prompt %d", r.Uint64()))
		for range r.IntN(16) {
			ref.logits(s, p)
			ref.advance(&s, argmax(p))
		}
		ref.logits(s, p)
		variant.logits(s, q)
		if argmax(p) == argmax(q) {
			same++
		}
	}
	return float64(same) / calibrationContexts
}
