// Package toylm is a seeded toy language model used to keep fleetwatch's drift
// detection honest (docs/DRIFT.md "The honest test harness").
//
// The model has a vocabulary of 128 to 512 short string tokens and a hidden
// state of 16 to 64 dimensions. The hidden state is a deterministic function
// of the context (a seeded vector for the prompt, then a fixed recurrence over
// the generated tokens), and the logits are a weight matrix times that state.
// Decoding is greedy at temperature 0. Because the hidden state does not
// depend on the weights, a variant that changes only the weights changes the
// output distribution exactly as a different quantization of the same model
// would: same contexts, slightly different logits.
//
// Variants are calibrated by measured KL divergence against the reference
// (MeasureKL), never by bit count: Quantized searches the quantization step
// that gives a target mean KL per token, the way llama.cpp reports its
// quantizations (Q8_0 about 0.001, Q6_K about 0.005, Q4_K_M about 0.03 to 0.04
// nats against FP16). Swapped draws new weights (a different model behind the
// same name), FP16 rounds the weights to half precision (which must never be
// reported as drift), Mix serves a fraction of requests from a variant and
// Switch changes the served model at a point in time. Run-to-run noise is
// Gaussian noise on every logit of every call with a settable sigma.
//
// *Model implements fakeai.Completer, so the fake OpenAI-compatible server
// serves its tokens and top-k logprobs over real HTTP.
package toylm

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// Target KL divergences (nats per token) of the quantization-like variants,
// from llama.cpp's measurements of Llama-3-8B against FP16.
const (
	KLQ8 = 0.001
	KLQ6 = 0.005
	KLQ4 = 0.04
)

// eos is the token id that ends a completion with finish reason "stop".
const eos = 0

// Config describes a reference model. The zero value works.
type Config struct {
	// Vocab is the vocabulary size, 128 to 512. If zero, 256 is used.
	Vocab int
	// Hidden is the hidden state size, 16 to 64. If zero, 32 is used.
	Hidden int
	// WeightSeed seeds the weight matrix. If zero, 1 is used.
	WeightSeed uint64
	// ContextSeed seeds the hidden-state recurrence, shared by all variants
	// of a model. If zero, 7 is used.
	ContextSeed uint64
	// Scale multiplies the logits; larger is more confident. If zero, 3.5
	// is used.
	Scale float64
}

// Options are the serving properties of a model that are not its weights.
type Options struct {
	// Sigma is the standard deviation of the Gaussian noise added to every
	// logit of every call (run-to-run nondeterminism). Zero: none.
	Sigma float64
	// NoiseSeed seeds the noise; calls are numbered, so a run is
	// reproducible when calls are made in the same order.
	NoiseSeed uint64
	// Fingerprint is reported as system_fingerprint ("" omits it).
	Fingerprint string
	// NoLogprobs makes the fake server omit logprobs.
	NoLogprobs bool
	// NoPromptLogprobs makes the model decline to score prompts (the fake
	// server answers echo requests 400): a backend without prompt
	// logprobs (teacher.go).
	NoPromptLogprobs bool
	// PromptOverhead is added to the prompt token count, like a chat
	// template's tokens. A different value mimics a different tokenizer or
	// template.
	PromptOverhead int
	// PathOffsets are the fixed logit offsets of the backend's numeric
	// paths (kernel choices by batch shape), one vector over the vocabulary
	// per path; SetPath chooses the one later calls add (none by default).
	PathOffsets [][]float64
}

// Model is a toy language model. It is safe for concurrent use.
type Model struct {
	vocab, hidden int
	scale         float64
	contextSeed   uint64
	weights       []float64 // vocab x hidden, row-major
	embed         []float64 // vocab x hidden, the recurrence's token inputs
	tokens        []string
	opts          Options

	cache *logitCache // shared by the copies With makes (same weights)

	sigmaBits atomic.Uint64 // float64 bits of the current noise sigma
	calls     atomic.Uint64 // numbers calls for the noise stream
	path      atomic.Int64  // 1 + the index of the current numeric path (0: none)
}

