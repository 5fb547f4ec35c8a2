package toylm

import (
	"testing"
)

// The sampled tier's persistence test (docs/DRIFT.md "The sampled tier
// under load noise"): seeded, a few hundred cycles, against the CUSUM on
// S4's z it replaced.

// TestSampledTierCorrelatedNull: under the correlated-noise null (numeric
// paths by batch shape, shared by consecutive cycles, on top of the load
// regime) the old statistic raises false drifted verdicts at this seed and
// the persistence test none.
func TestSampledTierCorrelatedNull(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, _ := testHarness(t)
	const seed, backends, cycles = 34, 2, 300
	old := *h
	old.LegacyS4 = true
	ro, err := old.Null(CorrelatedNoise, nil, backends, cycles, seed)
	if err != nil {
		t.Fatal(err)
	}
	if ro.Drifted == 0 {
		t.Fatalf("the old statistic raised no drifted verdict at seed %d (%+v): the test no longer shows the fix", seed, ro)
	}
	r, err := h.Null(CorrelatedNoise, nil, backends, cycles, seed)
	if err != nil {
		t.Fatal(err)
	}
	if r.Drifted != 0 || r.Gross != 0 {
		t.Errorf("persistence test under correlated noise: %d drifted, %d gross in %d cycles (old statistic: %d drifted); want none", r.Drifted, r.Gross, r.Cycles, ro.Drifted)
	}
	t.Logf("correlated null, seed %d, %d cycles: old %d alarms %d drifted; persistence test %d alarms %d drifted", seed, r.Cycles, ro.Alarms, ro.Drifted, r.Alarms, r.Drifted)
}

// TestSampledTierKeepsQ8Power: q8-like at sigma 0.1 still leaves ok within
// 10 cycles in nearly every trial (the old statistic: 6 of these 8).
func TestSampledTierKeepsQ8Power(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	r, err := h.Power(vs["q8-like"], 0.1, 8, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if k := r.Within(10); k < 7 {
		t.Errorf("q8-like at sigma 0.1: left ok within 10 cycles in %d of %d trials (%v), want at least 7", k, r.Trials, r.SuspectDelay)
	}
}

// TestCorrelatedNoiseDeterministic: the correlated level is a function of
// the seed.
func TestCorrelatedNoiseDeterministic(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, _ := testHarness(t)
	a, err := h.Null(CorrelatedNoise, nil, 1, 20, 5)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Null(CorrelatedNoise, nil, 1, 20, 5)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("two runs of one seed differ: %+v and %+v", a, b)
	}
	if SigmaName(CorrelatedNoise) != "correlated" {
		t.Errorf("SigmaName(CorrelatedNoise) = %q", SigmaName(CorrelatedNoise))
	}
	if _, err := Levels("bogus"); err == nil {
		t.Error("Levels accepted an unknown noise model")
	}
}
