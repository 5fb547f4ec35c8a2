package fleetwatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestComputeRetryBudget(t *testing.T) {
	kv := func(v float64) *float64 { return &v }
	load := func(running, waiting float64, kvUse *float64) *Load {
		return &Load{Running: running, Waiting: waiting, KVCacheUsage: kvUse, Source: "event"}
	}
	slots := func(string) float64 { return 8 }
	tests := []struct {
		name      string
		backends  []Backend
		capacity  func(string) float64
		rate      float64
		s         RetryBudgetSettings
		wantFree  bool
		wantSpare *float64
		wantRate  float64
	}{
		{"no load: not free, floor only", []Backend{{Backend: "a"}}, slots, 0, RetryBudgetSettings{}, false, nil, 3},
		{"idle pool is free", []Backend{{Backend: "a", Load: load(2, 0, nil)}, {Backend: "b", Load: load(2, 0, nil)}}, slots, 120, RetryBudgetSettings{},
			true, kv(0.75), 0.2/1.2*120 + 3},
		{"busy pool is budgeted", []Backend{{Backend: "a", Load: load(8, 4, nil)}, {Backend: "b", Load: load(6, 0, nil)}}, slots, 60, RetryBudgetSettings{},
			false, kv(1 - (1.5+0.75)/2), 0.2/1.2*60 + 3},
		{"open backends count with their load", []Backend{{Backend: "a", State: StateOpen, Load: load(0, 0, nil)}, {Backend: "b", Load: load(8, 0, nil)}}, slots, 0, RetryBudgetSettings{},
			true, kv(0.5), 3},
		{"kv usage without capacity", []Backend{{Backend: "a", Load: load(3, 0, kv(0.2))}, {Backend: "b", Load: load(3, 1, kv(0.4))}}, nil, 0, RetryBudgetSettings{},
			false, kv(0.4), 3},
		{"threshold and ratio settings", []Backend{{Backend: "a", Load: load(6, 0, nil)}}, slots, 10, RetryBudgetSettings{Ratio: 1, FloorPerSec: 1, SpareFree: 0.25},
			true, kv(0.25), 0.5*10 + 1},
		{"nothing known without capacity or kv", []Backend{{Backend: "a", Load: load(6, 0, nil)}}, nil, 0, RetryBudgetSettings{}, false, nil, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ComputeRetryBudget(tt.backends, tt.capacity, tt.rate, tt.s)
			want := &RetryBudget{Free: tt.wantFree, Spare: tt.wantSpare, PerSec: tt.wantRate}
			if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("ComputeRetryBudget (-want +got):\n%s", diff)
			}
			if err := got.validate(); err != nil {
				t.Errorf("validate: %v", err)
			}
		})
	}
}

func TestRetryBudgetValidateAndJSON(t *testing.T) {
	spare := 2.0
	for _, b := range []*RetryBudget{{PerSec: -1}, {Spare: &spare}} {
		if err := b.validate(); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("validate(%+v) = %v, want ErrOutOfRange", b, err)
		}
	}
	s := 0.6
	in := Snapshot{RetryBudget: &RetryBudget{Free: true, Spare: &s, PerSec: 12.5}}
	raw, err := json.Marshal(&in)
	if err != nil {
		t.Fatal(err)
	}
	var out Snapshot
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in.RetryBudget, out.RetryBudget); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	var old Snapshot
	if err := json.Unmarshal([]byte(`{"v":1}`), &old); err != nil || old.RetryBudget != nil {
		t.Errorf("a snapshot without retry_budget: %+v, %v", old.RetryBudget, err)
	}
}

// A publisher computes the pool's retry budget from the snapshot's
// backends, their capacities and the pool's attempt rate.
func ExampleComputeRetryBudget() {
	slots := map[string]float64{"a": 8, "b": 8}
	backends := []Backend{
		{Backend: "a", Load: &Load{Running: 8, Waiting: 2}},
		{Backend: "b", Load: &Load{Running: 7}},
	}
	rb := ComputeRetryBudget(backends, func(id string) float64 { return slots[id] }, 120, RetryBudgetSettings{})
	fmt.Printf("free %v, spare %.3f, %.0f retries/s for the fleet\n", rb.Free, *rb.Spare, rb.PerSec)
	// Output: free false, spare -0.062, 23 retries/s for the fleet
}
