package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoShowsBreakersOpenAndClose runs `fleetwatch demo --duration 60s` as
// a subprocess, the way a newcomer does, and reads its narration: a breaker
// must open and later close, each with a reason carrying numbers, and the
// demo must stop by itself and exit 0.
func TestDemoShowsBreakersOpenAndClose(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo runs for a minute")
	}
	p := startProc(t, false, "demo", "--duration", "60s", "--script", "45s", "--http", "127.0.0.1:0", "--rate", "30")
	select {
	case <-p.done:
	case <-time.After(3 * time.Minute):
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
	for _, want := range []string{"status page   http://", "INCIDENT", "RECOVERY", "traffic share", "Demo over"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("opened: %s (%s); closed: %s (%s)", opened[1], opened[2], closed[1], closed[2])
}
