package probes_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// manualClock is a clock the test moves.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// budgetProber probes one toy backend with the suite default-v1+tools-v1
// and the budget given, on a manual clock, with baselines in store.
func budgetProber(t *testing.T, url string, perDay int64, store *mapStore, clock *manualClock, set *metrics.Set) *probes.Prober {
	t.Helper()
	cost := 2.0
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: url,
		BudgetTokensPerDay: perDay, CostPerMTok: &cost}},
		Suite: toolSuite(t), Store: store, Enrol: 3, EnrolMin: -1, Now: clock.Now, Metrics: set, Jitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func probeOnce(t *testing.T, p *probes.Prober) probes.BackendStatus {
	t.Helper()
	if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
		t.Fatal(err)
	}
	return p.Statuses()[0]
}

// tierCosts enrols the backend without a budget and returns what each tier
// cost in the last cycle.
func tierCosts(t *testing.T, url string, store *mapStore, clock *manualClock) map[string]int64 {
	t.Helper()
	p := budgetProber(t, url, 0, store, clock, nil)
	var st probes.BackendStatus
	for range 3 {
		clock.Add(time.Hour)
		st = probeOnce(t, p)
	}
	if st.Enrolling || st.Status != fleetwatch.DriftOK {
		t.Fatalf("after enrolment: %+v", st)
	}
	b := st.Budget
	if b == nil || b.TokensPerDay != 0 || len(b.Skipped) != 0 {
		t.Fatalf("unlimited budget %+v", b)
	}
	costs := map[string]int64{}
	for _, tier := range []string{probes.TierTeacher, probes.TierSampled, probes.TierTools} {
		costs[tier] = int64(b.Estimate[tier]) // the last cycle's
		if costs[tier] <= 0 || b.Spent[tier] < 3*costs[tier]/2 {
			t.Fatalf("%s: %d tokens the last cycle, %d in three", tier, costs[tier], b.Spent[tier])
		}
	}
	return costs
}

