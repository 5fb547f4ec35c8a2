package toylm

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// NoiseLevels are the run-to-run logit noise sigmas of docs/DRIFT.md.
var NoiseLevels = []float64{0.003, 0.03, 0.1}

// LoadRegime, used as a sigma, draws a new sigma every cycle, log-uniform
// between 0.003 and 0.1: a backend whose batch composition changes with load.
const LoadRegime = -1.0

// CorrelatedNoise, used as a sigma, is noise correlated across cycles: the
// load regime's independent noise plus the fixed logit offsets of one of
// CorrelatedPaths numeric paths (kernel choices by batch shape), the path a
// Markov chain over cycles that keeps the previous cycle's path with
// probability CorrelatedStay, so consecutive cycles share offsets. Each
// backend has its own paths (seeded), the same for every artefact it
// serves.
const CorrelatedNoise = -2.0

// The correlated-noise model: 4 paths, each a vector of independent
// Gaussian logit offsets of standard deviation CorrelatedScale over the
// vocabulary; a cycle keeps the previous cycle's path with probability
// CorrelatedStay, and otherwise moves to one of the others at random.
const (
	CorrelatedPaths = 4
	CorrelatedScale = 0.01
	CorrelatedStay  = 0.8
)

// NoiseModels are the -noise choices of the harness: the independent
// levels (NoiseLevels and LoadRegime), or those and CorrelatedNoise.
var NoiseModels = []string{"independent", "correlated"}

// Levels are the noise levels of noise model name ("" is "independent").
func Levels(name string) ([]float64, error) {
	levels := append(slices.Clone(NoiseLevels), LoadRegime)
	switch name {
	case "", "independent":
		return levels, nil
	case "correlated":
		return append(levels, CorrelatedNoise), nil
	}
	return nil, fmt.Errorf("toylm: unknown noise model %q (one of %v)", name, NoiseModels)
}

// pathOffsets are backend seed's correlated-noise paths.
func pathOffsets(seed uint64) [][]float64 {
	r := rand.New(rand.NewPCG(seed, 0x9a7b))
	out := make([][]float64, CorrelatedPaths)
	for p := range out {
		out[p] = make([]float64, 256)
		for i := range out[p] {
			out[p][i] = CorrelatedScale * r.NormFloat64()
		}
	}
	return out
}

// noiseOptions adds what noise level sigma needs to o: the paths of the
// correlated model.
func noiseOptions(o Options, sigma float64) Options {
	if sigma == CorrelatedNoise {
		o.PathOffsets = pathOffsets(o.NoiseSeed)
	}
	return o
}

// SigmaName formats a sigma of the harness.
func SigmaName(sigma float64) string {
	if sigma == LoadRegime {
		return "load"
	}
	if sigma == CorrelatedNoise {
		return "correlated"
	}
	return fmt.Sprintf("%g", sigma)
}

// Variant is a named way to change the served artefact.
type Variant struct {
	Name string
	// Build returns the completer serving the variant, and the models whose
	// noise the harness sets each cycle. ref is the noiseless reference.
	Build func(ref *Model, o Options) (fakeai.Completer, []*Model)
}

// Variants returns the standard variants, calibrated by measured KL against
// ref: q8, q6, q4-like, swap, fp16, and partial routing (half the requests to
// q4-like).
func Variants(ref *Model) []Variant {
	q8, _ := ref.Quantized(KLQ8)
	q6, _ := ref.Quantized(KLQ6)
	q4, _ := ref.Quantized(KLQ4)
	swap := ref.Swapped(0xdead)
	fp16 := ref.FP16()
	plain := func(name string, v *Model) Variant {
		return Variant{Name: name, Build: func(_ *Model, o Options) (fakeai.Completer, []*Model) {
			m := v.With(o)
			return m, []*Model{m}
		}}
	}
	return []Variant{
		plain("swap", swap),
		plain("q4-like", q4),
		plain("q6-like", q6),
		plain("q8-like", q8),
		plain("fp16", fp16),
		{Name: "partial-q4-50%", Build: func(ref *Model, o Options) (fakeai.Completer, []*Model) {
			base := ref.With(o)
			o2 := o
			o2.NoiseSeed ^= 0xabc
			v := q4.With(o2)
			return &Mix{Base: base, Variant: v, Fraction: 0.5, Seed: o.NoiseSeed}, []*Model{base, v}
		}},
	}
}

