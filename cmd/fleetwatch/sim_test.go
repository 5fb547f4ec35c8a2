package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runSimArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := runSim(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// The same seed prints the same tables; files land in --out.
func TestSimDeterministicWithFiles(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--scenario", "fast-failure,low-traffic", "--duration", "40s", "--seed", "3", "--out", dir}
	first, stderr, err := runSimArgs(t, args...)
	if err != nil {
		t.Fatalf("runSim: %v\n%s", err, stderr)
	}
	second, _, err := runSimArgs(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("two runs with seed 3 printed different tables:\n%s\n---\n%s", first, second)
	}
	for _, want := range []string{"### fast-failure", "### low-traffic", "| fleetwatch", "| latency-greedy", "p99 ms"} {
		if !strings.Contains(first, want) {
			t.Errorf("output lacks %q:\n%s", want, first)
		}
	}
	if !strings.Contains(stderr, "requests per wall second") {
		t.Errorf("stderr lacks the speed line: %q", stderr)
	}
	for _, name := range []string{"results.csv", "tables.md", "shares-fast-failure.csv", "fast-failure-share.svg", "fast-failure-ttft.svg", "low-traffic-share.svg"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if strings.HasSuffix(name, ".svg") && !bytes.HasPrefix(data, []byte("<svg")) {
			t.Errorf("%s does not start with <svg", name)
		}
	}
	csv, _ := os.ReadFile(filepath.Join(dir, "results.csv"))
	if lines := strings.Count(string(csv), "\n"); lines != 1+7+7 {
		t.Errorf("results.csv has %d lines, want a header and 14 runs", lines)
	}
	other, _, err := runSimArgs(t, "--scenario", "fast-failure", "--duration", "40s", "--seed", "4")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(first, other) {
		t.Error("seed 4 printed the same fast-failure table as seed 3")
	}
}

func TestSimSeedsAndPolicies(t *testing.T) {
	out, _, err := runSimArgs(t, "--scenario", "low-traffic", "--duration", "30s", "--seeds", "2", "--policies", "random,fleetwatch")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Medians over seeds 1 to 2") || !strings.Contains(out, "| random") || strings.Contains(out, "| litellm") {
		t.Errorf("unexpected output:\n%s", out)
	}
}

func TestSimRoutersAndFeedPeriod(t *testing.T) {
	args := []string{"--scenario", "low-traffic", "--duration", "30s", "--policies", "fleetwatch"}
	base, _, err := runSimArgs(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runSimArgs(t, append(args, "--routers", "16", "--feed-period", "250ms")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "16 routers") || !strings.Contains(base, "1 routers") {
		t.Errorf("--routers 16 not applied:\n%s\nbase:\n%s", out, base)
	}
}

func TestSimFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want error
	}{
		{"unknown scenario", []string{"--scenario", "nope"}, errUsage},
		{"bad seeds", []string{"--seeds", "0"}, errUsage},
		{"negative routers", []string{"--routers", "-1"}, errUsage},
		{"negative feed period", []string{"--feed-period", "-1s"}, errUsage},
		{"stray argument", []string{"extra"}, errUsage},
		{"unknown policy", []string{"--scenario", "low-traffic", "--duration", "10s", "--policies", "nope"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runSimArgs(t, tt.args...)
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			if tt.want == nil && err == nil {
				t.Error("no error")
			}
		})
	}
	out, _, err := runSimArgs(t, "--scenario", "list")
	if err != nil || !strings.Contains(out, "shared-prompt") {
		t.Errorf("--scenario list: %v\n%s", err, out)
	}
}
