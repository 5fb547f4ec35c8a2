package main

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestDriftUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"nope"},
		{"rebaseline", "only-pool"},
		{"review", "extra-arg"},
	} {
		var out, errOut bytes.Buffer
		if err := runDrift(t.Context(), args, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("drift %v: err %v, want errUsage", args, err)
		}
	}
	var out, errOut bytes.Buffer
	if err := runDrift(t.Context(), []string{"rebaseline", "bad..pool", "b"}, &out, &errOut); !errors.Is(err, fleetwatch.ErrInvalidPool) {
		t.Errorf("invalid pool: %v", err)
	}
}

// TestDriftSimSmoke runs the built binary: the harness is single-threaded
// arithmetic that the race detector slows 13x (147 s against 11 s) without
// anything to find in it; TestDriftSimNullOnly runs the command in process,
// with its workers, under the race detector.
func TestDriftSimSmoke(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), fleetwatchBinary(t), "drift", "sim", "--cycles", "4", "--backends", "1", "--trials", "1", "--peer-trials", "1", "--max-delay", "1", "--enrol", "6", "--enrol-min", "0")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("fleetwatch drift sim: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{
		"## Null (unchanged backend, and fp16 rounding)",
		"| 0.1 | fp16 | 4 | 0 |",
		"| swap | 0.003 | 1/1 [0.03, 1.00] |",
		"| swap | load | 1/1 [0.03, 1.00] |",
		"| q4-like | 0.1 | 1/1 [0.03, 1.00] |",
		"| q4-like | 0.03 | 1/1 [0.03, 1.00] |", // peers: named
		"- q8-like: KL 0.00",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sim output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDriftSimNullOnly(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := runDrift(t.Context(), []string{"sim", "--null-only", "--cycles", "4", "--backends", "2", "--enrol", "3", "--enrol-min", "0", "--workers", "2", "--seed", "3"}, &out, &errOut)
	if err != nil {
		t.Fatalf("drift sim --null-only: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{"| 0.003 | 4 |", "| load | 4 |", "| all levels | 16 |", "2 backends of 2 judged cycles per level, 2 at once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "## Power") {
		t.Errorf("--null-only ran the power trials:\n%s", out.String())
	}
	if err := runDrift(t.Context(), []string{"sim", "--null-only", "--workers", "0"}, &out, &errOut); err == nil {
		t.Error("--workers 0 accepted")
	}
}

func TestDriftRebaselineWithoutServe(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{}
	kv, err := control.OpenBaselines(t.Context(), js, subj)
	if err != nil {
		t.Fatal(err)
	}
	if err := (control.KVBaselines{KV: kv}).Save(t.Context(), "p", "b", []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := runDrift(t.Context(), []string{"rebaseline", "--nats", url, "--by", "bob", "p", "b"}, &out, &errOut); err != nil {
		t.Fatalf("rebaseline: %v (%s)", err, errOut.String())
	}
	if data, err := (control.KVBaselines{KV: kv}).Load(t.Context(), "p", "b"); err != nil || len(data) != 0 {
		t.Errorf("baseline after rebaseline: %q %v, want empty", data, err)
	}
	alerts, _, err := control.ReadDrift(t.Context(), js, subj, time.Now().Add(-time.Hour))
	if err != nil || len(alerts) != 1 {
		t.Fatalf("alerts %+v %v, want the re-baseline", alerts, err)
	}
	if a := alerts[0]; a.Status != fleetwatch.DriftUnknown || a.Evidence.Extra["requested_by"] != "bob" || a.Suite != "default-v1" {
		t.Errorf("re-baseline alert %+v", a)
	}
	out.Reset()
	if err := runDrift(t.Context(), []string{"status", "--nats", url}, &out, &errOut); err != nil {
		t.Fatalf("status: %v", err)
	}
	if !strings.Contains(out.String(), "no running serve answered") || !regexpLine(out.String(), "p", "b", "unknown") {
		t.Errorf("status without serve:\n%s", out.String())
	}
}

func TestDriftReviewWithoutStream(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	var out, errOut bytes.Buffer
	err := runDrift(t.Context(), []string{"review", "--nats", url}, &out, &errOut)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("review without FW_DRIFT: %v, want ErrStreamNotFound", err)
	}
}

// TestDriftCLIAgainstServe runs `drift status`, `drift rebaseline` and
// `drift review` against a daemon running in process whose probes enrol a
// fake backend.
func TestDriftCLIAgainstServe(t *testing.T) {
	t.Parallel() // its own servers and processes: overlaps the rest of the package
	fake := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "vllm-a"}))
	t.Cleanup(fake.Close)
	cfg := config.Default()
	cfg.NATS.Listen = "127.0.0.1:-1"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = t.TempDir()
	cfg.Pools = []config.PoolConfig{{ID: "llama", Backends: []config.BackendConfig{{ID: "vllm-a", URL: fake.URL}}}}
	cfg.Probes.Schedule = "@every 1s"
	cfg.Probes.Enrol = 1
	cfg.Probes.EnrolMin = &config.Duration{}
	srv := runTestServe(t, cfg)
	url := srv.NATSURL()

	var out, errOut bytes.Buffer
	testkit.Eventually(t, 30*time.Second, "drift status showing vllm-a ok from serve", func() bool {
		out.Reset()
		err := runDrift(t.Context(), []string{"status", "--nats", url}, &out, &errOut)
		return err == nil && strings.Contains(out.String(), "from serve") && regexpLine(out.String(), "llama", "vllm-a", "ok")
	})
	out.Reset()
	if err := runDrift(t.Context(), []string{"rebaseline", "llama", "vllm-a", "--nats", url, "--by", "alice"}, &out, &errOut); err != nil {
		t.Fatalf("drift rebaseline: %v (%s)", err, errOut.String())
	}
	testkit.Eventually(t, 10*time.Second, "the re-baseline in the review", func() bool {
		out.Reset()
		err := runDrift(t.Context(), []string{"review", "--nats", url, "--since", "1h"}, &out, &errOut)
		return err == nil && strings.Contains(out.String(), "vllm-a") && strings.Contains(out.String(), "alice")
	})
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
