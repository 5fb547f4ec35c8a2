// Package testkit holds the helpers that tests of several packages share:
// finding the real tools the tests drive (Chromium, VictoriaMetrics,
// Debian's nats-server), polling for a condition, and a place for files a
// person may want to look at. It is imported only from _test.go files.
package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
)

// RequireTool returns path, or skips the test when the tool is absent
// outside CI. In CI (CI set) a missing tool is a failure: .ci/run installs
// it.
func RequireTool(t testing.TB, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found (%v): CI must install the Debian package %s", path, err, pkg)
		}
		t.Skipf("%s not found: install the Debian package %s to run this test (it is required when CI is set)", path, pkg)
	}
	return path
}

// ToolPath is name's path on the PATH, or /usr/bin/name (for
// RequireTool's message) when it is not there.
func ToolPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/bin/" + name
}

// ArtifactDir is where tests leave files for people to look at:
// $FLEETWATCH_ARTIFACTS, or a temporary directory of the test.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("FLEETWATCH_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// Eventually polls cond every 20ms until it holds or timeout passes. Time
// bounds are generous liveness limits, never performance assertions.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyEvery(t, timeout, 20*time.Millisecond, what, cond)
}

// EventuallyEvery is Eventually polling every interval: the one polling
// loop of the tests (a short interval where a test waits on many small
// steps).
func EventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually(t, timeout, interval, what, nil, cond)
}

// EventuallyShowing is Eventually whose failure also says what show
// returns then (the state the test waited on, as it was at the timeout,
// not at the call).
func EventuallyShowing(t testing.TB, timeout time.Duration, what string, show func() string, cond func() bool) {
	t.Helper()
	eventually(t, timeout, 20*time.Millisecond, what, show, cond)
}

func eventually(t testing.TB, timeout, interval time.Duration, what string, show func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if show != nil {
				what += ": " + show()
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// OutcomeTraffic publishes outcome events the way a proxy does: every
// 100ms, ten ok events per healthy backend and as many errors per failing
// backend, in one NDJSON message, plus one malformed message (a reject).
type OutcomeTraffic struct {
	Pool     string
	Backends []string

	mu      sync.Mutex // guards failing
	failing map[string]bool
}

// SetFailing makes backend's events errors (true) or ok (false).
func (o *OutcomeTraffic) SetFailing(backend string, fail bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failing == nil {
		o.failing = map[string]bool{}
	}
	o.failing[backend] = fail
}

func (o *OutcomeTraffic) isFailing(backend string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failing[backend]
}

// Start publishes to natsURL until t's cleanup, which stops the goroutine
// and waits for it.
func (o *OutcomeTraffic) Start(t testing.TB, natsURL string) {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.Name("test-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-stopped
		nc.Close()
	})
	const okPerTick = 10
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		subject := fleetwatch.Subjects{}.OutcomesFrom("test-proxy")
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ts := fleetwatch.FormatTime(time.Now())
			var batch bytes.Buffer
			for i, b := range o.Backends {
				for k := range okPerTick {
					if o.isFailing(b) {
						fmt.Fprintf(&batch, `{"v":1,"pool":%q,"backend":%q,"ts":%q,"status":500,"outcome":"error","duration_ms":5}`+"\n", o.Pool, b, ts)
						continue
					}
					ttft := 120 + 40*i + (n+k)%30
					fmt.Fprintf(&batch, `{"v":1,"pool":%q,"backend":%q,"ts":%q,"status":200,"outcome":"ok","ttft_ms":%d,"duration_ms":%d}`+"\n", o.Pool, b, ts, ttft, ttft*5)
				}
			}
			_ = nc.Publish(subject, batch.Bytes())
			_ = nc.Publish(subject, []byte(`{"v":1,"pool":`)) // a reject
		}
	}()
}

// SnapshotLog records every snapshot seen on fw.decisions.> by a plain
// nats.go subscriber, and checks that each arrived on its pool's subject.
type SnapshotLog struct {
	mu    sync.Mutex // guards last, count
	last  map[string]fleetwatch.Snapshot
	count int
}