// Harness drives drift.Monitor with toy backends in process, the same
// statistics and decisions that serve runs, without HTTP.
type Harness struct {
	Suite  *drift.Suite
	Params drift.Params
	// Enrol is the minimum number of enrolment cycles. If zero, 8.
	Enrol int
	// Interval is the time between cycles. If zero, 5m (serve's default
	// schedule).
	Interval time.Duration
	// EnrolMin is the minimum enrolment span. If zero, 2h (the default);
	// negative: none. With the defaults enrolment sees 25 cycles and keeps
	// the last 16, as serve does.
	EnrolMin time.Duration
	// Ref is the reference model. If nil, New(Config{}).
	Ref *Model
	// Workers is how many backends Null runs at once. If zero, 1.
	Workers int
	// Teacher is how the monitors judge teacher-forced scores (the suite's
	// fixed texts). If empty, drift.TeacherOnly, serve's default.
	Teacher drift.TeacherMode
	// LegacyS4 makes the sampled tier judge as it did before its
	// persistence test: each baseline's position variances are cleared
	// after enrolment, as in a baseline stored before the test existed,
	// and the CUSUM runs on S4's z against the enrolment null.
	LegacyS4 bool
}

func (h *Harness) ref() *Model {
	if h.Ref == nil {
		h.Ref = New(Config{})
	}
	return h.Ref
}

// Cycle probes completer c once with the suite's canonical requests.
func Cycle(s *drift.Suite, c fakeai.Completer, at time.Time) *drift.Cycle {
	cy := &drift.Cycle{At: at}
	seed := int64(1)
	for _, p := range s.Prompts {
		comp := c.Complete(fakeai.CompletionRequest{
			Model: "toy", Prompt: "user: " + p.Text, MaxTokens: p.MaxTokens,
			TopP: 1, Seed: &seed, Logprobs: true, TopLogprobs: 5,
		})
		cy.Obs = append(cy.Obs, Observe(p.ID, comp))
		cy.Identity.PromptTokens = append(cy.Identity.PromptTokens, comp.PromptTokens)
		if comp.Fingerprint != "" {
			cy.Identity.Fingerprint = comp.Fingerprint
		}
	}
	return cy
}

// Observe converts a completion into the probe's record of it.
func Observe(promptID string, c fakeai.Completion) drift.Observation {
	o := drift.Observation{
		Prompt: promptID, Text: c.Text, HasLogprobs: !c.NoLogprobs, Fingerprint: c.Fingerprint,
		Model: "toy", FinishReason: c.FinishReason, PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens,
	}
	for _, t := range c.Tokens {
		tok := drift.Token{Token: t.Token}
		if !c.NoLogprobs {
			tok.Logprob = t.Logprob
			for _, a := range t.Top {
				tok.Top = append(tok.Top, drift.Alt{Token: a.Token, Logprob: a.Logprob})
			}
		}
		o.Tokens = append(o.Tokens, tok)
	}
	return o
}

// backend is one simulated backend: a completer and the models whose noise
// follows the regime.
type backend struct {
	c      fakeai.Completer
	models []*Model
	sigma  float64
	rng    *rand.Rand
	path   int // the correlated model's current path
}

func (b *backend) setNoise() {
	s := b.sigma
	if s == LoadRegime || s == CorrelatedNoise {
		s = math.Exp(math.Log(0.003) + b.rng.Float64()*(math.Log(0.1)-math.Log(0.003)))
	}
	path := -1
	if b.sigma == CorrelatedNoise {
		if b.rng.Float64() >= CorrelatedStay {
			b.path = (b.path + 1 + b.rng.IntN(CorrelatedPaths-1)) % CorrelatedPaths
		}
		path = b.path
	}
	for _, m := range b.models {
		m.SetSigma(s)
		m.SetPath(path)
	}
}

func (h *Harness) monitor(id string) *drift.Monitor {
	return drift.NewMonitor("sim", id, drift.MonitorSettings{Suite: h.Suite, Enrol: h.Enrol, EnrolMin: h.EnrolMin, Params: h.Params, Teacher: h.Teacher}, nil)
}

