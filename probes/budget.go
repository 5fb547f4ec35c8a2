package probes

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// The probe budget (docs/DRIFT.md "Probe budget", docs/DECISIONS.md "Probe
// budget"): at most Target.BudgetTokensPerDay tokens in any 24 hours per
// backend, paced by a token bucket. The bucket holds at most one day's
// budget and refills continuously at budget/24h; a cycle pays its tiers
// cheapest first, each only when the bucket (and what is left of the last
// 24 hours' budget) holds its estimated cost: identity (GET requests
// only: free), teacher (prompt tokens only), sampled, tool-call. Each tier
// needs the one before it where that one is wanted (the monitor fails a
// cycle of a teacher-enrolled backend without scores, and judges the tool
// tier beside the sampled one), so a tier that cannot be paid skips the
// ones after it. A tier's estimate is its actual spend at its last run, or
// before its first a static estimate from the suite's texts and
// max_tokens. What a tier spent is charged as the usage its answers
// report (the estimate per request where an answer has none); the
// overshoot of an estimate is charged too, so the bucket may go below
// zero and the next cycles wait.
//
// While a backend enrols, a cycle runs in full or not at all: the
// baseline needs every tier. A cycle of an enrolled backend whose sampled
// tier was skipped is judged on what it paid for (ObservePartial): the
// identity tier against the baseline's and the teacher tier; the sampled
// probes' statistics are not fed a partial cycle.

// Probe tiers, the `tier` label of the probe budget's metrics.
const (
	TierIdentity = "identity"
	TierTeacher  = "teacher"
	TierSampled  = "sampled"
	TierTools    = "tool_call"
)

// budgetTiers are the tiers a budget pays for, cheapest first.
var budgetTiers = []string{TierTeacher, TierSampled, TierTools}

// budgetWindow is the span of the spend a budget limits.
const budgetWindow = 24 * time.Hour

// TierName is how a tier is written in the statuses' words ("tool-call").
func TierName(tier string) string { return strings.ReplaceAll(tier, "_", "-") }

// spend is one tier's charge at one cycle.
type spend struct {
	at     time.Time
	tier   string
	tokens int64
}

// budget is one backend's probe budget and spend; guarded by Prober.mu.
type budget struct {
	perDay   int64
	level    float64 // tokens in the bucket; may be negative after an overshoot
	at       time.Time
	spends   []spend            // the last budgetWindow's charges, oldest first
	estimate map[string]float64 // each tier's actual tokens at its last run
	skipped  map[string]int     // skips by tier
	last     []string           // the tiers the last cycle skipped
	waiting  bool               // the last cycle was an enrolment cycle the budget could not pay
}

func newBudget(perDay int64) *budget {
	return &budget{perDay: max(perDay, 0), estimate: map[string]float64{}, skipped: map[string]int{}}
}

// update takes a reloaded budget: the spend of the last 24 hours stays
// and counts against the new budget, the bucket holds at most a day of it;
// a new suite forgets the tiers' measured costs.
func (b *budget) update(perDay int64, newSuite bool) {
	if b.perDay == 0 {
		b.at = time.Time{} // was unlimited: the bucket starts full
	}
	b.perDay = max(perDay, 0)
	b.level = min(b.level, float64(b.perDay))
	if newSuite {
		b.estimate = map[string]float64{}
	}
}

// refill adds what the bucket earned since the last call and drops the
// spends older than budgetWindow.
func (b *budget) refill(now time.Time) {
	if b.at.IsZero() {
		b.level, b.at = float64(b.perDay), now
	}
	if dt := now.Sub(b.at); dt > 0 {
		b.level = min(float64(b.perDay), b.level+float64(b.perDay)*dt.Hours()/budgetWindow.Hours())
		b.at = now
	}
	cut := 0
	for cut < len(b.spends) && now.Sub(b.spends[cut].at) >= budgetWindow {
		cut++
	}
	b.spends = b.spends[cut:]
}

// spent is the spend of the last budgetWindow by tier, and its total.
func (b *budget) spent() (map[string]int64, int64) {
	by := map[string]int64{}
	var total int64
	for _, s := range b.spends {
		by[s.tier] += s.tokens
		total += s.tokens
	}
	return by, total
}

// available is what a cycle may spend now: the bucket, and at most what
// is left of the last 24 hours' budget.
func (b *budget) available(now time.Time) float64 {
	b.refill(now)
	_, total := b.spent()
	return min(b.level, float64(b.perDay-total))
}

// tierPlan is what a cycle pays for.
type tierPlan struct {
	run      map[string]bool
	skipped  []string // wanted tiers the budget could not pay, in budgetTiers order
	estimate map[string]float64
}

func (pl tierPlan) runs(tier string) bool { return pl.run[tier] }

