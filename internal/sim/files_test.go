package sim

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestSelectScenarios(t *testing.T) {
	all := Scenarios()
	got, err := SelectScenarios(all, "")
	if err != nil || len(got) != len(all) {
		t.Errorf("no names: %d scenarios, %v; want all %d", len(got), err, len(all))
	}
	got, err = SelectScenarios(all, "low-traffic, fast-failure")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sc := range got {
		names = append(names, sc.Name)
	}
	if diff := cmp.Diff([]string{"low-traffic", "fast-failure"}, names); diff != "" {
		t.Errorf("scenarios (-want +got):\n%s", diff)
	}
	if _, err := SelectScenarios(all, "low-traffic,nope"); err == nil ||
		err.Error() != `unknown scenario "nope" (fleetwatch sim --scenario list)` {
		t.Errorf("unknown name: %v", err)
	}
}

// csvOf returns the CSV of every run in results.
func csvOf(t *testing.T, results [][][]*Result) string {
	t.Helper()
	var flat []*Result
	for _, s := range results {
		for _, p := range s {
			flat = append(flat, p...)
		}
	}
	var b bytes.Buffer
	if err := WriteCSV(&b, flat, true); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestRunScenariosMatchesSequentialRuns runs two scenarios with two
// policies and two seeds in parallel and one by one: the same results, in
// [scenario][policy][seed] order, and no worker left behind.
func TestRunScenariosMatchesSequentialRuns(t *testing.T) {
	defer goleak.VerifyNone(t)
	scenarios, err := SelectScenarios(Scenarios(), "fast-failure,low-traffic")
	if err != nil {
		t.Fatal(err)
	}
	for i := range scenarios {
		scenarios[i] = scenarios[i].Shorten(20 * time.Second)
		scenarios[i].Policies = []string{"random", "fleetwatch"}
	}
	got, err := RunScenarios(context.Background(), scenarios, 7, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n := CountRuns(got); n != 2*2*2 {
		t.Errorf("CountRuns = %d, want 8", n)
	}
	want := make([][][]*Result, len(scenarios))
	for s, sc := range scenarios {
		for _, pol := range PoliciesOf(sc) {
			var runs []*Result
			for k := range 2 {
				r, err := Run(sc, pol, 7+uint64(k))
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, r)
			}
			want[s] = append(want[s], runs)
		}
	}
	if diff := cmp.Diff(csvOf(t, want), csvOf(t, got)); diff != "" {
		t.Errorf("parallel runs differ from sequential ones (-want +got):\n%s", diff)
	}

	dir := filepath.Join(t.TempDir(), "out")
	if err := WriteFiles(dir, scenarios, got, "tables\n"); err != nil {
		t.Fatal(err)
	}
	csv, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil || string(csv) != csvOf(t, got) {
		t.Errorf("results.csv is not the CSV of every run (%v)", err)
	}
	if md, err := os.ReadFile(filepath.Join(dir, "tables.md")); err != nil || string(md) != "tables\n" {
		t.Errorf("tables.md: %q %v", md, err)
	}
	for _, name := range []string{"shares-fast-failure.csv", "fast-failure-share.svg", "fast-failure-ttft.svg",
		"shares-low-traffic.csv", "low-traffic-share.svg", "low-traffic-ttft.svg"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v, want a non-empty file", name, err)
		}
	}
}

func TestRunScenariosStopsWithTheContextOrAnError(t *testing.T) {
	defer goleak.VerifyNone(t)
	scenarios, err := SelectScenarios(Scenarios(), "low-traffic")
	if err != nil {
		t.Fatal(err)
	}
	scenarios[0] = scenarios[0].Shorten(10 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunScenarios(ctx, scenarios, 1, 3); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v, want context.Canceled", err)
	}
	scenarios[0].Policies = []string{"random", "no-such-policy"}
	if _, err := RunScenarios(context.Background(), scenarios, 1, 1); err == nil {
		t.Error("unknown policy: no error")
	}
}