// TestProbeBudgetPaysTheCheapestTiersFirst: a budget that pays only the
// teacher tier skips the sampled and tool-call tiers, says so in the
// status, drift status and metrics, sends none of their requests, and
// still judges the teacher tier; the bucket refills over the (injected)
// day, and the skipped tiers run again when it holds their cost.
func TestProbeBudgetPaysTheCheapestTiersFirst(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 1})
	fs, hs := toyServer(t, m, fakeai.Behavior{})
	store := &mapStore{m: map[string][]byte{}}
	clock := &manualClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	costs := tierCosts(t, hs.URL, store, clock)
	t.Logf("tokens per cycle: %v", costs)
	teacher, sampled, tools := costs[probes.TierTeacher], costs[probes.TierSampled], costs[probes.TierTools]

	// A day's budget of the teacher tier and a quarter of the sampled one,
	// by the estimates before the first run (the suite's, from its texts).
	set := metrics.NewSet()
	est := budgetProber(t, hs.URL, 1, store, clock, nil).Statuses()[0].Budget.Estimate
	t.Logf("static estimates: %v", est)
	if est[probes.TierTeacher] < float64(teacher) || est[probes.TierSampled] < float64(sampled) || est[probes.TierTools] < float64(tools) {
		t.Errorf("static estimates %v below the cost %v", est, costs)
	}
	perDay := int64(est[probes.TierTeacher] + est[probes.TierSampled]/4)
	p := budgetProber(t, hs.URL, perDay, store, clock, set)
	before := fs.Stats().Requests
	st := probeOnce(t, p)
	s := toolSuite(t)
	if got, want := fs.Stats().Requests-before, int64(len(s.Teacher)); got != want {
		t.Errorf("%d generation requests, want %d: the teacher tier's alone", got, want)
	}
	b := st.Budget
	if diff := cmp.Diff([]string{probes.TierSampled, probes.TierTools}, b.Skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	if b.TokensPerDay != perDay || b.Spent[probes.TierTeacher] != teacher || b.Spent[probes.TierSampled] != 0 || b.SpentTotal != teacher {
		t.Errorf("budget %+v, want %d teacher tokens spent of %d", b, teacher, perDay)
	}
	if b.CostTotal == nil || *b.CostTotal != float64(teacher)*2/1e6 {
		t.Errorf("cost %v, want %v", b.CostTotal, float64(teacher)*2/1e6)
	}
	if st.Status != fleetwatch.DriftOK || st.LastError != "" {
		t.Errorf("status %s (error %q), want ok", st.Status, st.LastError)
	}
	const note = "sampled and tool-call tiers skipped by the probe budget"
	if got := b.SkipNote(); got != note {
		t.Errorf("note %q, want %q", got, note)
	}
	now := clock.Now()
	rev := probes.BuildReview(now, now.Add(-24*time.Hour), nil, p.Statuses())
	if want := fmt.Sprintf("probes spent %d tokens in the last 24 h (cost %.4g); 1 backend(s) skipped probe tiers for the budget", teacher, float64(teacher)*2/1e6); !strings.Contains(rev.Summary, want) {
		t.Errorf("review summary %q lacks %q", rev.Summary, want)
	}
	if md := probes.RenderMarkdown(rev, p.Statuses()); !strings.Contains(md, fmt.Sprintf("| p | b | %d | %d | 0 | 0 | %d |", perDay, teacher, teacher)) || !strings.Contains(md, note) {
		t.Errorf("review digest lacks the spend:\n%s", md)
	}
	var text bytes.Buffer
	set.WritePrometheus(&text)
	for _, series := range []string{
		`fleetwatch_probe_budget_tokens_per_day{pool="p",backend="b"} `,
		`fleetwatch_probe_tokens_total{pool="p",backend="b",tier="teacher"} `,
		`fleetwatch_probe_cost_total{pool="p",backend="b",tier="teacher"} `,
		`fleetwatch_probe_tier_skipped_total{pool="p",backend="b",tier="sampled"} 1`,
		`fleetwatch_probe_tier_skipped_total{pool="p",backend="b",tier="tool_call"} 1`,
		`fleetwatch_probe_tier_skipped_total{pool="p",backend="b",tier="teacher"} 0`,
		`fleetwatch_probe_tokens_24h{pool="p",backend="b",tier="sampled"} 0`,
	} {
		if !strings.Contains(text.String(), series) {
			t.Errorf("metrics lack %s", series)
		}
	}
	if strings.Contains(text.String(), `fleetwatch_probe_tokens_total{pool="p",backend="b",tier="sampled"}`) {
		t.Error("a sampled spend was counted")
	}

	// The bucket refills at perDay/24h, but what is left of the 24 hours'
	// budget an hour later (sampled/2) still cannot pay the sampled tier.
	clock.Add(time.Hour)
	if st := probeOnce(t, p); !slices2(st.Budget.Skipped, probes.TierSampled) {
		t.Errorf("an hour later: skipped %v, want the sampled tier", st.Budget.Skipped)
	}
	// A day after the first cycle the window forgot it and the bucket is
	// full again, but a full day's budget never pays the sampled tier.
	clock.Add(24 * time.Hour)
	st = probeOnce(t, p)
	if !slices2(st.Budget.Skipped, probes.TierSampled) || st.Budget.Spent[probes.TierTeacher] != teacher {
		t.Errorf("a day later: %+v", st.Budget)
	}

	// A budget of a full cycle by the static estimates: the cycles at one
	// instant pay everything until the bucket (and the day's budget) holds
	// less than a cycle's actual cost; then they skip, and a day later
	// (injected) the bucket has refilled and the window has forgotten the
	// spend: all tiers run again.
	full := teacher + sampled + tools
	p2 := budgetProber(t, hs.URL, int64(est[probes.TierTeacher]+est[probes.TierSampled]+est[probes.TierTools]), store, clock, nil)
	paid := 0
	for st = probeOnce(t, p2); len(st.Budget.Skipped) == 0; st = probeOnce(t, p2) {
		paid++
		if paid > 30 {
			t.Fatalf("30 full cycles paid by a budget of %d tokens a day, at %d a cycle", st.Budget.TokensPerDay, full)
		}
	}
	if want := int(st.Budget.TokensPerDay / full); paid < want-1 || paid > want {
		t.Errorf("%d full cycles paid, want about %d (%d tokens a day, %d a cycle)", paid, want, st.Budget.TokensPerDay, full)
	}
	if st.Budget.SkipNote() == "" {
		t.Errorf("skipped %v without a note", st.Budget.Skipped)
	}
	before = fs.Stats().Requests
	clock.Add(24*time.Hour + time.Minute)
	st = probeOnce(t, p2)
	if len(st.Budget.Skipped) != 0 || st.Budget.SkipNote() != "" {
		t.Errorf("after the refill: skipped %v", st.Budget.Skipped)
	}
	if got, want := fs.Stats().Requests-before, int64(len(s.Teacher)+len(s.Prompts)+len(s.Tools.Prompts)); got != want {
		t.Errorf("%d generation requests after the refill, want %d (every tier)", got, want)
	}
	if st.Status != fleetwatch.DriftOK || len(st.Budget.SkippedTotal) == 0 {
		t.Errorf("after the refill: %s, skips %v", st.Status, st.Budget.SkippedTotal)
	}
}