// New builds the reference model of c.
func New(c Config) *Model {
	if c.Vocab == 0 {
		c.Vocab = 256
	}
	c.Vocab = min(max(c.Vocab, 128), 512)
	if c.Hidden == 0 {
		c.Hidden = 32
	}
	c.Hidden = min(max(c.Hidden, 16), 64)
	if c.WeightSeed == 0 {
		c.WeightSeed = 1
	}
	if c.ContextSeed == 0 {
		c.ContextSeed = 7
	}
	if c.Scale == 0 {
		c.Scale = 3.5
	}
	m := &Model{vocab: c.Vocab, hidden: c.Hidden, scale: c.Scale, contextSeed: c.ContextSeed}
	m.weights = gaussianMatrix(c.Vocab, c.Hidden, c.WeightSeed, 0x5eed)
	m.embed = gaussianMatrix(c.Vocab, c.Hidden, c.ContextSeed, 0xe1b)
	m.tokens = renderVocab(c.Vocab)
	m.cache = new(logitCache)
	return m
}

func gaussianMatrix(rows, cols int, seed, stream uint64) []float64 {
	r := rand.New(rand.NewPCG(seed, stream))
	w := make([]float64, rows*cols)
	for i := range w {
		w[i] = r.NormFloat64()
	}
	return w
}

// renderVocab gives every token id a short string: syllables, some with a
// leading space, so that completions read like words.
func renderVocab(n int) []string {
	cons := "bdfgklmnprstvz"
	vows := "aeiou"
	out := make([]string, n)
	out[eos] = ""
	for i := 1; i < n; i++ {
		c := cons[i%len(cons)]
		v := vows[(i/len(cons))%len(vows)]
		s := string([]byte{c, v})
		if k := i / (len(cons) * len(vows)); k > 0 {
			s += string(cons[k%len(cons)])
		}
		if i%3 == 0 {
			s = " " + s
		}
		out[i] = s
	}
	return out
}

// derive copies m's shape and context with other weights and options.
func (m *Model) derive(weights []float64) *Model {
	d := &Model{
		vocab: m.vocab, hidden: m.hidden, scale: m.scale, contextSeed: m.contextSeed,
		weights: weights, embed: m.embed, tokens: m.tokens, opts: m.opts, cache: new(logitCache),
	}
	d.sigmaBits.Store(m.sigmaBits.Load())
	return d
}

// With returns a copy of m with the serving options o (weights shared).
func (m *Model) With(o Options) *Model {
	d := m.derive(m.weights)
	d.cache = m.cache
	d.opts = o
	d.sigmaBits.Store(math.Float64bits(o.Sigma))
	return d
}

// SetSigma changes the logit noise of later calls (the load regime changes
// it per cycle).
func (m *Model) SetSigma(sigma float64) { m.sigmaBits.Store(math.Float64bits(sigma)) }

// Sigma is the current logit noise.
func (m *Model) Sigma() float64 { return math.Float64frombits(m.sigmaBits.Load()) }

// SetPath makes later completions add Options.PathOffsets[p] to every
// logit (the numeric path the batch shape chose; ScorePrompt does not);
// p < 0 or out of range: none.
func (m *Model) SetPath(p int) { m.path.Store(int64(p) + 1) }

// pathOffsets is the offset vector of the current path, nil when none.
func (m *Model) pathOffsets() []float64 {
	p := int(m.path.Load()) - 1
	if p < 0 || p >= len(m.opts.PathOffsets) {
		return nil
	}
	return m.opts.PathOffsets[p]
}

// Swapped returns a different model behind the same name: new weights drawn
// from seed, same vocabulary and context.
func (m *Model) Swapped(seed uint64) *Model {
	return m.derive(gaussianMatrix(m.vocab, m.hidden, seed, 0x5eed))
}

// FP16 returns m with every weight rounded to half precision (11 significant
// bits), the difference between F16 and BF16 serving: about zero KL.
func (m *Model) FP16() *Model {
	w := make([]float64, len(m.weights))
	for i, x := range m.weights {
		w[i] = roundSignificant(x, 11)
	}
	return m.derive(w)
}

