package watch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded server's background goroutines end asynchronously
		// after Shutdown returns.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}

func watchSnapshot(seq uint64, now time.Time) *fleetwatch.Snapshot {
	ewma, p95, ok, r429 := 210.0, 540.0, 0.995, 0.0
	a := feedtest.Closed("vllm-a")
	a.EWMATTFTMs, a.P95TTFTMs, a.SuccessRate, a.Rate429, a.Requests = &ewma, &p95, &ok, &r429, 420
	b := feedtest.Open("vllm-b", now.Add(30*time.Second), "error rate 0.42 >= 0.25 over 120 requests in 30s")
	s := feedtest.Snapshot("llama", "e1", seq, now, a, b)
	s.MedianEWMATTFTMs = &ewma
	return s
}

func TestRenderSnapshotStale(t *testing.T) {
	now := time.Now()
	s := watchSnapshot(1, now.Add(-time.Minute))
	var b strings.Builder
	RenderSnapshot(&b, s, now)
	if !strings.Contains(b.String(), "STALE") {
		t.Errorf("a minute-old snapshot with a 5s TTL is not marked stale:\n%s", b.String())
	}
}

func TestRenderSnapshotColumns(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var b strings.Builder
	RenderSnapshot(&b, watchSnapshot(7, now), now)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header, a column line and two backends:\n%s", len(lines), b.String())
	}
	if want := "pool llama  mode balance  all_open shed  median ewma 210ms  seq 7  epoch e1  age 0s"; lines[0] != want {
		t.Errorf("header\n got %q\nwant %q", lines[0], want)
	}
	got := [][]string{strings.Fields(lines[2]), strings.Fields(lines[3])[:3]}
	want := [][]string{
		{"vllm-a", "closed", "1.00", "210ms", "540ms", "99.5%", "0.0%", "420", "unknown"},
		{"vllm-b", "open", "(30s)"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backend rows (-want +got):\n%s", diff)
	}
	if !strings.HasSuffix(lines[3], "error rate 0.42 >= 0.25 over 120 requests in 30s") {
		t.Errorf("open backend's row lacks the reason: %q", lines[3])
	}
}

func TestWatchViewRedrawsInPlaceOnATerminal(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		terminal  bool
		wantClear int
	}{{true, 2}, {false, 0}} {
		var out strings.Builder
		v := NewView(&out, tc.terminal, func() time.Time { return now })
		v.Add(watchSnapshot(1, now))
		v.Draw()
		v.Add(watchSnapshot(2, now))
		v.Draw()
		if got := strings.Count(out.String(), "\x1b[H\x1b[2J"); got != tc.wantClear {
			t.Errorf("terminal=%v: %d clear-screen sequences, want %d", tc.terminal, got, tc.wantClear)
		}
		if got := strings.Count(out.String(), "BACKEND"); got != 2 {
			t.Errorf("terminal=%v: %d tables, want 2", tc.terminal, got)
		}
	}
}

// TestRunOnce follows every pool of a NATS server whose KV bucket holds two
// pools' snapshots: Run prints the first table and returns.
func TestRunOnce(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	script := feedtest.NewScript(t, nc, "")
	now := time.Now()
	script.Put(watchSnapshot(1, now))
	var out strings.Builder
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Run(ctx, nc, Settings{Out: &out, Once: true, Logf: t.Logf}); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run with Once returned only when its context ended")
	}
	if !strings.HasPrefix(out.String(), "pool llama  mode balance") || strings.Count(out.String(), "BACKEND") != 1 {
		t.Errorf("one table of pool llama wanted:\n%s", out.String())
	}
}
