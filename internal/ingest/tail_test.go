package ingest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// lineLog collects what a Tailer hands on.
type lineLog struct {
	mu    sync.Mutex // guards lines, fail
	lines []string
	fail  bool // refuse the next batch
}

func (l *lineLog) handle(lines [][]byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		l.fail = false
		return os.ErrDeadlineExceeded
	}
	for _, line := range lines {
		l.lines = append(l.lines, string(line))
	}
	return nil
}

func (l *lineLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// TestTailer: a partial line waits for its newline; a refused batch is
// offered again; a truncated file (copytruncate) is read from its start;
// an overlong line is dropped; a restart resumes at the saved offset; a
// file that existed before the first start is read from its end.
func TestTailer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "access.log")
		appendFile(t, path, "old\n")
		var log lineLog
		var truncations, long int
		s := ingest.TailSettings{Path: path, OffsetFile: filepath.Join(dir, "offset"), Poll: time.Second, MaxLine: 20,
			OnTruncate: func() { truncations++ }, OnLongLine: func() { long++ }}
		run := func() (stop func()) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- ingest.NewTailer(s).Run(ctx, log.handle) }()
			return func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}
		}
		poll := func() { time.Sleep(s.Poll); synctest.Wait() }

		stop := run()
		poll()
		appendFile(t, path, "a\nb")
		poll()
		if diff := cmp.Diff([]string{"a"}, log.get()); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
		appendFile(t, path, "\nc\n")
		log.mu.Lock()
		log.fail = true
		log.mu.Unlock()
		poll()
		poll()
		appendFile(t, path, strings.Repeat("x", 50)+"\nd\n")
		poll()
		if diff := cmp.Diff([]string{"a", "b", "c", "d"}, log.get()); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
		if long != 1 {
			t.Errorf("long lines = %d, want 1", long)
		}
		stop()

		appendFile(t, path, "e\n")
		stop = run()
		poll()
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		appendFile(t, path, "f\n")
		poll()
		stop()
		if diff := cmp.Diff([]string{"a", "b", "c", "d", "e", "f"}, log.get()); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		if truncations != 1 {
			t.Errorf("truncations = %d, want 1", truncations)
		}
	})
}