func roundSignificant(x float64, bits int) float64 {
	if x == 0 {
		return 0
	}
	frac, exp := math.Frexp(x)
	s := math.Ldexp(1, bits)
	return math.Ldexp(math.Round(frac*s)/s, exp)
}

// quantizeRows rounds each weight row to a symmetric uniform grid whose step
// is step times the row's largest magnitude (per-row scales, as in Q8_0).
func (m *Model) quantizeRows(step float64) []float64 {
	w := make([]float64, len(m.weights))
	for r := 0; r < m.vocab; r++ {
		row := m.weights[r*m.hidden : (r+1)*m.hidden]
		maxAbs := 0.0
		for _, x := range row {
			maxAbs = max(maxAbs, math.Abs(x))
		}
		d := step * maxAbs
		for i, x := range row {
			w[r*m.hidden+i] = math.Round(x/d) * d
		}
	}
	return w
}

// state is the hidden state of one context. key identifies the context
// (the prompt, then every token fed in) for the logit cache.
type state struct {
	h    []float64
	gain float64
	key  uint64
}

// promptState seeds the hidden state from the prompt text. The gain sets how
// confident the model is on this prompt: some prompts are near-ties.
func (m *Model) promptState(prompt string) state {
	f := fnv.New64a()
	f.Write([]byte(prompt))
	key := f.Sum64()
	r := rand.New(rand.NewPCG(key, m.contextSeed))
	h := make([]float64, m.hidden)
	for i := range h {
		h[i] = r.NormFloat64()
	}
	normalize(h)
	return state{h: h, gain: 0.55 + 1.1*r.Float64(), key: key}
}

// advance feeds the chosen token into the recurrence.
func (m *Model) advance(s *state, tok int) {
	s.key = mix64(s.key ^ (uint64(tok)+1)*0x9e3779b97f4a7c15)
	e := m.embed[tok*m.hidden : (tok+1)*m.hidden]
	for i := range s.h {
		s.h[i] = 0.6*s.h[i] + 0.8*e[i]/math.Sqrt(float64(m.hidden))*3
	}
	normalize(s.h)
}

func normalize(h []float64) {
	n := 0.0
	for _, x := range h {
		n += x * x
	}
	n = math.Sqrt(n)
	for i := range h {
		h[i] /= n
	}
}

// logits writes the noiseless logits of state s into out.
//
// The race detector does not instrument it (go:norace): it reads the
// weights, which never change after New, and writes out, which its caller
// owns, and it is most of every completion's time, which the
// instrumentation made about 14 times longer in the tests that serve this
// model over HTTP (the race detector still checks everything around it).
//
//go:norace
func (m *Model) logits(s state, out []float64) {
	k := m.scale * s.gain
	for r := 0; r < m.vocab; r++ {
		row := m.weights[r*m.hidden : (r+1)*m.hidden]
		dot := 0.0
		for i, w := range row {
			dot += w * s.h[i]
		}
		out[r] = k * dot
	}
	out[eos] -= 2 // completions mostly run to max_tokens, as probes expect
}

// contextLogits writes the noiseless logits of state s into out, from
// the cache when this context was seen before: probes ask the same prompts
// every cycle, so most contexts recur (the drift harness's statistical
// tests run in a quarter to a third less time with it). The cached values
// are the same bits logits computes.
func (m *Model) contextLogits(s state, out []float64) {
	if m.cache.get(s.key, out) {
		return
	}
	m.logits(s, out)
	m.cache.put(s.key, out)
}

// logitCache maps a context's key to its noiseless logits. When full it
// starts again empty: the contexts probes repeat come back at once.
type logitCache struct {
	mu sync.Mutex
	m  map[uint64][]float64 // never changed once stored
}

// logitCacheMax bounds the entries (2 KiB each at the default vocabulary).
const logitCacheMax = 4096

