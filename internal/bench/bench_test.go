package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded server's background goroutines end asynchronously
		// after Shutdown returns.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}

// TestRunSmall runs every measurement with a few events against an
// embedded NATS server: every event reaches the count-only subscriber and
// the daemon, and every trip shows up in a snapshot.
func TestRunSmall(t *testing.T) {
	for _, noJS := range []bool{false, true} {
		r, err := Run(t.Context(), Settings{Events: 2000, Batch: 100, Trips: 3, Rounds: 1, NoJetStream: noJS})
		if err != nil {
			t.Fatalf("no-jetstream %v: %v", noJS, err)
		}
		base := "baseline: count-only nats.go subscriber, 1 event/msg, stream capture"
		if noJS {
			base = "baseline: count-only nats.go subscriber, 1 event/msg"
		}
		want := []Result{
			{Name: base, Events: 2000, Messages: 2000},
			{Name: "fleetwatch: collector + analyzer, 1 event/msg", Events: 2000, Messages: 2000},
			{Name: "fleetwatch: collector + analyzer, NDJSON 100 events/msg", Events: 2000, Messages: 20},
		}
		var got []Result
		for _, res := range r.Throughput {
			if res.Seconds <= 0 || res.PerSecond <= 0 {
				t.Errorf("%s: %v s, %v events/s, want > 0", res.Name, res.Seconds, res.PerSecond)
			}
			got = append(got, Result{Name: res.Name, Events: res.Events, Messages: res.Messages, Dropped: res.Dropped})
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("throughput runs (-want +got):\n%s", diff)
		}
		lat := r.DecisionLatencyMs
		if !(0 < lat["p50"] && lat["p50"] <= lat["p99"] && lat["p99"] <= lat["max"]) {
			t.Errorf("decision latency %v: want 0 < p50 <= p99 <= max", lat)
		}

		var text bytes.Buffer
		if err := r.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{base, "ratio fleetwatch/baseline (1 event/msg): ", "ratio NDJSON/baseline: ", "(3 trips, heartbeat 1s): p50 "} {
			if !strings.Contains(text.String(), w) {
				t.Errorf("text report lacks %q:\n%s", w, text.String())
			}
		}
		var js bytes.Buffer
		if err := r.WriteJSON(&js); err != nil {
			t.Fatal(err)
		}
		var back map[string]json.RawMessage
		if err := json.Unmarshal(js.Bytes(), &back); err != nil {
			t.Fatal(err)
		}
		if len(back) != 2 || back["throughput"] == nil || back["decision_latency_ms"] == nil {
			t.Errorf("JSON report %s: want throughput and decision_latency_ms", js.String())
		}
	}
}

func TestEventsAndBatches(t *testing.T) {
	evs := Events(250, 256)
	for i, e := range evs {
		if len(e) != 256 {
			t.Fatalf("event %d has %d bytes, want 256: %s", i, len(e), e)
		}
		var v map[string]any
		if err := json.Unmarshal(e, &v); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if !bytes.Contains(evs[7], []byte(`"status":500`)) || !bytes.Contains(evs[19], []byte(`"status":429`)) || !bytes.Contains(evs[0], []byte(`"status":200`)) {
		t.Errorf("statuses of events 0, 7, 19: %s %s %s", evs[0], evs[7], evs[19])
	}
	msgs := Batches(evs, 100)
	var lines []int
	for _, m := range msgs {
		lines = append(lines, bytes.Count(m, []byte("\n"))+1)
	}
	if diff := cmp.Diff([]int{100, 100, 50}, lines); diff != "" {
		t.Errorf("events per batch (-want +got):\n%s", diff)
	}
	if got := string(msgs[2]); got != string(bytes.Join(evs[200:], []byte("\n"))) {
		t.Errorf("last batch is not the last 50 events joined by newlines")
	}
}

func TestMemory(t *testing.T) {
	m, err := Memory(1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	if m.HeapBytes <= 0 {
		t.Errorf("heap grew by %v bytes tracking 1000 backends, want > 0", m.HeapBytes)
	}
	var b strings.Builder
	if err := m.Write(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "memory: 1000 backends in 10 pools, full ") {
		t.Errorf("memory line %q", b.String())
	}
}