// TestProbeBudgetEnrolsOnlyWholeCycles: while a backend enrols, a cycle the
// budget cannot pay in full sends no generation request, and the status
// says that enrolment waits.
func TestProbeBudgetEnrolsOnlyWholeCycles(t *testing.T) {
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 1})
	fs, hs := toyServer(t, m, fakeai.Behavior{})
	clock := &manualClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	p := budgetProber(t, hs.URL, 100, &mapStore{m: map[string][]byte{}}, clock, nil)
	st := probeOnce(t, p)
	if got := fs.Stats().Requests; got != 0 {
		t.Errorf("%d generation requests, want none", got)
	}
	if !st.Enrolling || st.EnrolCycles != 0 || !st.Budget.EnrolWaiting || st.Budget.SkipNote() != "enrolment waits for the probe budget" {
		t.Errorf("status %+v, budget %+v", st, st.Budget)
	}
	if len(st.Budget.Skipped) != 3 {
		t.Errorf("skipped %v, want every paid tier", st.Budget.Skipped)
	}
}

// TestProberRejectsNegativeBudget: a negative budget is an invalid target.
func TestProberRejectsNegativeBudget(t *testing.T) {
	_, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: "http://127.0.0.1:1", BudgetTokensPerDay: -1}}})
	if !errors.Is(err, probes.ErrInvalidTarget) {
		t.Fatalf("err = %v, want ErrInvalidTarget", err)
	}
}

