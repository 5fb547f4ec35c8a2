package fleetwatch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestShadowValues(t *testing.T) {
	tests := []struct {
		in         Shadow
		valid, on  bool
		normalized Shadow
	}{
		{ShadowOff, true, false, ShadowOff},
		{"off", true, false, ShadowOff},
		{"breakers", true, true, ShadowBreakers},
		{"observe", true, true, ShadowObserve},
		{"Observe", false, false, "Observe"},
		{"advisory", false, false, "advisory"},
	}
	for _, tt := range tests {
		if got := tt.in.Valid(); got != tt.valid {
			t.Errorf("Shadow(%q).Valid() = %v, want %v", tt.in, got, tt.valid)
		}
		if got := tt.in.On(); got != tt.on {
			t.Errorf("Shadow(%q).On() = %v, want %v", tt.in, got, tt.on)
		}
		if got := tt.in.Normalize(); got != tt.normalized {
			t.Errorf("Shadow(%q).Normalize() = %q, want %q", tt.in, got, tt.normalized)
		}
	}
}

// TestSnapshotShadowOnTheWire: the field is omitted when off, written
// when on, survives a round trip and passes Validate; a consumer that does
// not know the field (an old router) decodes the rest unchanged.
func TestSnapshotShadowOnTheWire(t *testing.T) {
	for _, mode := range []Shadow{ShadowOff, ShadowBreakers, ShadowObserve} {
		s := validSnapshot()
		s.Shadow = mode
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if has := strings.Contains(string(data), `"shadow"`); has != mode.On() {
			t.Errorf("%q: the JSON has shadow: %v, want %v: %s", mode, has, mode.On(), data)
		}
		if mode.On() && !strings.Contains(string(data), `"shadow":"`+string(mode)+`"`) {
			t.Errorf("%q: the JSON lacks the value: %s", mode, data)
		}
		var back Snapshot
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(*s, back); diff != "" {
			t.Errorf("%q round trip (-want +got):\n%s", mode, diff)
		}
		if err := back.Validate(); err != nil {
			t.Errorf("%q: Validate() = %v", mode, err)
		}
		// An old router's view: the same struct without the field.
		type oldSnapshot struct {
			Pool     string    `json:"pool"`
			Seq      uint64    `json:"seq"`
			Backends []Backend `json:"backends"`
		}
		var old oldSnapshot
		if err := json.Unmarshal(data, &old); err != nil {
			t.Fatalf("%q: an old consumer cannot decode it: %v", mode, err)
		}
		if diff := cmp.Diff(s.Backends, old.Backends); diff != "" {
			t.Errorf("%q: an old consumer reads other decisions (-want +got):\n%s", mode, diff)
		}
	}
	s := validSnapshot()
	s.Shadow = "off"
	if err := s.Validate(); err != nil {
		t.Errorf(`shadow "off": Validate() = %v, want nil (a synonym of omitted)`, err)
	}
	s.Shadow = "advisory"
	if err := s.Validate(); !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), "shadow") {
		t.Errorf("unknown shadow: Validate() = %v, want ErrBadValue naming shadow", err)
	}
}
