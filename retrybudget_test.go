package fleetwatch

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
