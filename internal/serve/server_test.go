package serve

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestServeEndToEnd runs the daemon in process against a real NATS server:
// events in (single and NDJSON, with every kind of malformed line), a
// breaker opening, rejects, the KV, HTTP, and a draining shutdown.
func TestServeEndToEnd(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	var logs testkit.Lines
	p := startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", Options{Logf: logs.Logf})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	var rejMu sync.Mutex
	rejects := map[string]fleetwatch.Reject{}
	_, err = nc.Subscribe("fw.rejects", func(m *nats.Msg) {
		var r fleetwatch.Reject
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("reject notice does not parse: %v: %s", err, m.Data)
			return
		}
		rejMu.Lock()
		rejects[string(r.Code)] = r
		rejMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	testkit.WaitConsuming(t, nc, snaps, "warmup", "w")

	// Single events: five failures in a row open a breaker at any volume.
	for i := 0; i < 5; i++ {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("p1", "bad", 500, 3))
	}
	testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("p1", "good", 200, 120))

	// An NDJSON batch mixing good lines and every kind of malformed event:
	// the bad lines are rejected alone, the good ones count.
	long := strings.Repeat("b", 300)
	batch := strings.Join([]string{
		testkit.Event("p1", "good", 200, 110),
		`{"pool":"p1","backend":"good",`, // bad JSON
		`{"backend":"good","status":200}`,
		`{"pool":"a..b","backend":"good","status":200}`,
		`{"pool":"p1","backend":"good","status":"200"}`,
		`{"pool":"p1","backend":"good","status":200,"ttft_ms":-1}`,
		`{"pool":"p1","backend":"good","status":200,"ttft_ms":1e400}`,
		`{"pool":"p1","backend":"` + long + `","status":200}`,
		`{"v":2,"pool":"p1","backend":"good","status":200}`,
		testkit.Event("p1", "good", 200, 130),
	}, "\n")
	testkit.Publish(t, nc, "fw.outcomes.edge-2", batch)

	testkit.Eventually(t, 10*time.Second, "the breaker of p1/bad to open in a snapshot", func() bool {
		b, ok := snaps.Backend("p1", "bad")
		return ok && b.State == fleetwatch.StateOpen
	})
	b, _ := snaps.Backend("p1", "bad")
	if b.Weight != 0 || b.OpenUntil == nil || !strings.Contains(b.Reason, "5 consecutive failures") {
		t.Errorf("open backend: weight %v, open_until %v, reason %q", b.Weight, b.OpenUntil, b.Reason)
	}
	testkit.Eventually(t, 10*time.Second, "p1/good to count its 3 good events", func() bool {
		g, ok := snaps.Backend("p1", "good")
		return ok && g.Requests == 3
	})

	wantRejects := map[string]fleetwatch.Reason{
		"bad json":        fleetwatch.ReasonBadJSON,
		"missing pool":    fleetwatch.ReasonMissingField,
		"invalid pool":    fleetwatch.ReasonInvalidPool,
		"string status":   fleetwatch.ReasonWrongType,
		"negative ttft":   fleetwatch.ReasonOutOfRange,
		"300-byte id":     fleetwatch.ReasonInvalidBackend,
		"unknown version": fleetwatch.ReasonBadVersion,
	}
	testkit.Eventually(t, 10*time.Second, "reject notices for every malformed kind", func() bool {
		rejMu.Lock()
		defer rejMu.Unlock()
		for _, code := range wantRejects {
			if _, ok := rejects[string(code)]; !ok {
				return false
			}
		}
		return true
	})
	rejMu.Lock()
	for what, code := range wantRejects {
		r := rejects[string(code)]
		if r.Reason == "" || r.Sample == "" || !strings.HasPrefix(r.Subject, "fw.outcomes") {
			t.Errorf("%s: reject notice %+v lacks reason, sample or subject", what, r)
		}
	}
	rejMu.Unlock()

	// The last snapshot is in the KV for late joiners.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "fw_decisions")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the KV to hold p1 with bad open", func() bool {
		e, err := kv.Get(ctx, "p1")
		if err != nil {
			return false
		}
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			t.Fatalf("KV value does not parse: %v", err)
		}
		bad := s.Find("bad")
		return bad != nil && bad.State == fleetwatch.StateOpen
	})

	// HTTP: /healthz, /metrics and /api/decisions on real sockets.
	if code, body := testkit.HTTPGet(t, p.httpURL+"/healthz"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("/healthz = %d %s", code, body)
	}
	_, metricsText := testkit.HTTPGet(t, p.httpURL+"/metrics")
	for _, want := range []string{
		`fleetwatch_ingest_rejects_total{reason="out_of_range"} 2`,
		`fleetwatch_backend_state{pool="p1",backend="bad"} 2`,
		`fleetwatch_ingest_events_total{outcome="error"} 5`,
		`fleetwatch_decisions_published_total`,
		`fleetwatch_decision_latency_seconds_count`,
	} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	_, body := testkit.HTTPGet(t, p.httpURL+"/api/decisions")
	var all []fleetwatch.Snapshot
	if err := json.Unmarshal([]byte(body), &all); err != nil {
		t.Fatalf("/api/decisions: %v", err)
	}
	found := false
	for _, s := range all {
		if s.Pool == "p1" && s.Find("bad") != nil && s.Find("bad").State == fleetwatch.StateOpen {
			found = true
		}
	}
	if !found {
		t.Errorf("/api/decisions lacks p1 with bad open: %s", body)
	}

	// Graceful shutdown: the context's end drains, publishes a final
	// snapshot, and Run returns nil.
	before := snaps.Count()
	if err := p.stop(); err != nil {
		t.Errorf("Run returned %v after its context ended", err)
	}
	if !strings.Contains(logs.String(), "final snapshot") {
		t.Errorf("serve did not report a final snapshot:\n%s", logs.String())
	}
	nc.Flush()
	if snaps.Count() <= before {
		t.Errorf("no snapshot published during shutdown")
	}
}
