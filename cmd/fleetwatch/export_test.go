package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestExportThenReplay: events a running serve accepted are exported from
// FW_OUTCOMES as NDJSON, filtered by pool and time, and the file replays
// through `fleetwatch sim --trace` as outcome events.
func TestExportThenReplay(t *testing.T) {
	srv := runTestServe(t, testServeConfig(t))
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "warmup", "w")
	for i := range 120 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("llama", []string{"a", "b", "c"}[i%3], 200, 100+float64(i)))
	}
	for range 30 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("other", "x", 500, 3))
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "llama.ndjson")
	var stderr bytes.Buffer
	var lines []string
	testkit.Eventually(t, 15*time.Second, "the 120 llama events in the export", func() bool {
		stderr.Reset()
		if err := runExport(t.Context(), []string{"--nats", srv.NATSURL(), "--since", "10m", "--pool", "llama", "--out", path}, &bytes.Buffer{}, &stderr); err != nil {
			t.Logf("export: %v", err)
			return false
		}
		data, _ := os.ReadFile(path)
		lines = strings.Split(strings.TrimSpace(string(data)), "\n")
		return len(lines) == 120
	})
	var dec fleetwatch.Decoder
	for _, l := range lines {
		var ev fleetwatch.Event
		if err := dec.Decode([]byte(l), &ev); err != nil || ev.Pool != "llama" {
			t.Fatalf("exported line %q: %v (pool %q)", l, dec.Decode([]byte(l), &ev), ev.Pool)
		}
	}
	if !strings.Contains(stderr.String(), "120 events") || !strings.Contains(stderr.String(), "stored beside them") {
		t.Errorf("export's summary: %s", stderr.String())
	}
	// A range that ends before the events holds none.
	var none bytes.Buffer
	if err := runExport(t.Context(), []string{"--nats", srv.NATSURL(), "--since", "2h", "--until", "1h"}, &none, &stderr); err != nil || none.Len() != 0 {
		t.Errorf("an empty range: %v, %d bytes", err, none.Len())
	}
	for _, bad := range [][]string{{"--since", "soon"}, {"--since", "1h", "--until", "2h"}, {"--pool", "a..b"}, {"extra"}} {
		if err := runExport(t.Context(), append([]string{"--nats", srv.NATSURL()}, bad...), &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("export %v: no error", bad)
		}
	}
	out, errOut, err := runSimArgs(t, "--trace", path, "--routers", "2", "--seeds", "1", "--out", filepath.Join(dir, "sim"))
	if err != nil {
		t.Fatalf("sim --trace of the export: %v\n%s", err, errOut)
	}
	if !strings.Contains(out, "outcomes-ndjson") || !strings.Contains(out, "120 requests") {
		t.Errorf("sim --trace of the export:\n%s", out)
	}
}
