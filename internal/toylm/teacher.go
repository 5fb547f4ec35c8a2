package toylm

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Teacher-forced scoring (docs/DRIFT.md "Teacher-forced probes"). The toy
// tokenizer splits a text into words and maps each word to a token id by a
// hash (rendered as the word itself, with a leading space after the first,
// so the tokens concatenate to the text with single spaces). The first word
// seeds the hidden state, as a prompt does; from then on the recurrence is
// fed the text's own tokens, not the model's choices, so every variant is
// scored in exactly the same contexts and only the weights (and the noise)
// move the logprobs.

// textTokens is the toy tokenization of a text: the words, and their ids.
func (m *Model) textTokens(text string) ([]string, []int) {
	words := strings.Fields(text)
	ids := make([]int, len(words))
	for i, w := range words {
		h := fnv.New64a()
		h.Write([]byte(w))
		ids[i] = 1 + int(h.Sum64()%uint64(m.vocab-1)) // never eos
		if i > 0 {
			words[i] = " " + w
		}
	}
	return words, ids
}

// ScorePrompt implements fakeai.PromptScorer: the logprob of every word of
// the prompt after the first, given the words before it, with the call's
// logit noise, and the top req.TopLogprobs alternatives at each position.
// A model with Options.NoPromptLogprobs (or NoLogprobs) declines (the fake
// server answers 400).
func (m *Model) ScorePrompt(req fakeai.CompletionRequest) ([]fakeai.TokenLogprob, bool) {
	if m.opts.NoPromptLogprobs || m.opts.NoLogprobs {
		return nil, false
	}
	words, ids := m.textTokens(req.Prompt)
	if len(words) == 0 {
		return nil, true
	}
	sigma := m.Sigma()
	call := m.calls.Add(1)
	noise := rand.New(rand.NewPCG(m.opts.NoiseSeed^0x7eac4e5, call))
	s := m.promptState(strings.TrimSpace(words[0]))
	lp := make([]float64, m.vocab)
	out := []fakeai.TokenLogprob{{Token: words[0]}}
	m.advance(&s, ids[0])
	for i := 1; i < len(words); i++ {
		m.contextLogits(s, lp)
		if sigma > 0 {
			for k := range lp {
				lp[k] += sigma * noise.NormFloat64()
			}
		}
		logSoftmax(lp)
		t := fakeai.TokenLogprob{Token: words[i], Logprob: lp[ids[i]]}
		if req.TopLogprobs > 0 {
			t.Top = m.topK(lp, req.TopLogprobs)
		}
		out = append(out, t)
		m.advance(&s, ids[i])
	}
	return out, true
}

// ScorePrompt implements fakeai.PromptScorer: the request goes to the base
// or the variant as a completion would.
func (x *Mix) ScorePrompt(req fakeai.CompletionRequest) ([]fakeai.TokenLogprob, bool) {
	n := x.calls.Add(1)
	u := rand.New(rand.NewPCG(x.Seed, n)).Float64()
	c := x.Base
	if u < x.Fraction {
		c = x.Variant
	}
	ps, ok := c.(fakeai.PromptScorer)
	if !ok {
		return nil, false
	}
	return ps.ScorePrompt(req)
}

// ScorePrompt implements fakeai.PromptScorer for the completer in place.
func (s *Switch) ScorePrompt(req fakeai.CompletionRequest) ([]fakeai.TokenLogprob, bool) {
	ps, ok := s.cur.Load().c.(fakeai.PromptScorer)
	if !ok {
		return nil, false
	}
	return ps.ScorePrompt(req)
}

// TeacherScores scores the fixed texts of suite s with c, recorded as the
// probe's client records them over HTTP (probes.Client.Score): the tokens
// after the first, with their logprobs. It returns nil when c does not
// score prompts.
func TeacherScores(s *drift.Suite, c fakeai.Completer) []drift.Observation {
	ps, ok := c.(fakeai.PromptScorer)
	if !ok || len(s.Teacher) == 0 {
		return nil
	}
	out := make([]drift.Observation, 0, len(s.Teacher))
	for _, t := range s.Teacher {
		toks, ok := ps.ScorePrompt(fakeai.CompletionRequest{Model: "toy", Prompt: t.Text, MaxTokens: 1, Logprobs: true, TopLogprobs: 1})
		if !ok {
			return nil
		}
		sc := probes.TeacherScore{PromptTokens: len(toks), Model: "toy"}
		for _, tl := range toks[min(1, len(toks)):] {
			sc.Tokens = append(sc.Tokens, drift.Token{Token: tl.Token, Logprob: tl.Logprob})
		}
		out = append(out, sc.Observation(t.ID))
	}
	return out
}

// cycle is one probe cycle of completer c for monitor m: the suite's
// prompts, and its fixed texts when m wants them (as the Prober does).
func (h *Harness) cycle(m *drift.Monitor, c fakeai.Completer, at time.Time) *drift.Cycle {
	cy := Cycle(h.Suite, c, at)
	if m.WantsTeacher() {
		cy.Teacher = TeacherScores(h.Suite, c)
	}
	return cy
}

// TierNames are the tiers `fleetwatch drift sim --tier` measures: the
// sampled probes alone ("sampled": serve without teacher texts, or a
// backend without prompt logprobs), the teacher-forced scores deciding
// subtle changes with the gross rule of both ("teacher": serve's default
// where prompt logprobs are supported), or every rule of both tiers
// ("both").
var TierNames = []string{"sampled", "teacher", "both"}

// TierMode maps a tier name ("" is "teacher") to the monitors'
// TeacherMode.
func TierMode(tier string) (drift.TeacherMode, error) {
	switch tier {
	case "sampled":
		return drift.TeacherOff, nil
	case "", "teacher":
		return drift.TeacherOnly, nil
	case "both":
		return drift.TeacherBoth, nil
	}
	return "", fmt.Errorf("toylm: tier %q: want one of %s", tier, strings.Join(TierNames, ", "))
}