func (c *logitCache) get(key uint64, out []float64) bool {
	c.mu.Lock()
	v, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		copy(out, v)
	}
	return ok
}

func (c *logitCache) put(key uint64, v []float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= logitCacheMax {
		c.m = make(map[uint64][]float64)
	}
	c.m[key] = slices.Clone(v)
}

// mix64 is splitmix64's finalizer: the context key of a token sequence.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// logSoftmax turns logits into log probabilities in place.
func logSoftmax(x []float64) {
	hi := slices.Max(x)
	sum := 0.0
	for _, v := range x {
		sum += math.Exp(v - hi)
	}
	lse := hi + math.Log(sum)
	for i := range x {
		x[i] -= lse
	}
}

// Complete implements fakeai.Completer: greedy decoding at temperature 0,
// sampling otherwise, with top-k logprobs. Stop sequences are not applied.
func (m *Model) Complete(req fakeai.CompletionRequest) fakeai.Completion {
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = 16
	}
	sigma := m.Sigma()
	offsets := m.pathOffsets()
	call := m.calls.Add(1)
	noise := rand.New(rand.NewPCG(m.opts.NoiseSeed^0x9e3779b97f4a7c15, call))
	s := m.promptState(req.Prompt)
	lp := make([]float64, m.vocab)
	out := fakeai.Completion{
		FinishReason: "length",
		PromptTokens: len(strings.Fields(req.Prompt)) + m.opts.PromptOverhead,
		Fingerprint:  m.opts.Fingerprint,
		NoLogprobs:   m.opts.NoLogprobs,
	}
	var text strings.Builder
	for len(out.Tokens) < maxTokens {
		m.contextLogits(s, lp)
		for i, o := range offsets[:min(len(offsets), len(lp))] {
			lp[i] += o
		}
		if sigma > 0 {
			for i := range lp {
				lp[i] += sigma * noise.NormFloat64()
			}
		}
		logSoftmax(lp)
		tok := argmax(lp)
		if req.Temperature > 0 {
			tok = sample(lp, req.Temperature, noise)
		}
		if tok == eos {
			out.FinishReason = "stop"
			break
		}
		tl := fakeai.TokenLogprob{Token: m.tokens[tok], Logprob: lp[tok]}
		if req.TopLogprobs > 0 {
			tl.Top = m.topK(lp, req.TopLogprobs)
		}
		out.Tokens = append(out.Tokens, tl)
		text.WriteString(m.tokens[tok])
		m.advance(&s, tok)
	}
	out.Text = text.String()
	out.CompletionTokens = len(out.Tokens)
	return out
}

func argmax(x []float64) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

func sample(lp []float64, temperature float64, r *rand.Rand) int {
	u := r.Float64()
	hi := slices.Max(lp)
	sum := 0.0
	for _, v := range lp {
		sum += math.Exp((v - hi) / temperature)
	}
	acc := 0.0
	for i, v := range lp {
		acc += math.Exp((v-hi)/temperature) / sum
		if u < acc {
			return i
		}
	}
	return len(lp) - 1
}

// topK returns the k most likely tokens, most likely first (ties: lower id
// first). EOS is shown as the empty string, as an OpenAI-compatible server
// would show a special token it does not render. A linear scan with a small
// insertion buffer: k is at most 20, the vocabulary a few hundred.
func (m *Model) topK(lp []float64, k int) []fakeai.TopLogprob {
	k = min(k, len(lp))
	idx := make([]int, 0, k)
	for i, v := range lp {
		if len(idx) == k && v <= lp[idx[k-1]] {
			continue
		}
		pos := len(idx)
		for pos > 0 && v > lp[idx[pos-1]] {
			pos--
		}
		if len(idx) < k {
			idx = append(idx, 0)
		}
		copy(idx[pos+1:], idx[pos:len(idx)-1])
		idx[pos] = i
	}
	out := make([]fakeai.TopLogprob, len(idx))
	for i, t := range idx {
		out[i] = fakeai.TopLogprob{Token: m.tokens[t], Logprob: lp[t]}
	}
	return out
}
