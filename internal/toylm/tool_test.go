package toylm

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func toolHarness(t *testing.T) *ToolHarness {
	t.Helper()
	s, err := drift.LoadSuite("default-v1+tools-v1")
	if err != nil {
		t.Fatal(err)
	}
	return &ToolHarness{Harness: Harness{Suite: ToolOnlySuite(s), Ref: New(Config{})}}
}

// Seeded short runs of the tool tier; `fleetwatch drift sim --tools-only`
// runs the evaluation reported in docs/DRIFT.md.

func TestToolFallOfTwentyPointsCaughtWithinTwoCycles(t *testing.T) {
	statistical(t)
	t.Parallel()
	h := toolHarness(t)
	r, err := h.ToolPower(0.2, nil, 20, 2, 21)
	if err != nil {
		t.Fatal(err)
	}
	// the measured power is about 0.95 (docs/DRIFT.md); 20 trials below
	// 15 would be far outside it
	if got := r.Within(2); got < r.Trials*3/4 {
		t.Errorf("caught within 2 cycles in %d of %d trials (%v)", got, r.Trials, r.SuspectDelay)
	}
}

func TestToolNullIsQuiet(t *testing.T) {
	statistical(t)
	t.Parallel()
	h := toolHarness(t)
	r, err := h.ToolNull(2, 100, 22)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cycles != 2*100 || r.Gross > 0 || r.Drifted > 0 || r.Alarms > 1 {
		t.Errorf("null %+v, want no gross signal, no verdict, at most one suspect", r)
	}
}

func TestToolReport(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := WriteToolReport(t.Context(), &out, ToolReportSettings{Cycles: 20, Backends: 1, Trials: 2, PeerTrials: 2, MaxDelay: 3, Enrol: 4, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Tool-call probes (suite default-v1+tools-v1: 48 tool prompts, 40 expecting a call; seed 3)",
		"| hard prompts | unchanged | 20 |", "| iid failures | unchanged | 20 |", "| hard prompts | 20 points | every mode |",
		"| hard prompts | 20 points | invalid_json |", "| iid failures | 30 points | every mode |", "| 30 points |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
