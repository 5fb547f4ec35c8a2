package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestServeReloadsOnSIGHUP runs the built binary with a configuration
// file and flags that override it, rewrites the file and sends SIGHUP: the
// new pool appears in /api/decisions (the flags still win, so nothing
// needs a restart); then a file with a key of the wrong type is refused,
// logged with its key and line, and serve keeps running the last good
// configuration.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "fleetwatch.yaml")
	write := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("pools:\n  - id: p1\n    backends: [{id: a}]\n")
	p := startProc(t, true, "serve", "--config", file, "--nats-listen", "127.0.0.1:-1", "--http", "127.0.0.1:0",
		"--data", filepath.Join(dir, "data"), "--no-probes")
	pools := func() []string {
		_, body := testkit.HTTPGet(t, "http://"+p.HTTPAddr+"/api/decisions")
		var all []fleetwatch.Snapshot
		if err := json.Unmarshal([]byte(body), &all); err != nil {
			t.Fatalf("/api/decisions: %v: %s", err, body)
		}
		var ids []string
		for _, s := range all {
			ids = append(ids, s.Pool)
		}
		return ids
	}
	eventually(t, 10*time.Second, "p1 in /api/decisions", func() bool { return strings.Join(pools(), ",") == "p1" })

	write("pools:\n  - id: p1\n    backends: [{id: a}]\n  - id: p2\n    backends: [{id: b}]\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitOutput(regexp.MustCompile(`reloaded: .*pools added: p2`), "the reload to be logged")
	eventually(t, 10*time.Second, "p2 in /api/decisions after SIGHUP", func() bool { return strings.Join(pools(), ",") == "p1,p2" })

	write("pools:\n  - id: p1\n    backends: [{id: a}]\nanalyzer:\n  window: [30s]\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitOutput(regexp.MustCompile(`reload refused, the running configuration is kept: config \S+:5: analyzer.window`), "the refusal to be logged with key and line")
	if got := strings.Join(pools(), ","); got != "p1,p2" {
		t.Errorf("pools after a refused reload = %s, want p1,p2", got)
	}
	_, metrics := testkit.HTTPGet(t, "http://"+p.HTTPAddr+"/metrics")
	for _, want := range []string{
		`fleetwatch_config_reloads_total{result="success"} 1`,
		`fleetwatch_config_reloads_total{result="failure"} 1`,
		"fleetwatch_config_last_reload_successful 0",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := p.stop(); err != nil {
		t.Errorf("serve: %v", err)
	}
}

// TestConfigCheck: `fleetwatch config check` accepts a good file and names
// the key and line of a bad one, exiting 1.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("pools:\n  - id: p\n    backends: [{id: a}, {id: b}]\n"), 0o644)
	os.WriteFile(bad, []byte("pools:\n  - id: p\nanalyzer:\n  failure_rate: 2\n"), 0o644)
	code, out, errOut := runCmd(t.Context(), "config", "check", good)
	if code != 0 || !strings.Contains(out, "ok (1 pools, 2 backends)") {
		t.Errorf("config check of a good file: exit %d, %q %q", code, out, errOut)
	}
	code, _, errOut = runCmd(t.Context(), "config", "check", bad)
	if code != 1 || !strings.Contains(errOut, "bad.yaml:4: analyzer.failure_rate") {
		t.Errorf("config check of a bad file: exit %d, stderr %q, want exit 1 naming analyzer.failure_rate at line 4", code, errOut)
	}
	if code, _, _ := runCmd(t.Context(), "config", "lint", good); code != 2 {
		t.Errorf("config lint: exit %d, want 2", code)
	}
}