// at is the time of cycle i.
func (h *Harness) at(i int) time.Time {
	iv := h.Interval
	if iv == 0 {
		iv = 5 * time.Minute
	}
	return epoch.Add(time.Duration(i) * iv)
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// enrol runs cycles until m has a baseline and returns the next cycle index.
func (h *Harness) enrol(m *drift.Monitor, b *backend) (int, error) {
	for i := 0; ; i++ {
		b.setNoise()
		r, err := m.Observe(h.cycle(m, b.c, h.at(i)), nil)
		if err != nil {
			return 0, err
		}
		if r.Enrolled {
			if h.LegacyS4 {
				clearVariances(m.Baseline())
			}
			return i + 1, nil
		}
	}
}

// clearVariances zeroes the sampled positions' variances of b (LegacyS4).
func clearVariances(b *drift.Baseline) {
	for i := range b.Prompts {
		for j := range b.Prompts[i].Positions {
			b.Prompts[i].Positions[j].Var = 0
		}
	}
}

// NullResult counts false alarms on an unchanged (or fp16-rounded) backend.
type NullResult struct {
	Sigma    float64
	Variant  string // "" for the reference itself
	Backends int
	Cycles   int // evaluated cycles, after enrolment
	Gross    int // cycles whose signal was gross
	Alarms   int // transitions out of ok (suspect or drifted)
	Suspects int // transitions from ok to suspect (a CUSUM alarm, not yet confirmed)
	Drifted  int // transitions to drifted
}

func (r *NullResult) add(o NullResult) {
	r.Cycles += o.Cycles
	r.Gross += o.Gross
	r.Alarms += o.Alarms
	r.Suspects += o.Suspects
	r.Drifted += o.Drifted
}

// Null runs backends independent enrolments of the reference (or of variant
// v when not nil) and then cycles cycles each, serving the same artefact.
// Up to h.Workers backends run at once; the result does not depend on how
// many (every backend has its own seeded noise and monitor).
func (h *Harness) Null(sigma float64, v *Variant, backends, cycles int, seed uint64) (NullResult, error) {
	res := NullResult{Sigma: sigma, Backends: backends}
	if v != nil {
		res.Variant = v.Name
	}
	h.ref() // set once, before the workers read it
	workers := min(max(h.Workers, 1), max(backends, 1))
	parts := make([]NullResult, backends)
	errs := make([]error, backends)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				parts[k], errs[k] = h.nullBackend(sigma, v, k, cycles, seed)
			}
		}()
	}
	for k := range backends {
		next <- k
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	for _, p := range parts {
		res.add(p)
	}
	return res, nil
}

// nullBackend is backend k of Null: its enrolment and its cycles.
func (h *Harness) nullBackend(sigma float64, v *Variant, k, cycles int, seed uint64) (NullResult, error) {
	var res NullResult
	o := noiseOptions(Options{NoiseSeed: seed*1000003 + uint64(k)}, sigma)
	ref := h.ref().With(o)
	b := &backend{c: ref, models: []*Model{ref}, sigma: sigma, rng: rand.New(rand.NewPCG(seed, uint64(k)))}
	m := h.monitor(fmt.Sprint("null-", k))
	start, err := h.enrol(m, b)
	if err != nil {
		return res, err
	}
	if v != nil {
		b.c, b.models = v.Build(h.ref(), o)
	}
	for i := range cycles {
		b.setNoise()
		r, err := m.Observe(h.cycle(m, b.c, h.at(start+i)), nil)
		if err != nil {
			return res, err
		}
		res.Cycles++
		if r.Signal.Gross {
			res.Gross++
		}
		if tr := r.Transition; tr != nil && tr.From == fleetwatch.DriftOK {
			res.Alarms++
			if tr.To == fleetwatch.DriftSuspect {
				res.Suspects++
			}
		}
		if tr := r.Transition; tr != nil && tr.To == fleetwatch.DriftDrifted {
			res.Drifted++
		}
	}
	return res, nil
}

// PowerResult is how fast a change was detected over independent trials.
type PowerResult struct {
	Sigma   float64
	Variant string
	Trials  int
	// SuspectDelay and DriftedDelay hold, per trial, the number of cycles
	// after the change at which the backend left ok and became drifted
	// (1 is the first cycle after the change; 0: not within the budget).
	SuspectDelay, DriftedDelay []int
}