// plan decides which of the wanted tiers a cycle at now pays for, by
// their estimates est; unlimited runs them all. enrolling: all or none.
func (b *budget) plan(now time.Time, wanted map[string]bool, est map[string]float64, enrolling bool) tierPlan {
	pl := tierPlan{run: map[string]bool{}, estimate: map[string]float64{}}
	for _, t := range budgetTiers {
		if !wanted[t] {
			continue
		}
		pl.estimate[t] = est[t]
		if e, ok := b.estimate[t]; ok {
			pl.estimate[t] = e
		}
	}
	if b.perDay == 0 {
		for t := range pl.estimate {
			pl.run[t] = true
		}
		return pl
	}
	avail := b.available(now)
	if enrolling {
		total := 0.0
		for _, e := range pl.estimate {
			total += e
		}
		b.waiting = total > avail
	} else {
		b.waiting = false
	}
	paying := !b.waiting
	for _, t := range budgetTiers {
		e, ok := pl.estimate[t]
		if !ok {
			continue
		}
		if paying && e <= avail {
			pl.run[t] = true
			avail -= e
			continue
		}
		paying = false
		pl.skipped = append(pl.skipped, t)
		b.skipped[t]++
	}
	b.last = pl.skipped
	return pl
}

// charge records what tier spent at now: the metered tokens, and for each
// answer without usage the tier's estimate per request (requests: how
// many the tier sends). It returns the tokens charged.
func (b *budget) charge(now time.Time, tier string, m *usageMeter, estimate float64, requests int) int64 {
	tokens := m.Tokens()
	if m.Unmetered > 0 && requests > 0 {
		tokens += int64(math.Ceil(estimate / float64(requests) * float64(m.Unmetered)))
	}
	if tokens <= 0 {
		return 0
	}
	b.refill(now)
	b.spends = append(b.spends, spend{at: now, tier: tier, tokens: tokens})
	if m.Requests == requests { // a whole tier: next time's estimate
		b.estimate[tier] = float64(tokens)
	}
	if b.perDay > 0 {
		b.level -= float64(tokens)
	}
	return tokens
}

// BudgetStatus is a backend's probe budget and spend, in BackendStatus.
type BudgetStatus struct {
	// TokensPerDay is the budget; 0 is unlimited (the spend is still
	// counted).
	TokensPerDay int64 `json:"tokens_per_day"`
	// Available is what the bucket holds now (0 when unlimited).
	Available float64 `json:"available_tokens"`
	// Spent is the tokens spent in the last 24 hours by tier, SpentTotal
	// their sum.
	Spent      map[string]int64 `json:"spent_24h"`
	SpentTotal int64            `json:"spent_24h_total"`
	// CostPerMTok is the backend's price (nil: unknown); Cost the spend
	// of the last 24 hours in its money, by tier, and CostTotal their
	// sum (both absent when the price is unknown).
	CostPerMTok *float64           `json:"cost_per_mtok,omitempty"`
	Cost        map[string]float64 `json:"cost_24h,omitempty"`
	CostTotal   *float64           `json:"cost_24h_total,omitempty"`
	// Estimate is each tier's expected cost of its next run: its spend at
	// its last run, or before the first the static estimate from the
	// suite (about four bytes a token, and every answer at its
	// max_tokens).
	Estimate map[string]float64 `json:"estimate_tokens,omitempty"`
	// Skipped lists the tiers the last cycle skipped for the budget;
	// SkippedTotal counts the skips by tier.
	Skipped      []string       `json:"skipped,omitempty"`
	SkippedTotal map[string]int `json:"skipped_total,omitempty"`
	// EnrolWaiting: the backend enrols and the last cycle did not run
	// because the budget could not pay a whole cycle.
	EnrolWaiting bool `json:"enrol_waiting,omitempty"`
}

// status is b at now.
func (b *budget) status(now time.Time, cost *float64, static map[string]float64) *BudgetStatus {
	b.refill(now)
	s := &BudgetStatus{TokensPerDay: b.perDay, Skipped: slices.Clone(b.last), EnrolWaiting: b.waiting}
	if b.perDay > 0 {
		s.Available = b.level
	}
	s.Spent, s.SpentTotal = b.spent()
	if cost != nil {
		c := *cost
		s.CostPerMTok = &c
		s.Cost = map[string]float64{}
		total := 0.0
		for t, n := range s.Spent {
			s.Cost[t] = float64(n) * c / 1e6
			total += s.Cost[t]
		}
		s.CostTotal = &total
	}
	s.Estimate = map[string]float64{}
	for t, e := range static {
		s.Estimate[t] = e
	}
	for t, e := range b.estimate {
		s.Estimate[t] = e
	}
	if len(b.skipped) > 0 {
		s.SkippedTotal = map[string]int{}
		for t, n := range b.skipped {
			s.SkippedTotal[t] = n
		}
	}
	return s
}

