package fleetwatch

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// OverrideKind is what an operator override does to a backend's decision.
type OverrideKind string

// Override kinds (PROTOCOL.md "Operator overrides", an extension).
const (
	// OverrideDrain publishes weight 0 with the breaker state unchanged:
	// routers send the backend no new request, requests in flight finish.
	OverrideDrain OverrideKind = "drain"
	// OverrideForceOpen publishes state open with open_until the
	// override's until.
	OverrideForceOpen OverrideKind = "force_open"
	// OverrideForceClosed publishes state closed (weight as computed, 1
	// when the breaker's own verdict is open or half-open).
	OverrideForceClosed OverrideKind = "force_closed"
	// OverrideWeight publishes the override's weight, state unchanged.
	OverrideWeight OverrideKind = "weight"
)

// ErrInvalidOverride is wrapped by every error of Override.Validate.
var ErrInvalidOverride = errors.New("fleetwatch: invalid override")

// Override is an operator's override of one backend's decision, published
// on the backend in snapshots while it lasts (an extension of the
// protocol). The analyzer keeps counting the backend underneath: when the
// override ends the backend's own verdict is published again.
type Override struct {
	Kind   OverrideKind `json:"kind"`
	Reason string       `json:"reason"`
	Who    string       `json:"who"`
	Until  Time         `json:"until"` // the override is ignored from then on
	// Weight is the weight a "weight" override sets, in [0, 1]; nil for
	// the other kinds.
	Weight *float64 `json:"weight,omitempty"`
}

// Active reports whether o is in force at now: now is before Until.
func (o *Override) Active(now time.Time) bool { return now.Before(o.Until.Time) }

// Validate reports whether o is well formed: a known kind, a reason, an
// until representable in RFC 3339, and a weight in [0, 1] exactly when
// the kind is "weight". The error wraps ErrInvalidOverride.
func (o *Override) Validate() error {
	switch o.Kind {
	case OverrideDrain, OverrideForceOpen, OverrideForceClosed, OverrideWeight:
	default:
		return fmt.Errorf("%w: kind = %q (want \"drain\", \"force_open\", \"force_closed\" or \"weight\")", ErrInvalidOverride, o.Kind)
	}
	if o.Reason == "" {
		return fmt.Errorf("%w: reason is empty (say why, for the audit)", ErrInvalidOverride)
	}
	if o.Until.IsZero() || !representable(o.Until) {
		return fmt.Errorf("%w: until = %v: missing or out of range", ErrInvalidOverride, o.Until)
	}
	if o.Kind == OverrideWeight {
		if o.Weight == nil || math.IsNaN(*o.Weight) || *o.Weight < 0 || *o.Weight > 1 {
			return fmt.Errorf("%w: a weight override needs a weight in [0, 1]", ErrInvalidOverride)
		}
	} else if o.Weight != nil {
		return fmt.Errorf("%w: weight is set but kind is %q", ErrInvalidOverride, o.Kind)
	}
	return nil
}
