package probes_test

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func TestParseInfoMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       map[string]string
	}{
		{"vLLM exposition", `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",engine="0",num_gpu_blocks="2048"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:model_config_info{dtype="torch.bfloat16",model="/models/llama",quantization="awq",served_model_name="llama"} 1.0
`, map[string]string{
			"vllm:cache_config_info.cache_dtype":       "fp8",
			"vllm:model_config_info.dtype":             "torch.bfloat16",
			"vllm:model_config_info.model":             "/models/llama",
			"vllm:model_config_info.quantization":      "awq",
			"vllm:model_config_info.served_model_name": "llama",
		}},
		{"escapes and spaces", `vllm:model_config_info{ model="a \"b\"\\c\nd" , quantization="None"} 1` + "\r\n",
			map[string]string{"vllm:model_config_info.model": "a \"b\"\\c\nd", "vllm:model_config_info.quantization": "None"}},
		{"no info gauges", "vllm:num_requests_waiting 0\nprocess_cpu_seconds_total 1\n", map[string]string{}},
		{"malformed info line is skipped", "vllm:model_config_info{model=\"x\n" + `vllm:cache_config_info{cache_dtype="auto"} 1`,
			map[string]string{"vllm:cache_config_info.cache_dtype": "auto"}},
		{"empty", "", map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := probes.ParseInfoMetrics(bufio.NewReader(strings.NewReader(tc.text)))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzParseInfoMetrics: arbitrary bytes never panic, and label values
// written with the text format's escapes come back as they were.
func FuzzParseInfoMetrics(f *testing.F) {
	f.Add("awq", "torch.float16", "vllm:num_requests_running 1\n")
	f.Add("a\"b\\c\nd", "", "")
	f.Add("", "x", "vllm:model_config_info{")
	f.Fuzz(func(t *testing.T, quant, dtype, noise string) {
		probes.ParseInfoMetrics(bufio.NewReader(strings.NewReader(noise + quant + dtype)))
		esc := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
		text := fmt.Sprintf("%s\nvllm:model_config_info{quantization=\"%s\",dtype=\"%s\"} 1\n", noise, esc.Replace(quant), esc.Replace(dtype))
		got, err := probes.ParseInfoMetrics(bufio.NewReader(strings.NewReader(text)))
		if err != nil {
			t.Fatal(err)
		}
		if got["vllm:model_config_info.quantization"] != quant || got["vllm:model_config_info.dtype"] != dtype {
			t.Errorf("round trip of %q, %q gave %q", quant, dtype, got)
		}
	})
}

func TestTierChanges(t *testing.T) {
	base := drift.Identity{ModelIDs: []string{"llama"}, ModelRoot: "/m/llama", MaxModelLen: 8192, Version: "0.11.0",
		Info: map[string]string{"vllm:model_config_info.quantization": "None"}, InfoMeasured: true, Fingerprint: "fp_1"}
	with := func(f func(*drift.Identity)) drift.Identity {
		i := base
		f(&i)
		return i
	}
	for _, tc := range []struct {
		name string
		now  drift.Identity
		want []drift.IdentityChange
	}{
		{"same", base, nil},
		{"fingerprint alone is not the identity tier", with(func(i *drift.Identity) { i.Fingerprint = "fp_2" }), nil},
		{"metrics not read this cycle", with(func(i *drift.Identity) { i.Info, i.InfoMeasured = nil, false }), nil},
		{"quantization", with(func(i *drift.Identity) { i.Info = map[string]string{"vllm:model_config_info.quantization": "awq"} }),
			[]drift.IdentityChange{{Field: "vllm:model_config_info.quantization", Before: "None", After: "awq"}}},
		{"info label gone", with(func(i *drift.Identity) { i.Info = map[string]string{} }),
			[]drift.IdentityChange{{Field: "vllm:model_config_info.quantization", Before: "None", After: ""}}},
		{"models, root, length, version", drift.Identity{ModelIDs: []string{"llama", "mistral"}, ModelRoot: "/m/mistral", MaxModelLen: 4096, Version: "0.12.0"},
			[]drift.IdentityChange{
				{Field: "model_ids", Before: "llama", After: "llama,mistral"},
				{Field: "model_root", Before: "/m/llama", After: "/m/mistral"},
				{Field: "max_model_len", Before: "8192", After: "4096"},
				{Field: "version", Before: "0.11.0", After: "0.12.0"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, base.TierChanges(tc.now)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// a baseline without a version (not vLLM) does not compare it
	if ch := (drift.Identity{}).TierChanges(drift.Identity{Version: "1"}); len(ch) != 0 {
		t.Errorf("version compared without one in the baseline: %v", ch)
	}
}

// TestIdentityChangeNotConfirmed: an identity change that is gone at the
// next cycle (and that the logprobs do not back) returns to ok.
func TestIdentityChangeNotConfirmed(t *testing.T) {
	s := defaultSuite(t)
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 3})
	mon := drift.NewMonitor("p", "b", drift.MonitorSettings{Suite: s, Enrol: 3, EnrolMin: -1}, nil)
	id := drift.Identity{ModelIDs: []string{"toy"}, Version: "v1", InfoMeasured: true,
		Info: map[string]string{"vllm:model_config_info.quantization": "None"}}
	at := time.Unix(1e9, 0)
	observe := func(id drift.Identity) drift.Result {
		t.Helper()
		at = at.Add(5 * time.Minute)
		cy := toylm.Cycle(s, m, at)
		cy.Identity = id
		r, err := mon.Observe(cy, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for range 4 {
		observe(id)
	}
	changed := id
	changed.Info = map[string]string{"vllm:model_config_info.quantization": "fp8"}
	r := observe(changed)
	if r.Alert == nil || r.Alert.Status != fleetwatch.DriftSuspect || len(r.IdentityTier) != 1 {
		t.Fatalf("identity change: %+v, want a suspect alert", r)
	}
	want := []drift.IdentityChange{{Field: "vllm:model_config_info.quantization", Before: "None", After: "fp8"}}
	if diff := cmp.Diff(want, r.Alert.Evidence.Extra["identity_changes"]); diff != "" {
		t.Errorf("alert evidence identity_changes (-want +got):\n%s", diff)
	}
	if r.Alert.Score != 1 || r.Alert.Threshold != 1 {
		t.Errorf("score/threshold %v/%v, want 1/1 (one field changed)", r.Alert.Score, r.Alert.Threshold)
	}
	r = observe(id)
	if r.Alert == nil || r.Alert.Status != fleetwatch.DriftOK || !strings.HasPrefix(r.Alert.Reason, "not confirmed") {
		t.Fatalf("identity back: %+v, want ok, not confirmed", r.Alert)
	}
}

// TestIdentityTierOverHTTP: the fake backend is redeployed with AWQ
// weights (its /v1/models root and vLLM's quantization label change, the
// toy model does not): suspect at once with the before and after in the
// alert, drifted when the change persists at the second cycle.
func TestIdentityTierOverHTTP(t *testing.T) {
	fs, hs := toyServer(t, toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003}), fakeai.Behavior{Model: "llama"})
	sink := newSink()
	p, err := probes.New(probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}},
		Sink: sink, Enrol: 3, EnrolMin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	if got := sink.alertsFor("b"); len(got) != 0 {
		t.Fatalf("alerts before any change: %+v", got)
	}
	fs.SetIdentity(fs.Identity().Quantized("AWQ"))
	// one scheduled cycle: the metadata change runs the second at once
	if err := p.ProbeBackend(t.Context(), "p", "b"); err != nil {
		t.Fatal(err)
	}
	alerts := sink.alertsFor("b")
	if len(alerts) != 2 || alerts[0].Status != fleetwatch.DriftSuspect || alerts[1].Status != fleetwatch.DriftDrifted {
		t.Fatalf("alerts %+v, want suspect then drifted", alerts)
	}
	want := []drift.IdentityChange{
		{Field: "model_root", Before: "/models/llama", After: "/models/llama-awq"},
		{Field: "vllm:model_config_info.model", Before: "/models/llama", After: "/models/llama-awq"},
		{Field: "vllm:model_config_info.quantization", Before: "None", After: "AWQ"},
	}
	for _, a := range alerts {
		if diff := cmp.Diff(want, a.Evidence.Extra["identity_changes"]); diff != "" {
			t.Errorf("%s alert identity_changes (-want +got):\n%s", a.Status, diff)
		}
	}
	if !strings.Contains(alerts[0].Reason, `vllm:model_config_info.quantization "None" -> "AWQ"`) ||
		!strings.Contains(alerts[1].Reason, "persisted for a second cycle") {
		t.Errorf("reasons %q / %q", alerts[0].Reason, alerts[1].Reason)
	}
	if s := p.Statuses()[0]; s.Status != fleetwatch.DriftDrifted || sink.statuses["b"] != fleetwatch.DriftDrifted {
		t.Errorf("status %s (sink %s), want drifted", s.Status, sink.statuses["b"])
	}
}

// TestIdentityCheckedAtStart: a backend redeployed while the probes were
// down is probed as soon as they start, not at its next scheduled cycle.
func TestIdentityCheckedAtStart(t *testing.T) {
	fs, hs := toyServer(t, toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003}), fakeai.Behavior{})
	store := &mapStore{m: map[string][]byte{}}
	settings := probes.Settings{Targets: []probes.Target{{Pool: "p", Backend: "b", URL: hs.URL}}, Store: store,
		States: &mapStore{m: map[string][]byte{}}, Enrol: 3, EnrolMin: -1, Schedule: "@every 1h", Jitter: -1}
	first, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := first.ProbeBackend(t.Context(), "p", "b"); err != nil {
			t.Fatal(err)
		}
	}
	fs.SetIdentity(fakeai.Identity{Version: "fakeai-2"})
	sink := newSink()
	settings.Sink = sink
	second, err := probes.New(settings)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	var statuses []fleetwatch.DriftStatus
	for len(statuses) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("alerts %v within 20s of the start (schedule 1h): %+v", statuses, second.Statuses()[0])
		}
		time.Sleep(20 * time.Millisecond)
		statuses = statuses[:0]
		for _, a := range sink.alertsFor("b") {
			statuses = append(statuses, a.Status)
		}
	}
	if !slices.Equal(statuses, []fleetwatch.DriftStatus{fleetwatch.DriftSuspect, fleetwatch.DriftDrifted}) {
		t.Errorf("alerts %v, want suspect, drifted", statuses)
	}
}