// Within is how many trials were detected (left ok) within n cycles.
func (r PowerResult) Within(n int) int {
	k := 0
	for _, d := range r.SuspectDelay {
		if d > 0 && d <= n {
			k++
		}
	}
	return k
}

// DriftedWithin is how many trials reached drifted within n cycles.
func (r PowerResult) DriftedWithin(n int) int {
	k := 0
	for _, d := range r.DriftedDelay {
		if d > 0 && d <= n {
			k++
		}
	}
	return k
}

// Power enrols the reference, switches to v (a change point) and runs up to
// maxCycles cycles per trial.
func (h *Harness) Power(v Variant, sigma float64, trials, maxCycles int, seed uint64) (PowerResult, error) {
	res := PowerResult{Sigma: sigma, Variant: v.Name, Trials: trials}
	for k := range trials {
		o := noiseOptions(Options{NoiseSeed: seed*7919 + uint64(k)}, sigma)
		ref := h.ref().With(o)
		b := &backend{c: ref, models: []*Model{ref}, sigma: sigma, rng: rand.New(rand.NewPCG(seed, uint64(k)))}
		m := h.monitor(fmt.Sprint("power-", k))
		start, err := h.enrol(m, b)
		if err != nil {
			return res, err
		}
		b.c, b.models = v.Build(h.ref(), o)
		sus, dr, err := delays(maxCycles, func(i int) (drift.Result, error) {
			b.setNoise()
			return m.Observe(h.cycle(m, b.c, h.at(start+i)), nil)
		})
		if err != nil {
			return res, err
		}
		res.SuspectDelay = append(res.SuspectDelay, sus)
		res.DriftedDelay = append(res.DriftedDelay, dr)
	}
	return res, nil
}

// delays observes cycles 1 to maxCycles until one makes the backend
// drifted, and returns the first cycle that left ok and the one that made
// it drifted (0: none within maxCycles).
func delays(maxCycles int, observe func(i int) (drift.Result, error)) (suspect, drifted int, err error) {
	for i := 1; i <= maxCycles && drifted == 0; i++ {
		r, err := observe(i)
		if err != nil {
			return 0, 0, err
		}
		if tr := r.Transition; tr != nil {
			if suspect == 0 && tr.To != fleetwatch.DriftOK {
				suspect = i
			}
			if tr.To == fleetwatch.DriftDrifted {
				drifted = i
			}
		}
	}
	return suspect, drifted, nil
}

// PeerResult counts how often the odd backend of a pool was named.
type PeerResult struct {
	Sigma            float64
	Variant          string
	Trials           int
	Named, WrongName int
	Distances        []float64 // the candidate's median distance per trial
	OthersDistances  []float64 // the others' median pairwise distance per trial
}

// Peers enrols a pool of n backends where the last one serves v from the
// start, and compares their baselines.
func (h *Harness) Peers(v Variant, sigma float64, n, trials int, seed uint64) (PeerResult, error) {
	res := PeerResult{Sigma: sigma, Variant: v.Name, Trials: trials}
	for k := range trials {
		baselines := map[string]*drift.Baseline{}
		for i := range n {
			o := noiseOptions(Options{NoiseSeed: seed*104729 + uint64(k*n+i)}, sigma)
			var b *backend
			if i == n-1 {
				c, ms := v.Build(h.ref(), o)
				b = &backend{c: c, models: ms}
			} else {
				m := h.ref().With(o)
				b = &backend{c: m, models: []*Model{m}}
			}
			b.sigma, b.rng = sigma, rand.New(rand.NewPCG(seed, uint64(k*n+i)))
			id := fmt.Sprintf("b%d", i)
			m := h.monitor(id)
			if _, err := h.enrol(m, b); err != nil {
				return res, err
			}
			baselines[id] = m.Baseline()
		}
		pv := drift.ComparePeers(baselines, h.Params)
		switch pv.Outlier {
		case fmt.Sprintf("b%d", n-1):
			res.Named++
		case "":
		default:
			res.WrongName++
		}
		res.Distances = append(res.Distances, pv.OutlierDistance)
		res.OthersDistances = append(res.OthersDistances, pv.OthersDistance)
	}
	return res, nil
}

// median of xs, for reports.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
