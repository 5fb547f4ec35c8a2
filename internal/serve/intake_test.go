package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestEventsPublishedWhileServeIsDown: with ingest.durable, failures
// published while no serve runs reach a decision when serve comes back;
// with the default core intake the same failures are lost (which is why
// the durable intake exists).
func TestEventsPublishedWhileServeIsDown(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	for _, tc := range []struct {
		name    string
		durable bool
		opens   bool
	}{
		{"durable", true, true},
		{"core", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := feedtest.NewServer(t)
			yaml := fmt.Sprintf("nats: {url: %q}\ningest: {durable: %v}\nprobes: {disabled: true}\n", url, tc.durable)
			data := filepath.Join(t.TempDir(), "data")
			nc := feedtest.Connect(t, url)
			snaps := testkit.SubscribeSnapshots(t, nc)

			first := newServer(t, yaml, data, Options{}).run(t)
			testkit.WaitConsuming(t, nc, snaps, "p", "healthy")
			if err := first.stop(); err != nil {
				t.Fatal(err)
			}
			// serve is down: thirty failures in a row, and some ok events
			// of a healthy peer.
			for range 30 {
				testkit.Publish(t, nc, "fw.outcomes.edge-1", `{"pool":"p","backend":"dead","status":503}`)
				testkit.Publish(t, nc, "fw.outcomes.edge-1", `{"pool":"p","backend":"healthy","status":200,"ttft_ms":100}`)
			}
			nc.Flush()
			time.Sleep(500 * time.Millisecond)

			newServer(t, yaml, data, Options{}).run(t)
			if tc.opens {
				testkit.Eventually(t, 20*time.Second, "dead to open from the events published while serve was down", func() bool {
					b, ok := snaps.Backend("p", "dead")
					return ok && b.State == fleetwatch.StateOpen
				})
				return
			}
			// Core: wait until the restarted serve has published p, then
			// check that dead was never seen.
			testkit.WaitConsuming(t, nc, snaps, "p", "healthy")
			time.Sleep(time.Second)
			if b, ok := snaps.Backend("p", "dead"); ok && b.State == fleetwatch.StateOpen {
				t.Errorf("dead opened with the core intake: %+v (the test's premise, that core loses these events, is wrong)", b)
			}
		})
	}
}

// TestHealthSaysWhenTheCaptureIsMissing: while another stream holds the
// outcome subjects, the capture cannot be created: /healthz answers 200
// (serve decides and publishes) with "status":"degraded", a reason that
// says what is lost and names the stream in the way and the command that
// deletes it; once it is gone the capture is created without a restart
// and /healthz says ok again.
func TestHealthSaysWhenTheCaptureIsMissing(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"fw.outcomes.>"}}); err != nil {
		t.Fatal(err)
	}
	snaps := testkit.SubscribeSnapshots(t, nc)
	r := newServer(t, fmt.Sprintf("nats: {url: %q}\nprobes: {disabled: true}\n", url), filepath.Join(t.TempDir(), "data"), Options{}).run(t)
	testkit.WaitConsuming(t, nc, snaps, "p", "healthy")

	code, body := testkit.HTTPGet(t, r.httpURL+"/healthz")
	var health struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
		Ingest struct {
			Mode         string `json:"mode"`
			CaptureError string `json:"capture_error"`
			Loss         string `json:"loss"`
		} `json:"ingest"`
	}
	if err := json.Unmarshal([]byte(body), &health); err != nil {
		t.Fatalf("/healthz %d %s: %v", code, body, err)
	}
	if code != http.StatusOK || health.Status != "degraded" || health.Ingest.Mode != "core, capture missing" ||
		!strings.Contains(health.Reason, "events published while no serve runs would be lost") ||
		!strings.Contains(health.Reason, "stream AUDIT") || !strings.Contains(health.Reason, "`nats stream rm AUDIT`") {
		t.Errorf("/healthz = %d %s\nwant 200, degraded, with what is lost and the stream in the way", code, body)
	}

	if err := js.DeleteStream(t.Context(), "AUDIT"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "/healthz ok with the capture once AUDIT is gone", func() bool {
		code, body := testkit.HTTPGet(t, r.httpURL+"/healthz")
		return code == http.StatusOK && strings.Contains(body, `"status":"ok"`) && strings.Contains(body, `"mode":"core + capture"`)
	})
}

// TestIngestHealth: what /healthz says of each ingest mode, and when it is
// degraded.
func TestIngestHealth(t *testing.T) {
	subj := fleetwatch.Subjects{}
	overlap := fmt.Errorf("cannot create the capture: %w", collector.ErrStreamOverlap)
	for _, tc := range []struct {
		name     string
		st       collector.Stats
		mode     string
		degraded bool
		fields   []string
	}{
		{"capture", collector.Stats{JetStream: true, CaptureWanted: true, Capture: true, CaptureReplayed: 5, CaptureUnreplayed: 7, CaptureDeduplicated: 2},
			"core + capture", false, []string{"capture_replayed", "capture_unreplayed", "capture_deduplicated", "capture_uncovered_seconds"}},
		{"catch-up ended early", collector.Stats{JetStream: true, CaptureWanted: true, Capture: true, CaptureUnreplayed: 7, CatchUpErr: collector.ErrReplayEndedEarly},
			"core + capture", false, []string{"capture_unreplayed", "catch_up_error"}},
		{"capture missing", collector.Stats{JetStream: true, CaptureWanted: true, CaptureErr: overlap},
			"core, capture missing", true, []string{"capture_error", "capture_replayed", "capture_unreplayed"}},
		{"intake", collector.Stats{JetStream: true, Intake: true},
			"durable intake", false, []string{"intake_lost"}},
		{"core by choice", collector.Stats{JetStream: true},
			"core", false, nil},
		{"no JetStream", collector.Stats{},
			"core", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, degraded := ingestHealthOf(tc.st, subj)
			if m["mode"] != tc.mode || (degraded != "") != tc.degraded {
				t.Errorf("mode %q, degraded %q; want %q, degraded %v", m["mode"], degraded, tc.mode, tc.degraded)
			}
			for _, f := range tc.fields {
				if _, ok := m[f]; !ok {
					t.Errorf("no %s in %v", f, m)
				}
			}
			if tc.st.CaptureErr != nil && !strings.Contains(degraded, tc.st.CaptureErr.Error()) {
				t.Errorf("degraded %q does not say why: %v", degraded, tc.st.CaptureErr)
			}
		})
	}
}