// SkipNote is what a status says beside itself when the last cycle
// skipped tiers for the budget ("" when none), e.g. "sampled and
// tool-call tiers skipped by the probe budget".
func (s *BudgetStatus) SkipNote() string {
	if s == nil {
		return ""
	}
	if s.EnrolWaiting {
		return "enrolment waits for the probe budget"
	}
	if len(s.Skipped) == 0 {
		return ""
	}
	names := make([]string, len(s.Skipped))
	for i, t := range s.Skipped {
		names[i] = TierName(t)
	}
	tiers := "tier"
	if len(names) > 1 {
		tiers = "tiers"
	}
	list := names[0]
	if len(names) > 1 {
		list = strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	return list + " " + tiers + " skipped by the probe budget"
}

// textTokens estimates the tokens of a text before a backend has said:
// about four bytes a token, plus a chat message's framing.
func textTokens(s string) float64 { return math.Ceil(float64(len(s))/4) + 8 }

// staticEstimates are the tiers' costs before their first run, from the
// suite's texts and max_tokens.
func staticEstimates(s *drift.Suite) map[string]float64 {
	est := map[string]float64{}
	for _, p := range s.Prompts {
		est[TierSampled] += textTokens(p.Text) + float64(min(max(p.MaxTokens, 1), drift.MaxProbeTokens))
	}
	for _, t := range s.Teacher {
		est[TierTeacher] += textTokens(t.Text) + 1
	}
	if s.Tools != nil {
		fns, _ := json.Marshal(s.Tools.Functions)
		for _, p := range s.Tools.Prompts {
			est[TierTools] += textTokens(p.Text) + math.Ceil(float64(len(fns))/4) + float64(s.Tools.MaxTokens)
		}
	}
	return est
}

// tierRequests is how many requests each tier of s sends a cycle.
func tierRequests(s *drift.Suite, tier string) int {
	switch tier {
	case TierSampled:
		return len(s.Prompts)
	case TierTeacher:
		return len(s.Teacher)
	case TierTools:
		if s.Tools != nil {
			return len(s.Tools.Prompts)
		}
	}
	return 0
}

// cycleUsage is what one cycle's tiers spent.
type cycleUsage struct{ teacher, sampled, tools usageMeter }

func (u *cycleUsage) of(tier string) *usageMeter {
	switch tier {
	case TierTeacher:
		return &u.teacher
	case TierSampled:
		return &u.sampled
	}
	return &u.tools
}

// planTiers decides what st's cycle at now pays for. Called with st.run
// held.
func (p *Prober) planTiers(st *backendState, now time.Time) tierPlan {
	wanted := map[string]bool{TierSampled: true}
	if st.mon.WantsTeacher() {
		wanted[TierTeacher] = true
	}
	if p.suite.Tools != nil && st.t.Endpoint != EndpointCompletions {
		wanted[TierTools] = true
	}
	p.mu.Lock()
	pl := st.budget.plan(now, wanted, p.estimates, st.mon.Baseline() == nil)
	p.mu.Unlock()
	for _, t := range pl.skipped {
		p.metrics.tierSkipped(st.t.Pool, st.t.Backend, t).Inc()
	}
	if len(pl.skipped) > 0 {
		p.s.Logf("probes: %s/%s: %s (budget %d tokens per day)", st.t.Pool, st.t.Backend,
			(&BudgetStatus{Skipped: pl.skipped}).SkipNote(), st.t.BudgetTokensPerDay)
	}
	return pl
}

// charge records what the tiers of the cycle of now spent, in the budget
// and the metrics.
func (p *Prober) charge(st *backendState, pl tierPlan, use *cycleUsage, now time.Time) {
	for _, tier := range budgetTiers {
		m := use.of(tier)
		if !pl.runs(tier) || m.Requests == 0 {
			continue
		}
		p.mu.Lock()
		n := st.budget.charge(now, tier, m, pl.estimate[tier], tierRequests(p.suite, tier))
		p.mu.Unlock()
		if n <= 0 {
			continue
		}
		p.metrics.tokens(st.t.Pool, st.t.Backend, tier).Add(int(n))
		if c := st.t.CostPerMTok; c != nil {
			p.metrics.cost(st.t.Pool, st.t.Backend, tier).Add(float64(n) * *c / 1e6)
		}
	}
}

// partialCycle takes a cycle whose sampled tier the budget skipped
// (ObservePartial) and reports whether its metadata changed. Called with
// st.run held.
func (p *Prober) partialCycle(ctx context.Context, st *backendState, cy *drift.Cycle, pl tierPlan, o *outbox) bool {
	p.mu.Lock()
	cy.TrafficFingerprint = st.trafficFP
	p.mu.Unlock()
	res, judged := st.mon.ObservePartial(cy, pl.skipped)
	p.mu.Lock()
	if judged {
		p.refreshLocked(st)
	}
	st.snap.LastError, st.snap.LastErrorKind = "", ""
	p.mu.Unlock()
	if res.Alert != nil {
		p.emit(st, *res.Alert, o)
	}
	p.notifyStatus(st, o)
	if judged {
		o.add(func() { p.saveState(ctx, st) })
	}
	return len(res.IdentityChanges) > 0
}
