package analyzer

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fleetwatch/fleetwatch"
)

// validBudget checks b the way a snapshot carrying it is validated.
func validBudget(b *fleetwatch.RetryBudget) error {
	s := fleetwatch.Snapshot{V: 1, Pool: "p", Epoch: "01JEPOCH0000000000000000000", At: fleetwatch.At(time.Unix(1, 0)), TTLMs: 5000, Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, RetryBudget: b}
	return s.Validate()
}

func TestComputeRetryBudget(t *testing.T) {
	kv := func(v float64) *float64 { return &v }
	load := func(running, waiting float64, kvUse *float64) *fleetwatch.Load {
		return &fleetwatch.Load{Running: running, Waiting: waiting, KVCacheUsage: kvUse, Source: "event"}
	}
	slots := func(string) float64 { return 8 }
	tests := []struct {
		name      string
		backends  []fleetwatch.Backend
		capacity  func(string) float64
		rate      float64
		s         RetryBudgetSettings
		wantFree  bool
		wantSpare *float64
		wantRate  float64
	}{
		{"no load: not free, floor only", []fleetwatch.Backend{{Backend: "a"}}, slots, 0, RetryBudgetSettings{}, false, nil, 3},
		{"idle pool is free", []fleetwatch.Backend{{Backend: "a", Load: load(2, 0, nil)}, {Backend: "b", Load: load(2, 0, nil)}}, slots, 120, RetryBudgetSettings{},
			true, kv(0.75), 0.2/1.2*120 + 3},
		{"busy pool is budgeted", []fleetwatch.Backend{{Backend: "a", Load: load(8, 4, nil)}, {Backend: "b", Load: load(6, 0, nil)}}, slots, 60, RetryBudgetSettings{},
			false, kv(1 - (1.5+0.75)/2), 0.2/1.2*60 + 3},
		{"open backends count with their load", []fleetwatch.Backend{{Backend: "a", State: fleetwatch.StateOpen, Load: load(0, 0, nil)}, {Backend: "b", Load: load(8, 0, nil)}}, slots, 0, RetryBudgetSettings{},
			true, kv(0.5), 3},
		{"kv usage without capacity", []fleetwatch.Backend{{Backend: "a", Load: load(3, 0, kv(0.2))}, {Backend: "b", Load: load(3, 1, kv(0.4))}}, nil, 0, RetryBudgetSettings{},
			false, kv(0.4), 3},
		{"threshold and ratio settings", []fleetwatch.Backend{{Backend: "a", Load: load(6, 0, nil)}}, slots, 10, RetryBudgetSettings{Ratio: 1, FloorPerSec: 1, SpareFree: 0.25},
			true, kv(0.25), 0.5*10 + 1},
		{"nothing known without capacity or kv", []fleetwatch.Backend{{Backend: "a", Load: load(6, 0, nil)}}, nil, 0, RetryBudgetSettings{}, false, nil, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ComputeRetryBudget(tt.backends, tt.capacity, tt.rate, tt.s)
			want := &fleetwatch.RetryBudget{Free: tt.wantFree, Spare: tt.wantSpare, PerSec: tt.wantRate}
			if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("ComputeRetryBudget (-want +got):\n%s", diff)
			}
			if err := validBudget(got); err != nil {
				t.Errorf("validate: %v", err)
			}
		})
	}
}
