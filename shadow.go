package fleetwatch

// Shadow is a pool's shadow mode (PROTOCOL.md "Shadow mode (extension)"):
// whether its decisions are advisory, and what a router still follows when
// they are. It is how a team rolls fleetwatch out without trusting it
// blindly: the decisions are computed and published as usual, marked
// advisory, and a router that knows the field follows only part of them
// and counts what it would have done differently. A router that does not
// know the field follows the decisions fully.
type Shadow string

// Shadow modes. The empty value is off; "off" is accepted as a synonym
// (a configuration file says it), and the analyzer never publishes it.
const (
	// ShadowOff: the decisions are in force (the field is omitted).
	ShadowOff Shadow = ""
	// ShadowOffName is how a configuration file spells ShadowOff.
	ShadowOffName Shadow = "off"
	// ShadowBreakers: a router follows the breakers only. Open backends
	// get nothing and a half-open one its trickle, but every closed
	// backend is weighted 1: the weights (the 429 rate, shrinkage, drift
	// quarantine, the ejection cap's lowered weight) are advisory.
	ShadowBreakers Shadow = "breakers"
	// ShadowObserve: a router follows nothing fleetwatch judged; it picks
	// as if every backend were closed at weight 1.
	ShadowObserve Shadow = "observe"
)

// Valid reports whether s is a known shadow mode: "", "off", "breakers"
// or "observe".
func (s Shadow) Valid() bool {
	switch s {
	case ShadowOff, ShadowOffName, ShadowBreakers, ShadowObserve:
		return true
	}
	return false
}

// On reports whether s makes the decisions advisory: "breakers" or
// "observe". An unknown value is not on; Snapshot.Validate rejects it.
func (s Shadow) On() bool { return s == ShadowBreakers || s == ShadowObserve }

// Normalize returns s with "off" spelt as the empty ShadowOff.
func (s Shadow) Normalize() Shadow {
	if s == ShadowOffName {
		return ShadowOff
	}
	return s
}