// SubscribeSnapshots starts a SnapshotLog on nc.
func SubscribeSnapshots(t testing.TB, nc *nats.Conn) *SnapshotLog {
	t.Helper()
	l := &SnapshotLog{last: map[string]fleetwatch.Snapshot{}}
	_, err := nc.Subscribe("fw.decisions.>", func(m *nats.Msg) {
		var s fleetwatch.Snapshot
		if err := json.Unmarshal(m.Data, &s); err != nil {
			t.Errorf("snapshot on %s does not parse: %v", m.Subject, err)
			return
		}
		if m.Subject != "fw.decisions."+s.Pool {
			t.Errorf("snapshot of pool %q on subject %q", s.Pool, m.Subject)
		}
		l.mu.Lock()
		l.last[s.Pool] = s
		l.count++
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return l
}

// Backend is the latest state of pool/backend seen.
func (l *SnapshotLog) Backend(pool, backend string) (fleetwatch.Backend, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.last[pool]
	if !ok {
		return fleetwatch.Backend{}, false
	}
	if b := s.Find(backend); b != nil {
		return *b, true
	}
	return fleetwatch.Backend{}, false
}

// Snapshot is the latest snapshot of pool seen.
func (l *SnapshotLog) Snapshot(pool string) (fleetwatch.Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.last[pool]
	return s, ok
}

// Count is how many snapshots were seen.
func (l *SnapshotLog) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// WaitConsuming publishes ok events for pool/backend until one shows up in
// a snapshot: then the daemon consumes and publishes.
func WaitConsuming(t testing.TB, nc *nats.Conn, snaps *SnapshotLog, pool, backend string) {
	t.Helper()
	Eventually(t, 20*time.Second, "the daemon to consume events", func() bool {
		Publish(t, nc, "fw.outcomes", Event(pool, backend, 200, 100))
		_, ok := snaps.Backend(pool, backend)
		return ok
	})
}

// Publish publishes payload on subject or fails the test.
func Publish(t testing.TB, nc *nats.Conn, subject, payload string) {
	t.Helper()
	if err := nc.Publish(subject, []byte(payload)); err != nil {
		t.Fatal(err)
	}
}

// Event is one outcome event as JSON.
func Event(pool, backend string, status int, ttft float64) string {
	return fmt.Sprintf(`{"v":1,"pool":%q,"backend":%q,"status":%d,"ttft_ms":%g,"source":"test"}`, pool, backend, status, ttft)
}

// HTTPGet GETs url and returns the status code and body, or fails the test.
func HTTPGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Lines collects log lines (a Logf) safely from many goroutines.
type Lines struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

// Logf appends one formatted line.
func (l *Lines) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, format+"\n", args...)
}

// String is everything logged so far.
func (l *Lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// EventLog collects the outcome events published on fw.outcomes.> (one
// event or an NDJSON batch per message), failing the test on an event that
// does not decode.
type EventLog struct {
	mu       sync.Mutex // guards events, subjects
	events   []fleetwatch.Event
	subjects map[string]int
}

// CollectEvents subscribes an EventLog on nc until t's cleanup.
func CollectEvents(t testing.TB, nc *nats.Conn) *EventLog {
	t.Helper()
	l := &EventLog{subjects: map[string]int{}}
	var dec fleetwatch.Decoder
	sub, err := nc.Subscribe(fleetwatch.Subjects{}.OutcomesWildcard(), func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.subjects[m.Subject]++
		dec.DecodeBatch(m.Data, func(line []byte, ev *fleetwatch.Event, err error) {
			if err != nil {
				t.Errorf("bad event %s: %v", line, err)
				return
			}
			l.events = append(l.events, *ev)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// Events is a copy of the events seen so far.
func (l *EventLog) Events() []fleetwatch.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]fleetwatch.Event(nil), l.events...)
}

// Messages is how many messages arrived on subject.
func (l *EventLog) Messages(subject string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.subjects[subject]
}

// RaiseParallel sets the test binary's -test.parallel to n unless its
// command line set it or it is already higher. Call it from TestMain
// before m.Run. go test's default is GOMAXPROCS, two on a 2-core machine:
// right for tests that compute, wrong for end-to-end tests that start
// their own servers and spend most of their time waiting for them (a
// lease to expire, a reconnect, a demo's script), which then queue behind
// each other with the cores idle.
func RaiseParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	f := flag.Lookup("test.parallel")
	if set || f == nil {
		return
	}
	if cur, ok := f.Value.(flag.Getter).Get().(int); ok && cur < n {
		_ = f.Value.Set(fmt.Sprint(n))
	}
}

// RunWithoutRace runs the tests of the package in the working directory
// (a test's own package) that call marker, such as long(t), in a test
// binary built without the race detector, and fails t with their output if
// they fail. A package whose long tests are single-goroutine arithmetic
// (the simulator, the toy model's statistics) skips them under -race,
// where they run tens of times slower with nothing for the detector to
// find, and calls this from a test built only with -race, so that
// `go test -race ./...` still runs them. The tests are found in the
// package's _test.go files: every Test function whose body calls marker.
func RunWithoutRace(t *testing.T, marker string) {
	t.Helper()
	names, err := testsCalling(".", marker)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("no test of this package calls %s", marker)
	}
	cmd := exec.CommandContext(t.Context(), "go", "test", "-count=1", "-run", "^("+strings.Join(names, "|")+")$", ".")
	var keep []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if f != "-race" && f != "-race=true" {
			keep = append(keep, f)
		}
	}
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.Join(keep, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test -count=1 -run '%s' . (without the race detector): %v\n%s", strings.Join(names, "|"), err, out)
	}
	t.Logf("%d tests without the race detector: %s", len(names), strings.TrimSpace(string(out)))
}

// testsCalling lists the Test functions of dir's _test.go files whose
// bodies call the function named marker.
func testsCalling(dir, marker string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	var names []string
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			calls := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && id.Name == marker {
						calls = true
					}
				}
				return !calls
			})
			if calls {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names, nil
}
