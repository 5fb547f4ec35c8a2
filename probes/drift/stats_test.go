package drift

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

var approx = cmp.Options{cmpopts.EquateApprox(0, 1e-9), cmpopts.EquateNaNs()}

func tok(t string, lp float64, top ...Alt) Token { return Token{Token: t, Logprob: lp, Top: top} }

// handBaseline is a two-prompt baseline whose statistics are computed by
// hand in TestMeasureHandComputed.
func handBaseline() *Baseline {
	return &Baseline{Logprobs: true, Prompts: []PromptBaseline{
		{ID: "a", Kind: KindStable, Mode: []string{"a", "b", "c"}, Positions: []PositionBaseline{
			{Top1: -0.1, Alts: []Alt{{"a", -0.1}, {"x", -2.0}}, Floor: -3, N: 8},
			{Top1: -0.2, Alts: []Alt{{"b", -0.2}}, Floor: -3, N: 8},
			{Top1: -0.3, Alts: []Alt{{"c", -0.3}}, Floor: -3, N: 8},
		}},
		{ID: "b", Kind: KindOneToken, Mode: []string{"z"}, Positions: []PositionBaseline{
			{Top1: -0.5, Alts: []Alt{{"z", -0.5}, {"w", -1.0}}, Floor: -4, N: 8},
		}},
	}}
}

func TestMeasureHandComputed(t *testing.T) {
	c := &Cycle{Obs: []Observation{
		{HasLogprobs: true, Tokens: []Token{
			tok("a", -0.15, Alt{"a", -0.15}, Alt{"x", -1.9}, Alt{"y", -2.5}),
			tok("b", -0.2, Alt{"b", -0.2}),
			tok("d", -0.5, Alt{"d", -0.5}, Alt{"c", -0.9}), // first divergence: c is at -0.9
			tok("e", -0.1), // after the divergence: ignored
		}},
		{HasLogprobs: true, Tokens: []Token{tok("z", -0.6, Alt{"z", -0.6}, Alt{"w", -0.9})}},
	}}
	got := Measure(handBaseline(), c)
	want := Stats{
		S1: 1, // the one stable prompt changed
		// |-0.15+0.1| + |-0.2+0.2| + |-0.9+0.3| + |-0.6+0.5| over 4 positions
		S2: (0.05 + 0 + 0.6 + 0.1) / 4,
		// prompt a: a 0.05, x 0.1, y at the baseline floor |-2.5+3| = 0.5;
		// prompt b: z 0.1, w 0.1
		S3:         ((0.05+0.1+0.5)/3 + (0.1+0.1)/2) / 2,
		S4:         math.NaN(), // needs a previous cycle
		Positions:  4,
		ExactMatch: 0.5,
		Mismatched: 1, Stable: 1,
	}
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("Measure (-want +got):\n%s", diff)
	}
}

func TestMeasureWithoutLogprobs(t *testing.T) {
	b := handBaseline()
	b.Logprobs = false
	c := &Cycle{Obs: []Observation{
		{Tokens: []Token{{Token: "a"}, {Token: "b"}, {Token: "c"}}},
		{Tokens: []Token{{Token: "q"}}},
	}}
	got := Measure(b, c)
	if got.S1 != 0 || got.ExactMatch != 0.5 || !math.IsNaN(got.S2) || !math.IsNaN(got.S3) {
		t.Errorf("Measure = %+v, want S1 0, exact match 0.5, S2 and S3 NaN", got)
	}
}

