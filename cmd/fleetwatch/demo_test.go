package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoShowsBreakersOpenAndClose runs `fleetwatch demo` as a subprocess,
// the way a newcomer does (serve with its embedded NATS, fake backends over
// HTTP, route, drift probes), and reads its narration: a breaker must open
// and later close, each with a reason carrying numbers; the backend whose
// artefact changes must be reported drifted and end with weight 0
// (quarantine is on in the demo); the backend whose tool calls break must
// be reported by the tool-call tier with its evidence; the demo must stop
// by itself and exit 0.
func TestDemoShowsBreakersOpenAndClose(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	if testing.Short() {
		t.Skip("the demo runs for a minute")
	}
	p := startProc(t, false, "demo", "--duration", "70s", "--script", "60s", "--http", "127.0.0.1:0", "--rate", "30")
	select {
	case <-p.done:
	case <-time.After(4 * time.Minute):
		t.Fatal("demo did not stop by itself")
	}
	if p.err != nil {
		t.Fatalf("demo exited with %v\n%s", p.err, p.stderr.String())
	}
	out := p.stdout.String()
	opened := regexp.MustCompile(`DECISION (\S+): closed -> open: (.*\d.*)`).FindStringSubmatch(out)
	if opened == nil {
		t.Fatalf("no breaker opened with a reason:\n%s", out)
	}
	closed := regexp.MustCompile(`DECISION (\S+): half_open -> closed: (.*\d.*)`).FindStringSubmatch(out)
	if closed == nil {
		t.Fatalf("no breaker closed with a reason:\n%s", out)
	}
	if !regexp.MustCompile(`DRIFT vllm-a: \S+ -> drifted \(score [0-9.]+, threshold [0-9.]+\): .*\d`).MatchString(out) {
		t.Errorf("no drift alert for vllm-a, whose artefact changed:\n%s", out)
	}
	if !regexp.MustCompile(`DRIFT vllm-d: ok -> (suspect|drifted) \(score [0-9.]+, threshold [0-9.]+\): (gross change in )?tool calls: valid-call rate \d+% \(\d+/\d+, baseline 100%\).*; e\.g\. \S+: `).MatchString(out) {
		t.Errorf("no tool-call drift alert for vllm-d, whose tool calls broke:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^  vllm-a +\S+ +weight 0\.00 +drift drifted`).MatchString(out) {
		t.Errorf("vllm-a does not end drifted with weight 0 (quarantine):\n%s", out)
	}
	for _, want := range []string{"status page   http://", "INCIDENT", "RECOVERY", "traffic share", "Demo over"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("opened: %s (%s); closed: %s (%s)", opened[1], opened[2], closed[1], closed[2])
}
