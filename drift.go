package fleetwatch

import (
	"encoding/json"
	"maps"
)

// Drift comparison targets.
const (
	AgainstBaseline = "baseline" // the backend's own history
	AgainstPeers    = "peers"    // the other backends of the same pool
)

// DriftAlert is published on fw.drift.<pool> when a backend's drift status
// changes, and kept in the FW_DRIFT stream.
type DriftAlert struct {
	V         int           `json:"v"`
	Pool      string        `json:"pool"`
	Backend   string        `json:"backend"`
	At        Time          `json:"at"`
	Status    DriftStatus   `json:"status"`
	Previous  DriftStatus   `json:"previous"`
	Score     float64       `json:"score"`
	Threshold float64       `json:"threshold"`
	Against   string        `json:"against"`
	Suite     string        `json:"suite"`
	Evidence  DriftEvidence `json:"evidence"`
	Reason    string        `json:"reason"`
}

// DriftEvidence is what a drift verdict rests on. The named fields are always
// present on the wire (null where not measurable); Extra carries more, merged
// into the same JSON object.
type DriftEvidence struct {
	Prompts             int      `json:"prompts"`
	ExactMatchRate      *float64 `json:"exact_match_rate"`
	MeanAbsLogprobDelta *float64 `json:"mean_abs_logprob_delta"`
	FingerprintBefore   *string  `json:"fingerprint_before"`
	FingerprintAfter    *string  `json:"fingerprint_after"`
	ModelIDs            []string `json:"model_ids"`

	// Extra holds further evidence fields. Keys that collide with the named
	// fields are ignored when encoding.
	Extra map[string]any `json:"-"`
}

type driftEvidenceFields DriftEvidence

// MarshalJSON merges Extra into the object of the named fields.
func (e DriftEvidence) MarshalJSON() ([]byte, error) {
	base, err := json.Marshal(driftEvidenceFields(e))
	if err != nil || len(e.Extra) == 0 {
		return base, err
	}
	var m map[string]any
	if err := json.Unmarshal(base, &m); err != nil {
		return nil, err
	}
	for k, v := range e.Extra {
		if _, named := m[k]; !named {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON fills the named fields and keeps the others in Extra.
func (e *DriftEvidence) UnmarshalJSON(b []byte) error {
	var f driftEvidenceFields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for _, k := range [...]string{"prompts", "exact_match_rate", "mean_abs_logprob_delta", "fingerprint_before", "fingerprint_after", "model_ids"} {
		delete(m, k)
	}
	*e = DriftEvidence(f)
	if len(m) > 0 {
		e.Extra = maps.Clone(m)
	}
	return nil
}

// DriftReview is the scheduled drift review digest, published on
// fw.drift.review and written as Markdown.
type DriftReview struct {
	V               int            `json:"v"`
	At              Time           `json:"at"`
	Since           Time           `json:"since"`
	Alerts          []DriftAlert   `json:"alerts"`
	BackendsDrifted []DriftedEntry `json:"backends_drifted"`
	Summary         string         `json:"summary"`
}

// DriftedEntry names one backend that is drifted at review time.
type DriftedEntry struct {
	Pool    string      `json:"pool"`
	Backend string      `json:"backend"`
	Status  DriftStatus `json:"status"`
	Since   Time        `json:"since"`
	Score   float64     `json:"score"`
}
