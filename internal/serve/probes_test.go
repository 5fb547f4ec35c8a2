package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

// driftStatuses records setDrift calls.
type driftStatuses struct {
	mu sync.Mutex
	m  map[string]fleetwatch.DriftStatus
}

func (d *driftStatuses) set(pool, backend string, s fleetwatch.DriftStatus) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m[pool+"/"+backend] = s
}

func (d *driftStatuses) get(k string) fleetwatch.DriftStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[k]
}

func TestStartProbesEndToEnd(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ref := toylm.New(toylm.Config{})
	q4, _ := ref.Quantized(toylm.KLQ4)
	switches := map[string]*toylm.Switch{}
	cfg := config.Default()
	cfg.Data = t.TempDir()
	pool := config.PoolConfig{ID: "llama", Models: []string{"llama-3.1-70b"}}
	for i, id := range []string{"vllm-a", "vllm-b", "vllm-c"} {
		o := toylm.Options{Sigma: 0.03, NoiseSeed: uint64(i + 1), Fingerprint: "fp_1"}
		switches[id] = toylm.NewSwitch(ref.With(o))
		hs := httptest.NewServer(fakeai.New(fakeai.Settings{Completer: switches[id], Behavior: fakeai.Behavior{Model: "llama-3.1-70b"}}))
		t.Cleanup(hs.Close)
		pool.Backends = append(pool.Backends, config.BackendConfig{ID: id, URL: hs.URL + "/v1"})
	}
	cfg.Pools = []config.PoolConfig{pool}
	cfg.Probes.Schedule = "@every 1s"
	cfg.Probes.Enrol = 3
	cfg.Probes.EnrolMin = &config.Duration{}
	cfg.Review.Schedule = "@every 1s"
	var logs bytes.Buffer
	var logMu sync.Mutex
	statuses := &driftStatuses{m: map[string]fleetwatch.DriftStatus{}}
	deps := probeDeps{cfg: cfg, nc: nc, js: js, prefix: "fw", setDrift: statuses.set,
		logf: func(f string, a ...any) {
			logMu.Lock()
			defer logMu.Unlock()
			fmt.Fprintf(&logs, f+"\n", a...)
		}}

	alerts := make(chan fleetwatch.DriftAlert, 64)
	sub, err := nc.Subscribe("fw.drift.llama", func(m *nats.Msg) {
		var a fleetwatch.DriftAlert
		if json.Unmarshal(m.Data, &a) == nil {
			alerts <- a
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	probesRunning, err := startProbes(t.Context(), deps)
	if err != nil {
		t.Fatal(err)
	}
	stop := probesRunning.Stop
	defer func() {
		stop()
		if t.Failed() {
			logMu.Lock()
			t.Logf("probe logs:\n%s", logs.String())
			logMu.Unlock()
		}
	}()
	for _, id := range []string{"vllm-a", "vllm-b", "vllm-c"} {
		testkit.Eventually(t, 20*time.Second, id+" enrolled", func() bool { return statuses.get("llama/"+id) == fleetwatch.DriftOK })
	}
	// vllm-c is redeployed with a q4-like quantization
	switches["vllm-c"].Set(q4.With(toylm.Options{Sigma: 0.03, NoiseSeed: 3, Fingerprint: "fp_2"}))
	var got fleetwatch.DriftAlert
	testkit.Eventually(t, 20*time.Second, "a drift alert for vllm-c", func() bool {
		select {
		case a := <-alerts:
			if a.Backend == "vllm-c" && a.Status == fleetwatch.DriftDrifted {
				got = a
				return true
			}
		default:
		}
		return false
	})
	// The fingerprint after is the commonest among the cycle's sampled
	// answers. A cycle can straddle the switch (under load, its sampled
	// prompts before it and the teacher-forced texts, which catch it,
	// after): then the answers still carried the old fingerprint.
	ev := got.Evidence
	fpOK := ev.FingerprintAfter != nil && (*ev.FingerprintAfter == "fp_2" ||
		ev.FingerprintBefore != nil && *ev.FingerprintAfter == *ev.FingerprintBefore && strings.HasPrefix(got.Reason, "teacher-forced"))
	if got.Against != fleetwatch.AgainstBaseline || ev.MeanAbsLogprobDelta == nil || ev.Prompts != 16 || !fpOK || len(ev.ModelIDs) != 1 {
		t.Errorf("alert %+v, evidence %+v", got, ev)
	}
	if s := statuses.get("llama/vllm-c"); s != fleetwatch.DriftDrifted {
		t.Errorf("setDrift(vllm-c) = %s, want drifted", s)
	}
	reviewDir := filepath.Join(cfg.Data, "reviews")
	testkit.Eventually(t, 20*time.Second, "a review naming vllm-c", func() bool {
		files, _ := filepath.Glob(filepath.Join(reviewDir, "*.md"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if strings.Contains(string(b), "| vllm-c | drifted |") {
				return true
			}
		}
		return false
	})

	// status is answered by the running probes, on the control subject
	for _, st := range askStatusesT(t, nc) {
		if st.Backend == "vllm-c" && st.Status != fleetwatch.DriftDrifted {
			t.Errorf("drift-status reply for vllm-c: %s, want drifted", st.Status)
		}
	}

	// restart: baselines come back from KV, no new enrolment
	stop()
	kv, err := js.KeyValue(t.Context(), "fw_probe_baselines")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(t.Context())
	if err != nil || len(keys) != 3 {
		t.Fatalf("baseline keys %v (%v), want 3", keys, err)
	}
	statuses2 := &driftStatuses{m: map[string]fleetwatch.DriftStatus{}}
	deps.setDrift = statuses2.set
	restartAt := time.Now()
	probesRunning, err = startProbes(t.Context(), deps)
	if err != nil {
		t.Fatal(err)
	}
	stop = probesRunning.Stop
	// the stored baselines and drift states are loaded before startProbes
	// returns: vllm-a is ok (an enrolling backend would be unknown) and
	// vllm-c still drifted, not back to its baseline's "ok"
	if a, c := statuses2.get("llama/vllm-a"), statuses2.get("llama/vllm-c"); a != fleetwatch.DriftOK || c != fleetwatch.DriftDrifted {
		t.Errorf("right after the restart: vllm-a %s, vllm-c %s; want ok, drifted", a, c)
	}
	for _, s := range askStatusesT(t, nc) {
		if s.Backend == "vllm-a" && (s.Enrolling || !s.BaselineCreated.Before(restartAt)) {
			t.Errorf("vllm-a after a restart: enrolling %v, baseline created %v (restart at %v): the stored baseline was not used",
				s.Enrolling, s.BaselineCreated, restartAt)
		}
	}

	// an operator re-baselines vllm-c: recorded in FW_DRIFT
	req, _ := json.Marshal(control.RebaselineRequest{Pool: "llama", Backend: "vllm-c", By: "alice"})
	msg, err := nc.Request(fleetwatch.Subjects{}.Control(control.VerbRebaseline), req, 10*time.Second)
	if err != nil {
		t.Fatalf("rebaseline request: %v", err)
	}
	var reply control.Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || !reply.OK {
		t.Fatalf("rebaseline reply %s (%v)", msg.Data, err)
	}
	var recorded bool
	testkit.Eventually(t, 10*time.Second, "the re-baseline in FW_DRIFT", func() bool {
		as, _, err := control.ReadDrift(t.Context(), js, fleetwatch.Subjects{}, time.Now().Add(-time.Hour))
		if err != nil {
			return false
		}
		for _, a := range as {
			if a.Backend == "vllm-c" && a.Status == fleetwatch.DriftUnknown && a.Evidence.Extra["requested_by"] == "alice" {
				recorded = true
			}
		}
		return recorded
	})
}

func askStatusesT(t *testing.T, nc *nats.Conn) []probes.BackendStatus {
	t.Helper()
	msg, err := nc.Request(fleetwatch.Subjects{}.Control(control.VerbDriftStatus), nil, 10*time.Second)
	if err != nil {
		t.Fatalf("drift-status request: %v", err)
	}
	var reply control.Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || !reply.OK || reply.Statuses == nil {
		t.Fatalf("drift-status reply %s (%v)", msg.Data, err)
	}
	return reply.Statuses
}

func TestBaselineKeysAreValidAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range []string{"vllm-a", "http://10.0.0.1:8000", "a.b", "weird |\"id"} {
		k := control.Key("meta-llama/Llama-3.1-70B", b)
		if err := fleetwatch.ValidatePoolID(k); err != nil || seen[k] {
			t.Errorf("key %q for %q: %v (seen %v)", k, b, err, seen[k])
		}
		seen[k] = true
	}
}
