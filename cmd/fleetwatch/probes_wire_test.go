package main

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ref := toylm.New(toylm.Config{})
	q4, _ := ref.Quantized(toylm.KLQ4)
	switches := map[string]*toylm.Switch{}
	cfg := DefaultConfig()
	cfg.Data = t.TempDir()
	pool := PoolConfig{ID: "llama", Models: []string{"llama-3.1-70b"}}
	for i, id := range []string{"vllm-a", "vllm-b", "vllm-c"} {
		o := toylm.Options{Sigma: 0.03, NoiseSeed: uint64(i + 1), Fingerprint: "fp_1"}
		switches[id] = toylm.NewSwitch(ref.With(o))
		hs := httptest.NewServer(fakeai.New(fakeai.Settings{Completer: switches[id], Behavior: fakeai.Behavior{Model: "llama-3.1-70b"}}))
		t.Cleanup(hs.Close)
		pool.Backends = append(pool.Backends, BackendConfig{ID: id, URL: hs.URL + "/v1"})
	}
	cfg.Pools = []PoolConfig{pool}
	cfg.Probes.Schedule = "@every 1s"
	cfg.Probes.Enrol = 3
	cfg.Probes.EnrolMin = dur(0)
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

	stop, err := startProbes(t.Context(), deps)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stop()
		if t.Failed() {
			logMu.Lock()
			t.Logf("probe logs:\n%s", logs.String())
			logMu.Unlock()
		}
	}()
	for _, id := range []string{"vllm-a", "vllm-b", "vllm-c"} {
		eventually(t, 20*time.Second, id+" enrolled", func() bool { return statuses.get("llama/"+id) == fleetwatch.DriftOK })
	}
	// vllm-c is redeployed with a q4-like quantization
	switches["vllm-c"].Set(q4.With(toylm.Options{Sigma: 0.03, NoiseSeed: 3, Fingerprint: "fp_2"}))
	var got fleetwatch.DriftAlert
	eventually(t, 20*time.Second, "a drift alert for vllm-c", func() bool {
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
	if got.Against != fleetwatch.AgainstBaseline || got.Evidence.MeanAbsLogprobDelta == nil || got.Evidence.Prompts != 16 ||
		got.Evidence.FingerprintAfter == nil || *got.Evidence.FingerprintAfter != "fp_2" || len(got.Evidence.ModelIDs) != 1 {
		t.Errorf("alert %+v, evidence %+v", got, got.Evidence)
	}
	if s := statuses.get("llama/vllm-c"); s != fleetwatch.DriftDrifted {
		t.Errorf("setDrift(vllm-c) = %s, want drifted", s)
	}
	reviewDir := filepath.Join(cfg.Data, "reviews")
	eventually(t, 20*time.Second, "a review naming vllm-c", func() bool {
		files, _ := filepath.Glob(filepath.Join(reviewDir, "*.md"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if strings.Contains(string(b), "| vllm-c | drifted |") {
				return true
			}
		}
		return false
	})

	// the CLI: status answered by the running probes, review from FW_DRIFT
	var out, errOut bytes.Buffer
	if err := runDrift(t.Context(), []string{"status", "--nats", url}, &out, &errOut); err != nil {
		t.Fatalf("drift status: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "from serve") || !regexpLine(out.String(), "llama", "vllm-c", "drifted") {
		t.Errorf("drift status output:\n%s", out.String())
	}
	out.Reset()
	if err := runDrift(t.Context(), []string{"review", "--nats", url, "--since", "1h"}, &out, &errOut); err != nil {
		t.Fatalf("drift review: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "| vllm-c | drifted |") || !strings.Contains(out.String(), "ok -> **drifted**") {
		t.Errorf("drift review output:\n%s", out.String())
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
	stop, err = startProbes(t.Context(), deps)
	if err != nil {
		t.Fatal(err)
	}
	// the stored baselines are loaded at start: vllm-a is ok before its
	// first cycle (an enrolling backend would be unknown)
	eventually(t, 10*time.Second, "vllm-a ok after restart", func() bool { return statuses2.get("llama/vllm-a") == fleetwatch.DriftOK })
	for _, s := range askStatusesT(t, nc) {
		if s.Backend == "vllm-a" && (s.Enrolling || !s.BaselineCreated.Before(restartAt)) {
			t.Errorf("vllm-a after a restart: enrolling %v, baseline created %v (restart at %v): the stored baseline was not used",
				s.Enrolling, s.BaselineCreated, restartAt)
		}
	}

	// an operator re-baselines vllm-c: recorded in FW_DRIFT
	out.Reset()
	if err := runDrift(t.Context(), []string{"rebaseline", "llama", "vllm-c", "--nats", url, "--by", "alice"}, &out, &errOut); err != nil {
		t.Fatalf("drift rebaseline: %v (%s)", err, errOut.String())
	}
	var recorded bool
	eventually(t, 10*time.Second, "the re-baseline in FW_DRIFT", func() bool {
		as, _, err := readDrift(t.Context(), js, fleetwatch.Subjects{}, time.Now().Add(-time.Hour))
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
	s, err := askStatuses(nc, fleetwatch.Subjects{})
	if err != nil || s == nil {
		t.Fatalf("drift-status request: %v %v", s, err)
	}
	return s
}

// regexpLine reports whether one line of s holds every word, in order.
func regexpLine(s string, words ...string) bool {
	for _, line := range strings.Split(s, "\n") {
		rest, ok := line, true
		for _, w := range words {
			i := strings.Index(rest, w)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(w):]
		}
		if ok {
			return true
		}
	}
	return false
}

func TestProbeTargetsFromConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Pools = []PoolConfig{{ID: "p", Models: []string{"m"}, Backends: []BackendConfig{
		{ID: "a", URL: "http://a", APIKeyEnv: "KEY_A"},
		{ID: "no-url"},
	}}}
	got := probeTargets(cfg, func(k string) string { return map[string]string{"KEY_A": "secret"}[k] })
	if len(got) != 1 || got[0].APIKey != "secret" || got[0].URL != "http://a" || got[0].PreferModels[0] != "m" {
		t.Errorf("targets %+v", got)
	}
}

func TestBaselineKeysAreValidAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range []string{"vllm-a", "http://10.0.0.1:8000", "a.b", "weird |\"id"} {
		k := baselineKey("meta-llama/Llama-3.1-70B", b)
		if err := fleetwatch.ValidatePoolID(k); err != nil || seen[k] {
			t.Errorf("key %q for %q: %v (seen %v)", k, b, err, seen[k])
		}
		seen[k] = true
	}
}
