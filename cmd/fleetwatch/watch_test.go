package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// startWatch runs `fleetwatch watch` in-process and returns its stdout.
func startWatch(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- runWatch(ctx, args, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watch: %v\nstderr:\n%s", err, stderr.String())
		}
	})
	return &stdout
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

func TestWatchTable(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	script := feedtest.NewScript(t, feedtest.Connect(t, natsURL), "")
	out := startWatch(t, "llama", "--nats", natsURL, "--refresh", "1ms")
	now := time.Now()
	// Publish until the watcher has subscribed and drawn.
	eventually(t, 30*time.Second, "a table", func() bool {
		script.PublishSubject(watchSnapshot(uint64(now.UnixNano()), now))
		return strings.Contains(out.String(), "vllm-b")
	})
	text := out.String()
	for _, want := range []string{
		"pool llama  mode balance  all_open shed  median ewma 210ms",
		"BACKEND", "vllm-a", "closed", "210ms", "540ms", "99.5%", "420",
		"vllm-b", "open (", "error rate 0.42 >= 0.25 over 120 requests in 30s",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "\x1b[") {
		t.Errorf("escape sequences written to a non-terminal:\n%q", text)
	}
	// A snapshot of another pool is not shown.
	script.PublishSubject(feedtest.Snapshot("other", "e1", 1, now, feedtest.Closed("x")))
	script.PublishSubject(watchSnapshot(uint64(now.UnixNano())+1, now))
	if strings.Contains(out.String(), "pool other") {
		t.Errorf("watch llama shows pool other")
	}
}

func TestWatchJSON(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	script := feedtest.NewScript(t, feedtest.Connect(t, natsURL), "")
	now := time.Now().UTC().Truncate(time.Millisecond)
	want := watchSnapshot(1, now)
	script.Put(want) // in the KV bucket only: watch reads it at start
	out := startWatch(t, "--json", "--nats", natsURL)
	eventually(t, 30*time.Second, "a JSON line", func() bool { return strings.Contains(out.String(), "\n") })
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	sc.Scan()
	var got fleetwatch.Snapshot
	if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
		t.Fatalf("line %q: %v", sc.Text(), err)
	}
	if diff := cmp.Diff(want, &got); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
}
