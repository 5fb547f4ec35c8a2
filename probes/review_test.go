package probes

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

func reviewAlerts(t0 time.Time) []fleetwatch.DriftAlert {
	fpA, fpB := "fp_a", "fp_b"
	return []fleetwatch.DriftAlert{
		{V: 1, Pool: "llama", Backend: "vllm-b", At: fleetwatch.At(t0.Add(-48 * time.Hour)), Status: "suspect", Previous: "ok",
			Against: "baseline", Reason: "before the period"},
		{V: 1, Pool: "llama", Backend: "vllm-b", At: fleetwatch.At(t0.Add(-2 * time.Hour)), Status: "drifted", Previous: "ok",
			Score: 14.2, Threshold: 12, Against: "baseline", Suite: "default-v1", Reason: "gross change",
			Evidence: fleetwatch.DriftEvidence{Prompts: 16, ExactMatchRate: new(float64(0.44)), MeanAbsLogprobDelta: new(float64(0.31)),
				FingerprintBefore: &fpA, FingerprintAfter: &fpB}},
		{V: 1, Pool: "llama", Backend: "odd|id", At: fleetwatch.At(t0.Add(-time.Hour)), Status: "drifted", Previous: "ok",
			Score: 0.16, Threshold: 0.05, Against: "peers", Reason: "outlier among 3 peers",
			Evidence: fleetwatch.DriftEvidence{Prompts: 16, MeanAbsLogprobDelta: new(float64(0.16))}},
		{V: 1, Pool: "qwen", Backend: "q-1", At: fleetwatch.At(t0.Add(-30 * time.Minute)), Status: "ok", Previous: "suspect",
			Score: 1, Threshold: 8, Against: "baseline", Reason: "not confirmed"},
		{V: 1, Pool: "qwen", Backend: "late", At: fleetwatch.At(t0.Add(time.Minute)), Status: "drifted", Against: "baseline", Reason: "after now"},
	}
}

func TestBuildReviewFromAlertsOnly(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	r := BuildReview(t0, t0.Add(-24*time.Hour), reviewAlerts(t0), nil)
	if len(r.Alerts) != 3 {
		t.Errorf("%d alerts in the period, want 3 (one before, one after)", len(r.Alerts))
	}
	want := []fleetwatch.DriftedEntry{
		{Pool: "llama", Backend: "odd|id", Status: "drifted", Since: fleetwatch.At(t0.Add(-time.Hour)), Score: 0.16},
		{Pool: "llama", Backend: "vllm-b", Status: "drifted", Since: fleetwatch.At(t0.Add(-2 * time.Hour)), Score: 14.2},
	}
	if diff := cmp.Diff(want, r.BackendsDrifted); diff != "" {
		t.Errorf("drifted (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(r.Summary, "3 alert(s) since 2026-12-01T09:00:00.000Z; 2 backend(s) drifted, 0 suspect") {
		t.Errorf("summary %q", r.Summary)
	}
	md := RenderMarkdown(r, nil)
	for _, want := range []string{
		"# Drift review 2026-12-02 09:00 UTC",
		"## Pool llama",
		"| vllm-b | drifted | 2026-12-02T07:00:00.000Z | 14.2 / 12 | exact match 0.44 of 16 prompts; mean \\|delta logprob\\| 0.3100 nats | fingerprint \"fp_a\" -> \"fp_b\" |",
		"| odd\\|id | drifted (peers) |",
		"peer distance 0.1600 nats",
		"## Pool qwen",
		"| q-1 | ok |",
		"- 2026-12-02T07:00:00.000Z llama/vllm-b: ok -> **drifted** (against baseline): gross change",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "late") {
		t.Errorf("Markdown names an alert after the review time:\n%s", md)
	}
}

func TestBuildReviewWithStatuses(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	statuses := []BackendStatus{
		{Pool: "llama", Backend: "vllm-a", Status: "ok", Baseline: "ok", Peers: "ok"},
		{Pool: "llama", Backend: "vllm-b", Status: "drifted", Baseline: "drifted", Peers: "ok", Since: t0.Add(-2 * time.Hour), Score: 3},
		{Pool: "llama", Backend: "new", Status: "unknown", Enrolling: true, EnrolCycles: 2, Errors: 3, LastErrorKind: "timeout",
			LastError: "probes: POST /v1/chat/completions: timeout", LastErrorAt: t0.Add(-time.Minute)},
	}
	r := BuildReview(t0, t0.Add(-24*time.Hour), reviewAlerts(t0), statuses)
	// the statuses decide: odd|id has no status, so it is not listed
	if len(r.BackendsDrifted) != 1 || r.BackendsDrifted[0].Backend != "vllm-b" || r.BackendsDrifted[0].Score != 14.2 {
		t.Errorf("drifted %+v", r.BackendsDrifted)
	}
	if !strings.HasSuffix(r.Summary, "; 3 probe error(s) (not verdicts)") {
		t.Errorf("summary %q", r.Summary)
	}
	md := RenderMarkdown(r, statuses)
	for _, want := range []string{"| new | enrolling (2 cycles) |", "## Probe errors (not verdicts)", "| llama | new | 3 | timeout |"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestReviewerWritesPublishesAndAdvances(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	now := t0
	var gotSince []time.Time
	var published []fleetwatch.DriftReview
	dir := t.TempDir()
	r, err := NewReviewer(ReviewSettings{
		Dir: dir,
		Now: func() time.Time { return now },
		Alerts: func(_ context.Context, since time.Time) ([]fleetwatch.DriftAlert, error) {
			gotSince = append(gotSince, since)
			return reviewAlerts(t0), nil
		},
		Publish: func(_ context.Context, rv fleetwatch.DriftReview) error {
			published = append(published, rv)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, path, err := r.Review(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), "| vllm-b | drifted |") {
		t.Fatalf("review file %s: %v\n%s", path, err, data)
	}
	now = t0.Add(24 * time.Hour)
	if _, _, err := r.Review(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []time.Time{t0.Add(-7 * 24 * time.Hour), t0} // the first looks back 7 days, the next from the last review
	if diff := cmp.Diff(want, gotSince); diff != "" {
		t.Errorf("since (-want +got):\n%s", diff)
	}
	if len(published) != 2 {
		t.Errorf("%d digests published, want 2", len(published))
	}
	if _, err := NewReviewer(ReviewSettings{}); err == nil {
		t.Error("a reviewer without Alerts was accepted")
	}
}
