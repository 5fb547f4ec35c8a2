package toylm

import (
	"sync"
	"testing"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Seeded harness runs, small enough for CI. `fleetwatch drift sim` runs the
// full evaluation reported in docs/DRIFT.md.

// variantsOnce calibrates the variants once for all tests (the KL search
// is the slow part).
var variantsOnce = sync.OnceValue(func() map[string]Variant {
	vs := map[string]Variant{}
	for _, v := range Variants(New(Config{})) {
		vs[v.Name] = v
	}
	return vs
})

func testHarness(t *testing.T) (*Harness, map[string]Variant) {
	t.Helper()
	s, err := drift.LoadSuite("")
	if err != nil {
		t.Fatal(err)
	}
	// serve's defaults: a cycle every 5 minutes, enrolment over 2 hours;
	// the sampled tier alone (teacher_test.go tests the teacher tier, which
	// costs three times as much per cycle)
	return &Harness{Suite: s, Ref: New(Config{}), Teacher: drift.TeacherOff}, variantsOnce()
}

func TestSwapCaughtInOneCycleAtEveryNoiseLevel(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	for _, sigma := range append(NoiseLevels, LoadRegime) {
		r, err := h.Power(vs["swap"], sigma, 2, 1, 11)
		if err != nil {
			t.Fatal(err)
		}
		if r.DriftedWithin(1) != r.Trials {
			t.Errorf("sigma %s: swap drifted in one cycle in %d of %d trials (%v)", SigmaName(sigma), r.DriftedWithin(1), r.Trials, r.DriftedDelay)
		}
	}
}

func TestQ4CaughtInOneCycle(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	for _, sigma := range NoiseLevels {
		r, err := h.Power(vs["q4-like"], sigma, 3, 1, 12)
		if err != nil {
			t.Fatal(err)
		}
		if r.DriftedWithin(1) != r.Trials {
			t.Errorf("sigma %s: q4-like drifted in one cycle in %d of %d trials (%v)", SigmaName(sigma), r.DriftedWithin(1), r.Trials, r.DriftedDelay)
		}
	}
}

func TestQ8CaughtWithinThreeCyclesAtSigma003(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	r, err := h.Power(vs["q8-like"], 0.03, 4, 3, 13)
	if err != nil {
		t.Fatal(err)
	}
	if r.Within(3) != r.Trials {
		t.Errorf("q8-like left ok within 3 cycles in %d of %d trials (%v)", r.Within(3), r.Trials, r.SuspectDelay)
	}
}

func TestFP16NeverAlarms(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	fp16 := vs["fp16"]
	for _, sigma := range NoiseLevels {
		r, err := h.Null(sigma, &fp16, 2, nullCycles, 14)
		if err != nil {
			t.Fatal(err)
		}
		if r.Alarms != 0 || r.Gross != 0 {
			t.Errorf("sigma %s: fp16 rounding gave %d alarms and %d gross signals in %d cycles", SigmaName(sigma), r.Alarms, r.Gross, r.Cycles)
		}
	}
}

func TestUnchangedBackendStaysOK(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, _ := testHarness(t)
	for _, sigma := range append(NoiseLevels, LoadRegime) {
		r, err := h.Null(sigma, nil, 2, nullCycles, 15)
		if err != nil {
			t.Fatal(err)
		}
		if r.Alarms != 0 || r.Gross != 0 {
			t.Errorf("sigma %s: %d alarms and %d gross signals in %d unchanged cycles", SigmaName(sigma), r.Alarms, r.Gross, r.Cycles)
		}
	}
}

func TestQ4PeerAmongThreeIsNamed(t *testing.T) {
	statistical(t)
	t.Parallel()
	h, vs := testHarness(t)
	for _, sigma := range NoiseLevels {
		r, err := h.Peers(vs["q4-like"], sigma, 3, 1, 16)
		if err != nil {
			t.Fatal(err)
		}
		if r.Named != r.Trials {
			t.Errorf("sigma %s: q4-like peer named in %d of %d trials (wrong %d; distances %v vs %v)", SigmaName(sigma), r.Named, r.Trials, r.WrongName, r.Distances, r.OthersDistances)
		}
	}
	r, err := h.Peers(vs["fp16"], 0.03, 3, 2, 17)
	if err != nil {
		t.Fatal(err)
	}
	if r.Named+r.WrongName != 0 {
		t.Errorf("fp16 peer: an outlier was named in %d of %d trials", r.Named+r.WrongName, r.Trials)
	}
}

// statistical marks a test of the toy model's statistics: under the race
// detector it skips and TestStatisticsWithoutTheRaceDetector runs it in a
// plain test binary (race_test.go).
func statistical(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skipf("single-goroutine statistics: run without the race detector by TestStatisticsWithoutTheRaceDetector (or: go test -run '^%s$' ./internal/toylm)", t.Name())
	}
}

// nullCycles is how many unchanged cycles the null tests run; `fleetwatch
// drift sim` runs thousands.
const nullCycles = 100

// calibrationTargets are the KL targets whose calibration the tests check.
var calibrationTargets = []float64{KLQ8, KLQ6, KLQ4}