// TestEnrolmentKeepsTheMinimumSpan: with serve's defaults (8 cycles, 2
// hours) and a cycle every 5 minutes, the baseline is built from every
// cycle of the 2 hours (25), not the newest 16: the numeric paths load
// moves through in that span are in it (docs/DRIFT.md "The sampled tier
// under load noise"). Without a minimum span it keeps 2 x enrol.
func TestEnrolmentKeepsTheMinimumSpan(t *testing.T) {
	t.Parallel() // CPU and loopback only, on a fake clock: overlaps the rest of the package
	s := defaultSuite(t)
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.003, NoiseSeed: 3})
	for _, tc := range []struct {
		min  time.Duration
		want int
	}{{2 * time.Hour, 25}, {-1, 8}} {
		mon := drift.NewMonitor("p", "b", drift.MonitorSettings{Suite: s, Enrol: 8, EnrolMin: tc.min}, nil)
		at := time.Unix(1e9, 0)
		for mon.Baseline() == nil {
			r, err := mon.Observe(toylm.Cycle(s, m, at), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Enrolled && !r.Enrolling {
				t.Fatalf("neither enrolling nor enrolled: %+v", r)
			}
			at = at.Add(5 * time.Minute)
		}
		if got := mon.Baseline().Cycles; got != tc.want {
			t.Errorf("enrol_min %v: baseline of %d cycles, want %d", tc.min, got, tc.want)
		}
	}
}