func slices2(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestProbeBudgetTeacherTierAloneCatchesAChange: with a budget that pays
// the teacher tier alone, a quantized artefact is still caught, on the
// teacher tier, and the alert says which tiers the budget skipped.
func TestProbeBudgetTeacherTierAloneCatchesAChange(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	ref := toylm.New(toylm.Config{})
	q4, _ := ref.Quantized(toylm.KLQ4)
	o := toylm.Options{Sigma: 0.03, NoiseSeed: 5}
	sw := toylm.NewSwitch(ref.With(o))
	_, hs := toyServer(t, sw, fakeai.Behavior{})
	store := &mapStore{m: map[string][]byte{}}
	clock := &manualClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	settings := func(perDay int64, sink probes.Sink) probes.Settings {
		return probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL, BudgetTokensPerDay: perDay}},
			Store: store, Sink: sink, Enrol: 4, EnrolMin: -1, Now: clock.Now, Jitter: -1}
	}
	enrol, err := probes.New(settings(0, nil))
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		clock.Add(time.Hour)
		probeOnce(t, enrol)
	}
	fresh, err := probes.New(settings(1, nil))
	if err != nil {
		t.Fatal(err)
	}
	est := fresh.Statuses()[0].Budget.Estimate // the suite's, before any run
	sink := newSink()
	p, err := probes.New(settings(int64(est[probes.TierTeacher]+est[probes.TierSampled]/4), sink))
	if err != nil {
		t.Fatal(err)
	}
	sw.Set(q4.With(o))
	var drifted *fleetwatch.DriftAlert
	for range 6 {
		clock.Add(25 * time.Hour) // the window forgets the last day's spend
		st := probeOnce(t, p)
		if !slices2(st.Budget.Skipped, probes.TierSampled) || slices2(st.Budget.Skipped, probes.TierTeacher) {
			t.Fatalf("skipped %v, want the sampled tier alone", st.Budget.Skipped)
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
		t.Fatalf("q4-like not drifted within 6 teacher-only cycles: %+v", sink.alertsFor("b"))
	}
	if _, ok := drifted.Evidence.Extra["teacher_s2"]; !ok {
		t.Errorf("evidence lacks the teacher tier: %v", drifted.Evidence.Extra)
	}
	if diff := cmp.Diff([]string{probes.TierSampled}, drifted.Evidence.Extra["skipped_by_budget"]); diff != "" {
		t.Errorf("skipped_by_budget (-want +got):\n%s", diff)
	}
}

// TestProbeCostOfTheDefaultSuites measures what a cycle of the built-in
// suites costs per tier against the fake backend (whose usage counts one
// token per word and leaves the tool definitions out), beside the static
// estimates a budget starts from (four bytes a token, every answer at its
// max_tokens, the tool definitions counted), and per day at the default
// schedule (@every 5m: 288 cycles), and checks docs/DRIFT.md "Probe cost",
// which is its output (go test -count=1 -run
// TestProbeCostOfTheDefaultSuites -v ./probes/): every row of the table
// must be measured again, the static estimates exactly, the fake's tokens
// within 2% (the fake's answers are seeded, so today they are exact; the
// margin lets an unrelated change of the toy model's wording through
// without hiding a change of the suites or of the estimate), the requests
// and the per-day columns as computed from them.
func TestProbeCostOfTheDefaultSuites(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	const perDay = 288
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 1})
	_, hs := toyServer(t, m, fakeai.Behavior{})
	doc := probeCostTable(t)
	var rows []string
	check := func(suite, tier string, requests int, measured, est float64) {
		rows = append(rows, fmt.Sprintf("| %s | %s | %d | %.0f | %.0f | %.0f | %.0f |", suite, tier,
			requests, measured, est, measured*perDay, est*perDay))
		key := suite + " " + tier
		d, ok := doc[key]
		if !ok {
			t.Errorf("docs/DRIFT.md's probe cost table has no row %q", key)
			return
		}
		delete(doc, key)
		want := [5]float64{float64(requests), math.Round(measured), math.Round(est), math.Round(measured * perDay), math.Round(est * perDay)}
		for i, name := range []string{"requests/cycle", "tokens/cycle (fake)", "tokens/cycle (estimate)", "tokens/day (fake)", "tokens/day (estimate)"} {
			tol := 0.0
			if i == 1 || i == 3 {
				tol = 0.02 * want[i]
			}
			if math.Abs(d[i]-want[i]) > tol {
				t.Errorf("docs/DRIFT.md, %s: %s is %.0f, measured %.0f (tolerance %.0f)", key, name, d[i], want[i], tol)
			}
		}
	}
	for _, suite := range []string{"default-v1", "default-v1+tools-v1"} {
		s, err := drift.LoadSuite(suite)
		if err != nil {
			t.Fatal(err)
		}
		clock := &manualClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
		p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
			Suite: s, Enrol: 3, EnrolMin: -1, Now: clock.Now, Jitter: -1})
		if err != nil {
			t.Fatal(err)
		}
		static := p.Statuses()[0].Budget.Estimate
		var st probes.BackendStatus
		for range 4 { // enrolled after 3: the 4th is a judged cycle
			clock.Add(5 * time.Minute)
			st = probeOnce(t, p)
		}
		if st.Enrolling {
			t.Fatalf("%s: still enrolling", suite)
		}
		var total, totalStatic float64
		requests := 0
		for _, tier := range []string{probes.TierTeacher, probes.TierSampled, probes.TierTools} {
			measured, est := st.Budget.Estimate[tier], static[tier]
			if _, wanted := static[tier]; !wanted {
				continue
			}
			if measured <= 0 {
				t.Errorf("%s %s: no tokens measured", suite, tier)
			}
			total += measured
			totalStatic += est
			requests += tierRequestsOf(s, tier)
			check(suite, probes.TierName(tier), tierRequestsOf(s, tier), measured, est)
		}
		check(suite, "all", requests, total, totalStatic)
	}
	for key := range doc {
		t.Errorf("docs/DRIFT.md's probe cost table has a row %q that the test does not measure", key)
	}
	t.Logf("\n| suite | tier | requests/cycle | tokens/cycle (fake) | tokens/cycle (estimate) | tokens/day (fake) | tokens/day (estimate) |\n|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

// probeCostTable reads the table of docs/DRIFT.md "Probe cost": its five
// numbers by "suite tier".
func probeCostTable(t *testing.T) map[string][5]float64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "DRIFT.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n### Probe cost\n")
	if !ok {
		t.Fatal("docs/DRIFT.md has no section \"### Probe cost\"")
	}
	section, _, _ = strings.Cut(section, "\n#")
	out := map[string][5]float64{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| default") || len(cells) != 7 {
			continue
		}
		var v [5]float64
		for i, c := range cells[2:] {
			f, err := strconv.ParseFloat(strings.ReplaceAll(c, ",", ""), 64)
			if err != nil {
				t.Fatalf("docs/DRIFT.md, probe cost row %q: %v", line, err)
			}
			v[i] = f
		}
		out[cells[0]+" "+cells[1]] = v
	}
	if len(out) == 0 {
		t.Fatal("docs/DRIFT.md's probe cost table has no rows")
	}
	return out
}