func TestLookup(t *testing.T) {
	tk := tok("a", -0.1, Alt{"a", -0.1}, Alt{"b", -1}, Alt{"c", -2})
	for _, tc := range []struct {
		s    string
		want float64
	}{{"a", -0.1}, {"b", -1}, {"c", -2}, {"zz", -2}} {
		if got := lookup(&tk, tc.s); got != tc.want {
			t.Errorf("lookup(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func oneTokenSuite(t *testing.T) *Suite {
	t.Helper()
	s, err := ParseSuite([]byte(`{"name":"one","prompts":[{"id":"p","kind":"one-token","text":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestBuildBaselineLeaveOneOut(t *testing.T) {
	s := oneTokenSuite(t)
	var cycles []*Cycle
	for i, lp := range []float64{-0.1, -0.2, -0.3} {
		cycles = append(cycles, &Cycle{At: time.Unix(int64(i), 0), Obs: []Observation{
			{HasLogprobs: true, Tokens: []Token{tok("z", lp, Alt{"z", lp})}},
		}})
	}
	b, err := BuildBaseline(s, cycles, 0.002)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"z"}, b.Prompts[0].Mode); diff != "" {
		t.Errorf("mode (-want +got):\n%s", diff)
	}
	if got := b.Prompts[0].Positions[0].Top1; math.Abs(got+0.2) > 1e-12 {
		t.Errorf("mean top-1 logprob = %v, want -0.2", got)
	}
	// leaving out -0.1: the others average -0.25, |-0.1+0.25| = 0.15;
	// leaving out -0.2: 0; leaving out -0.3: 0.15. Median 0.15, MAD 0,
	// so sigma is the floor.
	want := NullStat{Mu: 0.15, Sigma: 0.002, Values: []float64{0.15, 0, 0.15}}
	if diff := cmp.Diff(want, b.Null.S2, approx); diff != "" {
		t.Errorf("S2 null (-want +got):\n%s", diff)
	}
}

func TestNullStatMAD(t *testing.T) {
	// median 3, absolute deviations 2 1 0 1 7 -> MAD 1, sigma 1.4826
	got := nullStat([]float64{1, 2, 3, 4, 10}, 0.002)
	if diff := cmp.Diff(NullStat{Mu: 3, Sigma: 1.4826, Values: []float64{1, 2, 3, 4, 10}}, got, approx); diff != "" {
		t.Errorf("nullStat (-want +got):\n%s", diff)
	}
}

func TestCUSUM(t *testing.T) {
	p := Params{}.WithDefaults()
	type step struct {
		z, excess float64
		wantC     float64
		alarm     bool
	}
	for _, tc := range []struct {
		name  string
		reset int // reset with this cooldown before the steps (-1: none)
		steps []step
	}{
		{"accumulates and alarms above h", -1, []step{{5, 0.01, 4.5, false}, {5, 0.01, 9, true}}},
		{"below slack stays at zero", -1, []step{{0.4, 0.001, 0, false}, {-3, -0.01, 0, false}}},
		{"z is capped", -1, []step{{100, 1, 9.5, true}}},
		{"absolute floor blocks a tiny excess", -1, []step{{5, 0.001, 4.5, false}, {5, 0.001, 9, false}}},
		{"run excess restarts when C returns to 0", -1, []step{{5, 0.001, 4.5, false}, {-10, 0, 0, false}, {5, 0.01, 4.5, false}, {5, 0.01, 9, true}}},
		{"cooldown holds alarms", 2, []step{{10, 0.1, 9.5, false}, {10, 0.1, 19, false}, {10, 0.1, 28.5, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c CUSUM
			if tc.reset >= 0 {
				c.C = 50
				c.Reset(tc.reset)
			}
			for i, s := range tc.steps {
				alarm := c.Update(s.z, s.excess, p.MinExcessNats, p)
				if math.Abs(c.C-s.wantC) > 1e-9 || alarm != s.alarm {
					t.Fatalf("step %d: C = %v alarm %v, want %v %v", i, c.C, alarm, s.wantC, s.alarm)
				}
			}
		})
	}
}

func TestDetectorTransitions(t *testing.T) {
	p := Params{}.WithDefaults()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	gross := Signal{Gross: true}
	alarm := Signal{Alarm: true, Confirm: true}
	weak := Signal{Alarm: true} // CUSUM still high, this cycle alone unremarkable
	quiet := Signal{Quiet: true}
	loud := Signal{}
	for _, tc := range []struct {
		name  string
		start fleetwatch.DriftStatus
		sigs  []Signal
		want  []fleetwatch.DriftStatus // status after each signal
	}{
		{"gross is drifted at once", fleetwatch.DriftOK, []Signal{gross}, []fleetwatch.DriftStatus{"drifted"}},
		{"alarm then confirm", fleetwatch.DriftOK, []Signal{alarm, alarm}, []fleetwatch.DriftStatus{"suspect", "drifted"}},
		{"alarm then gross", fleetwatch.DriftOK, []Signal{alarm, gross}, []fleetwatch.DriftStatus{"suspect", "drifted"}},
		{"unconfirmed suspect returns to ok", fleetwatch.DriftOK, []Signal{alarm, weak}, []fleetwatch.DriftStatus{"suspect", "ok"}},
		{"unknown counts as ok", fleetwatch.DriftUnknown, []Signal{quiet, alarm}, []fleetwatch.DriftStatus{"ok", "suspect"}},
		{"drifted recovers after 3 quiet cycles", fleetwatch.DriftDrifted, []Signal{quiet, quiet, loud, quiet, quiet, quiet},
			[]fleetwatch.DriftStatus{"drifted", "drifted", "drifted", "drifted", "drifted", "ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Detector{Status: tc.start}
			var got []fleetwatch.DriftStatus
			for i, s := range tc.sigs {
				d.Step(t0.Add(time.Duration(i)*time.Hour), s, p)
				got = append(got, d.Status)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("statuses (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDetectorResetsCUSUMWithCooldown(t *testing.T) {
	p := Params{}.WithDefaults()
	d := Detector{Status: fleetwatch.DriftSuspect}
	d.CUSUM.C = 20
	tr, ok := d.Step(time.Unix(100, 0), Signal{Alarm: true, Confirm: true}, p)
	if !ok || tr.To != fleetwatch.DriftDrifted {
		t.Fatalf("transition = %+v %v, want to drifted", tr, ok)
	}
	if diff := cmp.Diff(CUSUM{Cooldown: p.Cooldown}, d.CUSUM); diff != "" {
		t.Errorf("CUSUM after a verdict (-want +got):\n%s", diff)
	}
	if !d.Since.Equal(time.Unix(100, 0)) {
		t.Errorf("Since = %v", d.Since)
	}
}

func TestBenjaminiHochberg(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name string
		p    []float64
		q    float64
		want []bool
	}{
		{"all under their step", []float64{0.01, 0.04, 0.03, 0.005}, 0.05, []bool{true, true, true, true}},
		// thresholds 0.0167 0.0333 0.05: 0.02 fails its own step but the
		// step-up rule rejects it with 0.03
		{"step-up", []float64{0.02, 0.03, 0.2}, 0.05, []bool{true, true, false}},
		{"none", []float64{0.5, 0.2}, 0.05, []bool{false, false}},
		{"NaN ignored and not counted", []float64{nan, 0.04, 0.5}, 0.05, []bool{false, false, false}},
		{"NaN with one test", []float64{nan, 0.004}, 0.005, []bool{false, true}},
		{"empty", nil, 0.05, []bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, BenjaminiHochberg(tc.p, tc.q), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestClopperPearson(t *testing.T) {
	for _, tc := range []struct {
		k, n           int
		wantLo, wantHi float64
	}{
		{0, 10, 0, 1 - math.Pow(0.025, 0.1)}, // closed forms at the edges
		{10, 10, math.Pow(0.025, 0.1), 1},
		{5, 10, 0.187086, 0.812914}, // R: binom.test(5, 10)$conf.int
		{0, 2000, 0, 1 - math.Pow(0.025, 1.0/2000)},
		{1, 100, 0.000253, 0.054460},
	} {
		lo, hi := ClopperPearson(tc.k, tc.n, 0.05)
		if math.Abs(lo-tc.wantLo) > 1e-5 || math.Abs(hi-tc.wantHi) > 1e-5 {
			t.Errorf("ClopperPearson(%d, %d) = [%.6f, %.6f], want [%.6f, %.6f]", tc.k, tc.n, lo, hi, tc.wantLo, tc.wantHi)
		}
	}
}

func TestHamming(t *testing.T) {
	for _, tc := range []struct {
		a, b Sample
		want float64
	}{
		{Sample{0, []string{"a", "b", "c"}}, Sample{0, []string{"a", "x"}}, 1.0 / 3},
		{Sample{0, []string{"a", "b"}}, Sample{0, []string{"a", "b"}}, 1},
		{Sample{0, []string{"a"}}, Sample{1, []string{"a"}}, 0},
		{Sample{0, nil}, Sample{0, nil}, 1},
	} {
		if got := hamming(tc.a, tc.b); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("hamming(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestMMDTest(t *testing.T) {
	var same, other []Sample
	for p := range 4 {
		for range 6 {
			same = append(same, Sample{p, []string{"a", "b", "c"}})
			other = append(other, Sample{p, []string{"x", "y", "c"}})
		}
	}
	if _, p := mmdTest(same, same, 99, 1); p < 0.5 {
		t.Errorf("identical samples: p = %v, want large", p)
	}
	stat, p := mmdTest(same, other, 99, 1)
	if p != 0.01 || stat <= 0 {
		t.Errorf("disjoint samples: stat %v p %v, want > 0 and 1/(1+99)", stat, p)
	}
	// by hand: per side 24 samples, 552 ordered pairs of which 120 share a
	// prompt (kernel 1); across, 576 pairs of which 144 share a prompt
	// (kernel 1/3, "c" only)
	if want := 2*120.0/552 - 2*(144.0/3)/576; math.Abs(stat-want) > 1e-9 {
		t.Errorf("MMD^2 = %v, want %v", stat, want)
	}
}

func TestComparePeers(t *testing.T) {
	mk := func(lp float64) *Baseline {
		return &Baseline{Logprobs: true, SuiteHash: "h", Prompts: []PromptBaseline{{Mode: []string{"z"},
			Positions: []PositionBaseline{{Top1: lp, Alts: []Alt{{"z", lp}}, Floor: -5}}}}}
	}
	v := ComparePeers(map[string]*Baseline{"a": mk(-0.1), "b": mk(-0.11), "c": mk(-0.4)}, Params{})
	if v.Outlier != "c" || math.Abs(v.OutlierDistance-0.295) > 1e-9 || math.Abs(v.OthersDistance-0.01) > 1e-9 {
		t.Errorf("three peers: %+v, want c named at 0.295 vs 0.01", v)
	}
	v = ComparePeers(map[string]*Baseline{"a": mk(-0.1), "b": mk(-0.11), "c": mk(-0.12)}, Params{})
	if v.Outlier != "" {
		t.Errorf("three close peers: outlier %q named", v.Outlier)
	}
	// 0.06 >= 0.05 but not 3x the others' 0.03
	v = ComparePeers(map[string]*Baseline{"a": mk(-0.1), "b": mk(-0.13), "c": mk(-0.19)}, Params{})
	if v.Outlier != "" {
		t.Errorf("ratio rule: outlier %q named (%+v)", v.Outlier, v)
	}
	v = ComparePeers(map[string]*Baseline{"a": mk(-0.1), "b": mk(-0.4)}, Params{})
	if !v.PairDiffers || v.Pair != [2]string{"a", "b"} || v.Outlier != "" {
		t.Errorf("two peers: %+v, want the pair reported, nobody named", v)
	}
}

func TestPersistentDeltaHandComputed(t *testing.T) {
	b := &Baseline{Logprobs: true, Prompts: []PromptBaseline{{ID: "p", Kind: KindStable, Mode: []string{"a", "b"},
		Positions: []PositionBaseline{{Top1: -0.1, N: 8}, {Top1: -0.2, N: 8}}}}}
	cyc := func(lpA, lpB float64) *Cycle {
		return &Cycle{Obs: []Observation{{HasLogprobs: true, Tokens: []Token{tok("a", lpA), tok("b", lpB)}}}}
	}
	// deltas now (-0.1, -0.1), before (0.05, -0.2): products -0.005 and
	// 0.02, mean 0.0075, S4 = sqrt(0.0075)
	if got, want := persistentDelta(b, cyc(-0.2, -0.3), cyc(-0.05, -0.4)), math.Sqrt(0.0075); math.Abs(got-want) > 1e-12 {
		t.Errorf("S4 = %v, want %v", got, want)
	}
	// opposite shifts: a negative mean product gives a negative S4
	if got, want := persistentDelta(b, cyc(-0.2, -0.3), cyc(0, -0.1)), -math.Sqrt(0.01); math.Abs(got-want) > 1e-12 {
		t.Errorf("S4 = %v, want %v", got, want)
	}
	if got := persistentDelta(b, cyc(-0.2, -0.3), nil); !math.IsNaN(got) {
		t.Errorf("S4 without a previous cycle = %v, want NaN", got)
	}
}

func TestNullStatDropsNaN(t *testing.T) {
	got := nullStat([]float64{math.NaN(), 1, 2, 3}, 0.002)
	if diff := cmp.Diff(NullStat{Mu: 2, Sigma: 1.4826, Values: []float64{1, 2, 3}}, got, approx); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	empty := nullStat([]float64{math.NaN()}, 0.002)
	if !math.IsNaN(empty.Z(1)) {
		t.Errorf("Z without a null = %v, want NaN", empty.Z(1))
	}
	if _, err := (&Baseline{V: 1, Null: NullModel{S2: empty}}).Marshal(); err != nil {
		t.Errorf("a baseline without an S2 null does not encode: %v", err)
	}
}

func TestSampledPersistence(t *testing.T) {
	const n = 12
	mode := make([]string, n)
	pos := make([]PositionBaseline, n)
	for j := range n {
		mode[j] = string(rune('a' + j))
		pos[j] = PositionBaseline{Top1: -0.5, N: 16, Var: 1.6e-9} // B = 1e-10
	}
	b := &Baseline{Logprobs: true, Prompts: []PromptBaseline{{ID: "p", Kind: KindStable, Mode: mode, Positions: pos}}}
	cyc := func(d func(j int) float64) *Cycle {
		toks := make([]Token, n)
		for j := range n {
			toks[j] = tok(mode[j], -0.5+d(j))
		}
		return &Cycle{Obs: []Observation{{HasLogprobs: true, Tokens: toks}}}
	}
	// noise-like deltas of two cycles, then the same at 10 times the
	// noise level: T does not move (self-normalised), Shift scales
	now := func(k float64) *Cycle { return cyc(func(j int) float64 { return k * 0.01 * float64((j*7)%5-2) }) }
	prev := func(k float64) *Cycle { return cyc(func(j int) float64 { return k * 0.01 * float64((j*3)%4-1) }) }
	lo := SampledPersistence(b, now(1), []*Cycle{prev(1)})
	hi := SampledPersistence(b, now(10), []*Cycle{prev(10)})
	if math.IsNaN(lo.T) || math.Abs(lo.T-hi.T) > 1e-3*math.Max(1, math.Abs(lo.T)) {
		t.Errorf("T at noise 1x %v and 10x %v: want equal", lo.T, hi.T)
	}
	if lo.N != n || lo.Path != 0 {
		t.Errorf("N %d Path %v, want %d and 0 (no S4 null values)", lo.N, lo.Path, n)
	}
	// a shift shared by both cycles is seen
	shift := func(c *Cycle) *Cycle {
		for j := range c.Obs[0].Tokens {
			c.Obs[0].Tokens[j].Logprob += 0.05
		}
		return c
	}
	if sh := SampledPersistence(b, shift(now(1)), []*Cycle{shift(prev(1))}); !(sh.T > lo.T+5) || !(sh.Shift > 0.04) {
		t.Errorf("shared shift of 0.05: T %v (without %v), Shift %v", sh.T, lo.T, sh.Shift)
	}
	if ps := SampledPersistence(b, now(1), nil); !math.IsNaN(ps.T) {
		t.Errorf("T without a previous cycle = %v, want NaN", ps.T)
	}
	// a baseline stored before the test (no variances): NaN, the CUSUM
	// runs on S4's z
	for j := range pos {
		pos[j].Var = 0
	}
	if ps := SampledPersistence(b, now(1), []*Cycle{prev(1)}); !math.IsNaN(ps.T) || ps.Own != 0 {
		t.Errorf("without variances: T %v Own %v, want NaN and 0", ps.T, ps.Own)
	}
}
