package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestExplainCommand asks a running serve why a backend that failed five
// times in a row is open, and why its healthy peer is not evaluated yet.
func TestExplainCommand(t *testing.T) {
	srv := runTestServe(t, testServeConfig(t))
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "warmup", "w")
	for range 5 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("llama", "bad", 500, 3))
	}
	testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("llama", "good", 200, 120))
	base := "http://" + srv.HTTPAddr()

	var out, errOut bytes.Buffer
	// The transition's history line can come an evaluation after the
	// state (a CI run read "open" without it): both are waited for.
	testkit.Eventually(t, 10*time.Second, "explain to show bad open, with its transition", func() bool {
		out.Reset()
		err := runExplain(t.Context(), []string{"llama", "bad", "--url", base}, &out, &errOut)
		return err == nil && strings.Contains(out.String(), "llama / bad: open") && strings.Contains(out.String(), "closed -> open")
	})
	for _, want := range []string{"reason:  5 consecutive failures", "error 5", "consecutive", "failure_rate", "throttled_recent", "slow",
		"weight:  set by open", "closed -> open  consecutive: 5 consecutive failures"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain llama bad lacks %q:\n%s", want, out.String())
		}
	}
	testkit.Eventually(t, 10*time.Second, "explain llama to show good not evaluated", func() bool {
		out.Reset()
		err := runExplain(t.Context(), []string{"--url", base, "llama"}, &out, &errOut)
		return err == nil && strings.Contains(out.String(), "llama / good: closed") &&
			strings.Contains(out.String(), "reason:  not evaluated: 1 of 20 requests")
	})
	out.Reset()
	if err := runExplain(t.Context(), []string{"--url", base, "--json", "llama", "good"}, &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "{") {
		t.Errorf("explain --json: %v %s", err, out.String())
	}
	if err := runExplain(t.Context(), []string{"--url", base, "nowhere"}, &out, &errOut); !errors.Is(err, errExplain) || !strings.Contains(err.Error(), "not known") {
		t.Errorf("explain of an unknown pool: %v", err)
	}
	if err := runExplain(t.Context(), []string{"--url", base}, &out, &errOut); !errors.Is(err, errUsage) {
		t.Errorf("explain without a pool: %v", err)
	}
}