func tierRequestsOf(s *drift.Suite, tier string) int {
	switch tier {
	case probes.TierTeacher:
		return len(s.Teacher)
	case probes.TierSampled:
		return len(s.Prompts)
	}
	return len(s.Tools.Prompts)
}

// TestProbeBudgetFollowsAReload: a reload that gives a backend a budget
// applies at its next cycle, with the spend of the last 24 hours counted
// against it.
func TestProbeBudgetFollowsAReload(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 1})
	_, hs := toyServer(t, m, fakeai.Behavior{})
	store := &mapStore{m: map[string][]byte{}}
	clock := &manualClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	costs := tierCosts(t, hs.URL, store, clock)
	p := budgetProber(t, hs.URL, 0, store, clock, nil)
	clock.Add(time.Minute)
	if st := probeOnce(t, p); len(st.Budget.Skipped) != 0 || st.Budget.SpentTotal == 0 {
		t.Fatalf("unlimited: %+v", st.Budget)
	}
	full := costs[probes.TierTeacher] + costs[probes.TierSampled] + costs[probes.TierTools]
	s := probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL, BudgetTokensPerDay: full + costs[probes.TierTeacher]}},
		Suite: toolSuite(t), Store: store, Enrol: 3, EnrolMin: -1, Now: clock.Now, Jitter: -1}
	if err := p.Update(s); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Minute)
	st := probeOnce(t, p)
	if diff := cmp.Diff([]string{probes.TierSampled, probes.TierTools}, st.Budget.Skipped); diff != "" {
		t.Errorf("after the reload, skipped (-want +got):\n%s", diff)
	}
	if st.Budget.TokensPerDay != full+costs[probes.TierTeacher] {
		t.Errorf("budget %d after the reload", st.Budget.TokensPerDay)
	}
}
