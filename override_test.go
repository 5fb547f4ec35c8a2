package fleetwatch

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func validOverride() *Override {
	return &Override{Kind: OverrideDrain, Reason: "node reboot", Who: "alice",
		Until: At(time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC))}
}

func TestOverrideValidate(t *testing.T) {
	far := At(time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC).Add(2 * time.Hour))
	tests := []struct {
		name   string
		mutate func(o *Override)
		ok     bool
	}{
		{"drain", func(*Override) {}, true},
		{"force_open", func(o *Override) { o.Kind = OverrideForceOpen }, true},
		{"force_closed", func(o *Override) { o.Kind = OverrideForceClosed }, true},
		{"weight", func(o *Override) { o.Kind, o.Weight = OverrideWeight, new(float64(0.25)) }, true},
		{"weight 0", func(o *Override) { o.Kind, o.Weight = OverrideWeight, new(float64(0)) }, true},
		{"no who", func(o *Override) { o.Who = "" }, true},
		{"unknown kind", func(o *Override) { o.Kind = "pause" }, false},
		{"no kind", func(o *Override) { o.Kind = "" }, false},
		{"no reason", func(o *Override) { o.Reason = "" }, false},
		{"no until", func(o *Override) { o.Until = Time{} }, false},
		{"until after 9999", func(o *Override) { o.Until = far }, false},
		{"weight without a weight", func(o *Override) { o.Kind = OverrideWeight }, false},
		{"weight above 1", func(o *Override) { o.Kind, o.Weight = OverrideWeight, new(float64(1.5)) }, false},
		{"NaN weight", func(o *Override) { o.Kind, o.Weight = OverrideWeight, new(float64(math.NaN())) }, false},
		{"weight on a drain", func(o *Override) { o.Weight = new(float64(0.5)) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := validOverride()
			tt.mutate(o)
			err := o.Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidOverride) {
				t.Errorf("Validate() = %v, want ErrInvalidOverride", err)
			}
			// Inside a snapshot, the same verdict, as ErrBadValue.
			s := validSnapshot()
			s.Backends[2].Override = o
			serr := s.Validate()
			if tt.ok != (serr == nil) {
				t.Fatalf("Snapshot.Validate() = %v, want ok %v", serr, tt.ok)
			}
			if serr != nil && (!errors.Is(serr, ErrInvalidSnapshot) || !errors.Is(serr, ErrBadValue)) {
				t.Errorf("Snapshot.Validate() = %v, want ErrInvalidSnapshot and ErrBadValue", serr)
			}
		})
	}
}

func TestOverrideActive(t *testing.T) {
	o := validOverride()
	if !o.Active(o.Until.Add(-time.Millisecond)) {
		t.Error("not active a millisecond before until")
	}
	if o.Active(o.Until.Time) {
		t.Error("active at until")
	}
}

// TestOverrideRoundTrip checks the wire form: the field is omitted without
// an override, and an override survives encoding.
func TestOverrideRoundTrip(t *testing.T) {
	s := validSnapshot()
	data, err := json.Marshal(s.Backends[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(data, &m)
	if _, ok := m["override"]; ok {
		t.Errorf("override present without one: %s", data)
	}
	s.Backends[1].Override = &Override{Kind: OverrideWeight, Reason: "canary", Who: "bob",
		Until: At(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)), Weight: new(float64(0.1))}
	data, err = json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got Snapshot
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s.Backends[1].Override, got.Backends[1].Override); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Error(err)
	}
}
