package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
	out, _, err = runSimArgs(t, append(args, "--scale", "4")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "12 backends") || !strings.Contains(base, "3 backends") {
		t.Errorf("--scale 4 not applied:\n%s\nbase:\n%s", out, base)
	}
	out, _, err = runSimArgs(t, append(args, "--prefill-batch-penalty", "1")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "prefill slowed by 1 + 1 x busy/slots") {
		t.Errorf("--prefill-batch-penalty not applied:\n%s", out)
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
		{"scale 0", []string{"--scale", "0"}, errUsage},
		{"negative prefill penalty", []string{"--prefill-batch-penalty", "-1"}, errUsage},
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

// --trace replays a file through the trace policies; bad lines are counted
// in the report, and a file without a usable request is an error naming it.
func TestSimTrace(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 200 {
		// Ten conversations of growing turns, one line that is not JSON.
		conv := i % 10
		turn := i / 10
		ids := []string{"0", strconv.Itoa(100 + conv)}
		for k := range turn % 4 {
			ids = append(ids, strconv.Itoa(1000*conv+k))
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 50, "hash_ids": [%s]}`+"\n", i*300, 512*len(ids), strings.Join(ids, ","))
	}
	b.WriteString("{broken\n")
	path := filepath.Join(dir, "conv.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--trace", path, "--routers", "4", "--speed", "2", "--seeds", "2", "--out", filepath.Join(dir, "out")}
	out, stderr, err := runSimArgs(t, args...)
	if err != nil {
		t.Fatalf("runSim: %v\n%s", err, stderr)
	}
	for _, want := range []string{"mooncake-jsonl", "200 requests", "x2", "4 routers", "Lines skipped: 1 (bad json: 1)",
		"| round-robin", "| least-conn", "| fleetwatch", "| precise-prefix", "| sglang-cache", "token hit rate", "Medians over seeds 1 to 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	again, _, err := runSimArgs(t, args...)
	if err != nil || again != out {
		t.Errorf("a second run printed other tables (err %v):\n%s\n---\n%s", err, out, again)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "results.csv")); err != nil {
		t.Error(err)
	}
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runSimArgs(t, "--trace", empty); err == nil || !strings.Contains(err.Error(), empty) {
		t.Errorf("empty trace: err = %v, want one naming %s", err, empty)
	}
	if _, _, err := runSimArgs(t, "--trace", path, "--speed", "0"); !errors.Is(err, errUsage) {
		t.Errorf("--speed 0: err = %v, want usage", err)
	}
}

// --fleet replays through unequal backends and says so; a bad spec, or
// --fleet with --backends or --slots, is a usage error naming the problem.
func TestSimTraceFleet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.csv")
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	for i := range 100 {
		fmt.Fprintf(&b, "2023-11-16 18:%02d:%02d.0000000,1500,80\n", i/60, i%60)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runSimArgs(t, "--trace", path, "--fleet", "2x8,1x4@2:0", "--policies", "least-conn,fleetwatch")
	if err != nil {
		t.Fatalf("runSim: %v\n%s", err, stderr)
	}
	if want := "3 backends (2 of 8 slots with 800 KV blocks; 1 of 4 slots at 2x the time with 0 KV blocks)"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	for _, bad := range []struct {
		args []string
		says string
	}{
		{[]string{"--fleet", "2x8,2z8"}, `group 2 "2z8"`},
		{[]string{"--fleet", "2x8", "--backends", "3"}, "replaces --backends and --slots"},
		{[]string{"--fleet", "2x8", "--slots", "4"}, "replaces --backends and --slots"},
	} {
		_, stderr, err := runSimArgs(t, append([]string{"--trace", path}, bad.args...)...)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr, bad.says) {
			t.Errorf("%v: err %v, stderr %q; want a usage error saying %q", bad.args, err, stderr, bad.says)
		}
	}
}
