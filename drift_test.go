package fleetwatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// protocolDriftAlert is the drift alert of PROTOCOL.md, verbatim.
const protocolDriftAlert = `{
  "v": 1,
  "pool": "llama-3.1-70b",
  "backend": "vllm-b",
  "at": "2026-12-02T08:05:00.000Z",
  "status": "drifted",
  "previous": "ok",
  "score": 7.3,
  "threshold": 3.0,
  "against": "baseline",
  "suite": "default-v1",
  "evidence": {
    "prompts": 16,
    "exact_match_rate": 0.44,
    "mean_abs_logprob_delta": 0.31,
    "fingerprint_before": "fp_44709d6fcb",
    "fingerprint_after": "fp_9a1f03c2aa",
    "model_ids": ["llama-3.1-70b"]
  },
  "reason": "greedy output changed on 9 of 16 prompts; fingerprint changed"
}`

func strPtr(s string) *string { return &s }

func TestDriftAlertProtocolExample(t *testing.T) {
	var got DriftAlert
	if err := json.Unmarshal([]byte(protocolDriftAlert), &got); err != nil {
		t.Fatal(err)
	}
	want := DriftAlert{
		V: 1, Pool: "llama-3.1-70b", Backend: "vllm-b", At: At(time.Date(2026, 12, 2, 8, 5, 0, 0, time.UTC)),
		Status: DriftDrifted, Previous: DriftOK, Score: 7.3, Threshold: 3, Against: AgainstBaseline, Suite: "default-v1",
		Evidence: DriftEvidence{
			Prompts: 16, ExactMatchRate: new(float64(0.44)), MeanAbsLogprobDelta: new(float64(0.31)),
			FingerprintBefore: strPtr("fp_44709d6fcb"), FingerprintAfter: strPtr("fp_9a1f03c2aa"),
			ModelIDs: []string{"llama-3.1-70b"},
		},
		Reason: "greedy output changed on 9 of 16 prompts; fingerprint changed",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Unmarshal (-want +got):\n%s", diff)
	}
}

func TestDriftEvidenceExtraRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		e    DriftEvidence
		want DriftEvidence // after the round trip
	}{
		{
			"no extra",
			DriftEvidence{Prompts: 16, ExactMatchRate: new(float64(1)), ModelIDs: []string{"m"}},
			DriftEvidence{Prompts: 16, ExactMatchRate: new(float64(1)), ModelIDs: []string{"m"}},
		},
		{
			"extra fields kept",
			DriftEvidence{Prompts: 3, Extra: map[string]any{
				"judge": "exact", "changed_prompts": []any{"p1", "p7"}, "token_kl": 0.25, "detail": map[string]any{"n": 2.0},
			}},
			DriftEvidence{Prompts: 3, Extra: map[string]any{
				"judge": "exact", "changed_prompts": []any{"p1", "p7"}, "token_kl": 0.25, "detail": map[string]any{"n": 2.0},
			}},
		},
		{
			"extra colliding with named fields ignored",
			DriftEvidence{Prompts: 3, FingerprintAfter: strPtr("fp"), Extra: map[string]any{"prompts": 99.0, "fingerprint_after": nil, "x": true}},
			DriftEvidence{Prompts: 3, FingerprintAfter: strPtr("fp"), Extra: map[string]any{"x": true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := json.Marshal(tt.e)
			if err != nil {
				t.Fatal(err)
			}
			var got DriftEvidence
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("Unmarshal(%s): %v", data, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
			}
		})
	}
}

func TestDriftEvidenceNamedFieldsAlwaysPresent(t *testing.T) {
	data, err := json.Marshal(DriftEvidence{Extra: map[string]any{"x": 1}})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"prompts", "exact_match_rate", "mean_abs_logprob_delta", "fingerprint_before", "fingerprint_after", "model_ids", "x"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s missing from %s", k, data)
		}
	}
}

func TestDriftReviewRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	r := DriftReview{
		V: 1, At: At(at), Since: At(at.Add(-72 * time.Hour)),
		Alerts: []DriftAlert{{V: 1, Pool: "p", Backend: "b", At: At(at.Add(-time.Hour)), Status: DriftSuspect,
			Previous: DriftOK, Score: 3.5, Threshold: 3, Against: AgainstPeers, Suite: "s",
			Evidence: DriftEvidence{Prompts: 4, Extra: map[string]any{"k": "v"}}, Reason: "r"}},
		BackendsDrifted: []DriftedEntry{{Pool: "p", Backend: "c", Status: DriftDrifted, Since: At(at.Add(-48 * time.Hour)), Score: 9}},
		Summary:         "1 backend drifted",
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got DriftReview
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, got); diff != "" {
		t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
	}
}
