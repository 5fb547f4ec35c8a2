package probes_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func fpEvent(pool, backend, fp string, at time.Time) fleetwatch.Event {
	return fleetwatch.Event{Pool: pool, Backend: backend, Fingerprint: fp, TS: at}
}

func TestFingerprints(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	f := drift.NewFingerprints(drift.FingerprintSettings{})
	steps := []struct {
		name  string
		batch []fleetwatch.Event
		want  []drift.FingerprintEvent
	}{
		{"first sight is no event; events without a fingerprint are skipped", []fleetwatch.Event{
			fpEvent("p", "a", "fp_1", at(0)), fpEvent("p", "b", "fp_1", at(0)), fpEvent("p", "c", "", at(0)),
			fpEvent("q", "x", "fp_9", at(0)), fpEvent("q", "y", "fp_8", at(0)),
		}, nil},
		{"the same again", []fleetwatch.Event{fpEvent("p", "a", "fp_1", at(1)), fpEvent("p", "a", "fp_1", at(1))}, nil},
		{"c appears with another fingerprint: it disagrees with the majority of two", []fleetwatch.Event{fpEvent("p", "c", "fp_2", at(2))},
			[]drift.FingerprintEvent{{Pool: "p", Backend: "c", Kind: drift.FingerprintDisagrees, Before: "fp_1", After: "fp_2", At: at(2)}}},
		{"c still disagrees: no new event", []fleetwatch.Event{fpEvent("p", "c", "fp_2", at(3))}, nil},
		{"a changes: a change; now nobody has a majority", []fleetwatch.Event{fpEvent("p", "a", "fp_3", at(4))},
			[]drift.FingerprintEvent{{Pool: "p", Backend: "a", Kind: drift.FingerprintChanged, Before: "fp_1", After: "fp_3", At: at(4), Changes: 1}}},
		{"a flaps within the minute: counted, not told", []fleetwatch.Event{fpEvent("p", "a", "fp_1", at(10)), fpEvent("p", "a", "fp_3", at(11))}, nil},
		{"a minute later it is told again, and c disagrees with the majority of a and b again", []fleetwatch.Event{fpEvent("p", "a", "fp_1", at(70))},
			[]drift.FingerprintEvent{
				{Pool: "p", Backend: "a", Kind: drift.FingerprintChanged, Before: "fp_3", After: "fp_1", At: at(70), Changes: 4},
				{Pool: "p", Backend: "c", Kind: drift.FingerprintDisagrees, Before: "fp_1", After: "fp_2", At: at(70)},
			}},
		{"two backends that differ blame nobody", []fleetwatch.Event{fpEvent("q", "y", "fp_7", at(80))},
			[]drift.FingerprintEvent{{Pool: "q", Backend: "y", Kind: drift.FingerprintChanged, Before: "fp_8", After: "fp_7", At: at(80), Changes: 1}}},
	}
	for _, s := range steps {
		if diff := cmp.Diff(s.want, f.Observe(s.batch)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
	}
	cur := f.Current()
	if len(cur) != 5 || cur[0].Backend != "a" || cur[0].After != "fp_1" || cur[0].Changes != 4 {
		t.Errorf("Current() = %+v", cur)
	}
}

// TestTrafficFingerprintWithProbeEvidence: the probe's fingerprint changes
// while the model does not: only a metadata event. Once traffic shows the
// same change, the next cycle is suspect (the fingerprint is then part of
// the identity evidence), and the one after drifted (it persisted). The
// event is counted, shown in the status, and runs a cycle at once under
// Run.
func TestTrafficFingerprintWithProbeEvidence(t *testing.T) {
	fs, hs := toyServer(t, toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003}), fakeai.Behavior{Fingerprint: "fp_1"})
	sink := newSink()
	set := metrics.NewSet()
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		Sink: sink, Enrol: 3, EnrolMin: -1, Metrics: set, Schedule: "@every 1h", Jitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	probe := func() {
		t.Helper()
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		probe()
	}
	fs.UpdateBehavior(func(b fakeai.Behavior) (fakeai.Behavior, error) { b.Fingerprint = "fp_2"; return b, nil })
	probe() // the probe alone sees fp_2: an event and an extra cycle, no verdict
	if a := sink.alertsFor("b"); len(a) != 0 {
		t.Fatalf("a fingerprint change in probes alone raised %+v", a)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	before := p.Statuses()[0].LastCycle
	p.Fingerprint([]drift.FingerprintEvent{{Pool: "p", Backend: "b", Kind: drift.FingerprintChanged, Before: "fp_1", After: "fp_2", Changes: 1},
		{Pool: "p", Backend: "not-a-target", Kind: drift.FingerprintChanged, After: "x"}})
	deadline := time.Now().Add(20 * time.Second)
	for len(sink.alertsFor("b")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no alert within 20s of the fingerprint event (schedule 1h): %+v", p.Statuses()[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	s := p.Statuses()[0]
	if !s.LastCycle.After(before) || s.FingerprintEvents != 1 || s.TrafficFingerprint != "fp_2" || s.LastFingerprintEvent == nil {
		t.Errorf("status after the event: %+v", s)
	}
	a := sink.alertsFor("b")[0]
	want := []drift.IdentityChange{{Field: "system_fingerprint", Before: "fp_1", After: "fp_2"}}
	if a.Status != fleetwatch.DriftSuspect || a.Evidence.Extra["traffic_fingerprint"] != "fp_2" || !cmp.Equal(want, a.Evidence.Extra["identity_changes"]) {
		t.Errorf("alert %+v, evidence %+v: want suspect on the fingerprint", a, a.Evidence.Extra)
	}
	probe()
	if got := sink.alertsFor("b"); len(got) != 2 || got[1].Status != fleetwatch.DriftDrifted {
		t.Errorf("alerts %+v: want drifted once the change persisted", got)
	}
	var sb strings.Builder
	set.WritePrometheus(&sb)
	if !strings.Contains(sb.String(), `fleetwatch_drift_fingerprint_events_total{pool="p",backend="b",kind="changed"} 1`) ||
		strings.Contains(sb.String(), "not-a-target") {
		t.Errorf("metrics:\n%s", sb.String())
	}
}

// BenchmarkFingerprintsObserve is the hot path: a batch of 256 events of
// one pool, every one with the (interned) fingerprint its backend had.
func BenchmarkFingerprintsObserve(b *testing.B) {
	f := drift.NewFingerprints(drift.FingerprintSettings{})
	fp := "fp_44d7f2"
	backends := []string{"vllm-a", "vllm-b", "vllm-c", "vllm-d"}
	batch := make([]fleetwatch.Event, 256)
	for i := range batch {
		batch[i] = fpEvent("llama", backends[i/64], fp, time.Unix(1e9, 0))
	}
	f.Observe(batch)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if evs := f.Observe(batch); evs != nil {
			b.Fatal(evs)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/event")
}

// FuzzUnmarshalState: arbitrary bytes never panic, and a state that
// decodes encodes back to what decodes the same.
func FuzzUnmarshalState(f *testing.F) {
	f.Add([]byte(`{"v":1,"pool":"p","backend":"b","status":"drifted","cusum":{"C":3.5,"RunExcess":0.1,"RunN":2,"Cooldown":1},"quarantined":true}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`{"v":1,"prev":{"At":"2026-01-01T00:00:00Z","Obs":[{"Prompt":"a","Tokens":[{"Token":"x","Logprob":-0.1,"Top":[{"t":"x","l":-0.1}]}]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := drift.UnmarshalState(data)
		if err != nil {
			return
		}
		enc, err := json.Marshal(s)
		if err != nil {
			return // e.g. a NaN can not come from JSON, but stay safe
		}
		again, err := drift.UnmarshalState(enc)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", enc, err)
		}
		if diff := cmp.Diff(s, again); diff != "" {
			t.Errorf("round trip (-first +second):\n%s", diff)
		}
	})
}
