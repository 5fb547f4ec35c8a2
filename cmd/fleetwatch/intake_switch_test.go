package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// Switching ingest.durable in a running deployment (DECISIONS.md "No
// silent loss", OPERATIONS.md "Switching ingest.durable"): FW_CAPTURE and
// FW_INTAKE both take the outcome subjects, so the stream of the mode
// switched from is in the way of the other.

// TestSwitchingIngestDurable runs serve with ingest.durable: true, then
// with the default, then durable again, against one nats-server process,
// publishing failures of a new backend each time no serve runs: each serve
// starts alone, takes the other mode's stream over (its events decided on,
// the stream replaced by its own) and says ok on /healthz. A serve
// started beside a running one of the other mode takes nothing over: with
// the default it runs and /healthz says degraded, naming the stream in
// the way and the command that deletes it; with ingest.durable: true it
// refuses to start, saying the same. With the current nats-server and
// with Debian's 2.9.
func TestSwitchingIngestDurable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bin  func(testing.TB) string
	}{
		{"2.15", natsServerBinary},
		{"debian-2.9", debianNATSServerBinary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := tc.bin(t)
			if bin == "" {
				t.Skip("Debian's nats-server is not installed")
			}
			switchIngestDurable(t, startNATSProc(t, bin))
		})
	}
}

func switchIngestDurable(t *testing.T, ns *natsProc) {
	nc, snaps := watchSnapshots(t, ns.url())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const durable, capture = "ingest: {durable: true}\n", ""

	first := startServeOn(t, ns.url(), durable)
	for range 10 {
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event("chat", "ok", 200, 80))
	}
	testkit.Eventually(t, 20*time.Second, "a snapshot of chat", func() bool {
		_, ok := snaps.since("chat", time.Time{})
		return ok
	})
	stopServe(t, first)

	// Durable to the default.
	publishWhileDown(t, nc, "pool-1")
	second := startServeOn(t, ns.url(), capture)
	waitOpen(t, snaps, "pool-1")
	checkHealth(t, second, `"status":"ok"`, `"mode":"core + capture"`, `"capture_replayed":60`)
	checkStreams(t, js, "FW_CAPTURE", "FW_INTAKE")

	// Beside it, a durable serve refuses to start.
	refused := startServeProc(t, ns.url(), durable)
	select {
	case <-refused.done:
	case <-time.After(60 * time.Second):
		t.Fatal("a durable serve beside a running default one did not exit")
	}
	if out := refused.all.String(); refused.err == nil || !strings.Contains(out, "stream FW_CAPTURE") || !strings.Contains(out, "`nats stream rm FW_CAPTURE`") {
		t.Errorf("durable serve beside a default one: exit %v, output:\n%s\nwant a refusal naming FW_CAPTURE and the command that deletes it", refused.err, out)
	}
	checkStreams(t, js, "FW_CAPTURE", "FW_INTAKE")
	stopServe(t, second)

	// The default to durable.
	publishWhileDown(t, nc, "pool-2")
	third := startServeOn(t, ns.url(), durable)
	waitOpen(t, snaps, "pool-2")
	checkHealth(t, third, `"status":"ok"`, `"mode":"durable intake"`, `"capture_replayed":60`, `"intake_lost":0`)
	checkStreams(t, js, "FW_INTAKE", "FW_CAPTURE")

	// Beside it, a default serve runs degraded.
	beside := startServeOn(t, ns.url(), capture)
	checkHealth(t, beside, `"status":"degraded"`, `"mode":"core, capture missing"`, "stream FW_INTAKE", "`nats stream rm FW_INTAKE`",
		"events published while no serve runs would be lost")
	checkStreams(t, js, "FW_INTAKE", "FW_CAPTURE")
	stopServe(t, beside)
	stopServe(t, third)
}

// startServeProc runs `fleetwatch serve` as startServeOn does, without
// waiting for it to listen.
func startServeProc(t *testing.T, natsURL, config string) *proc {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fleetwatch.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return startProc(t, false, "serve", "--config", cfg, "--nats", natsURL, "--http", "127.0.0.1:0",
		"--data", filepath.Join(dir, "data"), "--no-probes")
}

func stopServe(t *testing.T, p *proc) {
	t.Helper()
	if err := p.stop(); err != nil {
		t.Fatalf("serve: %v\n%s", err, p.all.String())
	}
}

// publishWhileDown publishes 30 failures of backend down and 30
// successes of backend ok on pool (a pool of its own: in a pool with an
// open backend already, the ejection cap would hold the second).
func publishWhileDown(t *testing.T, nc *nats.Conn, pool string) {
	t.Helper()
	for range 30 {
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event(pool, "down", 500, 0))
		testkit.Publish(t, nc, "fw.outcomes", testkit.Event(pool, "ok", 200, 80))
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// waitOpen waits for backend down of pool to open.
func waitOpen(t *testing.T, snaps *snapshotTimes, pool string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, pool+"/down open from the events published while no serve ran", func() bool {
		snap, _ := snaps.since(pool, time.Time{})
		for _, b := range snap.Backends {
			if b.Backend == "down" && b.State == fleetwatch.StateOpen {
				return true
			}
		}
		return false
	})
}

// checkHealth waits until serve's /healthz answers 200 with every part of
// want.
func checkHealth(t *testing.T, p *proc, want ...string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, body := testkit.HTTPGet(t, "http://"+p.HTTPAddr+"/healthz")
		if code == 200 && containsAll(body, want...) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("/healthz = %d %s\nwant 200 with %q", code, body, want)
			return
		}
	}
}

// checkStreams checks that the stream present exists and absent does not.
func checkStreams(t *testing.T, js jetstream.JetStream, present, absent string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, present); err != nil {
		t.Errorf("stream %s: %v, want it to exist", present, err)
	}
	if _, err := js.Stream(ctx, absent); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s: %v, want it gone", absent, err)
	}
}
