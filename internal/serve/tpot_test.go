package serve

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestServePublishesTPOT: outcome events with a duration and output tokens
// on NATS give a backend p50_tpot_ms and p95_tpot_ms in the snapshots
// published on fw.decisions.<pool> and the TPOT gauges on /metrics; a
// backend whose events carry no token count has neither.
func TestServePublishesTPOT(t *testing.T) {
	p := startServer(t, "probes: {disabled: true}\n", Options{})
	nc, snaps := snapshotsOn(t, p)
	raw, err := nc.SubscribeSync("fw.decisions.p")
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitConsuming(t, nc, snaps, "p", "a")
	// a decodes at 20 ms per token ((1100 - 100) / 50), b at 40.
	for range 5 {
		testkit.Publish(t, nc, "fw.outcomes.r1", `{"v":1,"pool":"p","backend":"a","status":200,"ttft_ms":100,"duration_ms":1100,"output_tokens":51}`)
		testkit.Publish(t, nc, "fw.outcomes.r1", `{"v":1,"pool":"p","backend":"b","status":200,"ttft_ms":100,"duration_ms":2100,"output_tokens":51}`)
		testkit.Publish(t, nc, "fw.outcomes.r1", `{"v":1,"pool":"p","backend":"c","status":200,"ttft_ms":100,"duration_ms":2100}`)
	}
	within := func(v *float64, want float64) bool { return v != nil && *v >= want*32/33 && *v <= want*34/33 }
	testkit.Eventually(t, 20*time.Second, "TPOT of a and b in a snapshot", func() bool {
		s, ok := snaps.Snapshot("p")
		if !ok {
			return false
		}
		a, b := s.Find("a"), s.Find("b")
		return a != nil && b != nil && within(a.P50TPOTMs, 20) && within(a.P95TPOTMs, 20) &&
			within(b.P50TPOTMs, 40) && within(b.P95TPOTMs, 40)
	})
	if c, ok := snaps.Backend("p", "c"); !ok || c.P50TPOTMs != nil || c.P95TPOTMs != nil {
		t.Errorf("c: %+v, want no TPOT (its events carry no output_tokens)", c)
	}

	// On the wire: the fields are there for a and b, absent for c.
	deadline := time.Now().Add(20 * time.Second)
	for {
		msg, err := raw.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("no published snapshot with p50_tpot_ms: %v", err)
		}
		var wire struct {
			Backends []map[string]json.RawMessage `json:"backends"`
		}
		if err := json.Unmarshal(msg.Data, &wire); err != nil {
			t.Fatal(err)
		}
		var snap fleetwatch.Snapshot
		if err := json.Unmarshal(msg.Data, &snap); err != nil {
			t.Fatal(err)
		}
		if err := snap.Validate(); err != nil {
			t.Fatalf("published snapshot: %v", err)
		}
		fields := map[string]bool{}
		for _, b := range wire.Backends {
			_, has := b["p50_tpot_ms"]
			_, has95 := b["p95_tpot_ms"]
			fields[strings.Trim(string(b["backend"]), `"`)] = has && has95
		}
		if fields["a"] && fields["b"] {
			if fields["c"] {
				t.Errorf("c carries TPOT fields on the wire: %s", msg.Data)
			}
			break
		}
	}

	_, page := testkit.HTTPGet(t, p.httpURL+"/metrics")
	for series, want := range map[string]float64{
		`fleetwatch_backend_p50_tpot_ms{pool="p",backend="a"}`: 20,
		`fleetwatch_backend_p95_tpot_ms{pool="p",backend="b"}`: 40,
	} {
		if v := seriesValue(page, series); !within(&v, want) {
			t.Errorf("%s = %v, want %v within 3.03%%", series, v, want)
		}
	}
	if v := seriesValue(page, `fleetwatch_backend_p50_tpot_ms{pool="p",backend="c"}`); v != -1 {
		t.Errorf("c has a TPOT series (%v), want none", v)
	}
}
