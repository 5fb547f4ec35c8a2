package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestOverrideCommand drains a backend with the command against a running
// serve (embedded NATS with JetStream): the next snapshot carries weight 0
// and the override; list shows it; clear ends it; a malformed request is
// refused with serve's error.
func TestOverrideCommand(t *testing.T) {
	srv := runTestServe(t, testServeConfig(t))
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "warmup", "w")
	testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("llama", "a", 200, 120))
	testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("llama", "b", 200, 120))
	testkit.Eventually(t, 10*time.Second, "llama's backends in a snapshot (serve refuses overrides of unknown ones)", func() bool {
		_, a := snaps.Backend("llama", "a")
		_, b := snaps.Backend("llama", "b")
		return a && b
	})
	base := "http://" + srv.HTTPAddr()

	var out, errOut bytes.Buffer
	run := func(args ...string) error {
		out.Reset()
		return runOverride(t.Context(), append(args, "--url", base), &out, &errOut)
	}
	if err := run("drain", "llama", "a", "--reason", "disk full", "--for", "30m", "--who", "carol"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "drain llama / a until") {
		t.Errorf("drain printed %q", out.String())
	}
	testkit.Eventually(t, 10*time.Second, "a drained in a snapshot", func() bool {
		b, _ := snaps.Backend("llama", "a")
		return b.Weight == 0 && b.Override != nil && b.Override.Kind == fleetwatch.OverrideDrain && b.Override.Who == "carol"
	})
	var ex bytes.Buffer
	if err := runExplain(t.Context(), []string{"llama", "a", "--url", base}, &ex, &errOut); err != nil ||
		!strings.Contains(ex.String(), "override: drain by carol until") || !strings.Contains(ex.String(), ": disk full") {
		t.Errorf("explain of the drained backend: %v %q", err, ex.String())
	}
	if err := run("list"); err != nil || !strings.Contains(out.String(), "llama / a: drain until") || !strings.Contains(out.String(), "by carol: disk full") {
		t.Errorf("list: %v %q", err, out.String())
	}
	if err := run("weight", "llama", "b", "--reason", "canary", "--for", "1m"); err == nil || !strings.Contains(err.Error(), "weight in [0, 1]") {
		t.Errorf("weight without --weight: %v, want serve's refusal", err)
	}
	if err := run("force-open", "llama", "b", "--for", "1m"); err == nil || !strings.Contains(err.Error(), "reason is required") {
		t.Errorf("no --reason: %v, want serve's refusal", err)
	}
	if err := run("drain", "llama", "b2-WRONG", "--reason", "typo", "--for", "5m"); err == nil ||
		!strings.Contains(err.Error(), `backend "b2-WRONG" of pool "llama" is neither configured nor in a current snapshot`) ||
		!strings.Contains(err.Error(), "known backends of llama: a, b") {
		t.Errorf("drain of a typo: %v, want serve's refusal naming it and the known backends", err)
	}
	if err := run("drain", "no-such-pool", "b1", "--reason", "typo", "--for", "5m"); err == nil || !strings.Contains(err.Error(), `pool "no-such-pool"`) {
		t.Errorf("drain in an unknown pool: %v, want serve's refusal naming it", err)
	}
	if err := run("drain", "llama", "c", "--reason", "planned", "--for", "5m", "--force"); err != nil || !strings.Contains(out.String(), "drain llama / c until") {
		t.Errorf("forced drain of planned llama/c: %v %q", err, out.String())
	}
	if err := run("clear", "llama", "c", "--reason", "not planned after all"); err != nil {
		t.Errorf("clear of llama/c: %v", err)
	}
	if err := run("drain", "llama"); err != errUsage {
		t.Errorf("two arguments: %v, want errUsage", err)
	}
	if err := run("clear", "llama", "a", "--reason", "disk replaced"); err != nil || !strings.Contains(out.String(), "cleared drain on llama / a") {
		t.Errorf("clear: %v %q", err, out.String())
	}
	testkit.Eventually(t, 10*time.Second, "a back to its own verdict", func() bool {
		b, _ := snaps.Backend("llama", "a")
		return b.Override == nil && b.Weight > 0
	})
}
