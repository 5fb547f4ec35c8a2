package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// The fleetwatch binary is built once per test process and shared.
var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// fleetwatchBinary returns the path of a freshly built fleetwatch binary.
func fleetwatchBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "fleetwatch-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "fleetwatch")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// syncBuffer is a bytes.Buffer safe for a writer process and a reading test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// timeLines writes what it is given to to, each line prefixed with the
// time it arrived (the process output of a failed test, in order).
type timeLines struct {
	mu   sync.Mutex
	to   io.Writer
	open bool // inside a line
}

func (w *timeLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range bytes.SplitAfter(p, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !w.open {
			fmt.Fprint(w.to, time.Now().Format("15:04:05.000 "))
		}
		_, _ = w.to.Write(line)
		w.open = line[len(line)-1] != '\n'
	}
	return len(p), nil
}

// proc is a fleetwatch subprocess.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	all    syncBuffer // stdout and stderr interleaved
	timed  syncBuffer // the same, each line with the time it was read
	done   chan struct{}
	err    error
	// HTTPAddr is the address serve printed ("HTTP on http://ADDR"), or "".
	HTTPAddr string
	// NATSURL is the embedded NATS URL serve printed, or "".
	NATSURL string
}

var (
	httpLineRe = regexp.MustCompile(`HTTP on http://(\S+)`)
	natsLineRe = regexp.MustCompile(`embedded NATS server at (\S+)`)
)

// startProc runs fleetwatch with args and stops it (SIGTERM, then SIGKILL)
// in t.Cleanup. When wantHTTP is set it waits for serve's HTTP line.
func startProc(t testing.TB, wantHTTP bool, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, nil, wantHTTP, args...)
}

// startProcEnv is startProc with extra environment variables (NAME=value).
func startProcEnv(t testing.TB, env []string, wantHTTP bool, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, done: make(chan struct{})}
	p.cmd = exec.Command(fleetwatchBinary(t), args...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	timed := &timeLines{to: &p.timed}
	p.cmd.Stdout = io.MultiWriter(&p.stdout, &p.all, timed)
	p.cmd.Stderr = io.MultiWriter(&p.stderr, &p.all, timed)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("fleetwatch %s\noutput:\n%s", strings.Join(args, " "), p.timed.String())
		}
	})
	if wantHTTP {
		eventually(t, 30*time.Second, "fleetwatch to print its HTTP address", func() bool {
			select {
			case <-p.done:
				t.Fatalf("fleetwatch exited early: %v\nstderr:\n%s", p.err, p.stderr.String())
			default:
			}
			m := httpLineRe.FindStringSubmatch(p.stdout.String())
			if m == nil {
				return false
			}
			p.HTTPAddr = m[1]
			if n := natsLineRe.FindStringSubmatch(p.stdout.String()); n != nil {
				p.NATSURL = n[1]
			}
			return true
		})
	}
	return p
}

// waitOutput waits until re matches the process's output and returns the
// first submatch (or the whole match).
func (p *proc) waitOutput(re *regexp.Regexp, what string) string {
	p.t.Helper()
	var got string
	eventually(p.t, 30*time.Second, what, func() bool {
		select {
		case <-p.done:
			p.t.Fatalf("fleetwatch exited early: %v\n%s", p.err, p.all.String())
		default:
		}
		m := re.FindStringSubmatch(p.all.String())
		if m == nil {
			return false
		}
		got = m[len(m)-1]
		return true
	})
	return got
}

// stop sends SIGTERM and waits for the process to exit (SIGKILL after 20s).
// It returns the exit error.
func (p *proc) stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.t.Errorf("fleetwatch did not exit 20s after SIGTERM; killing it")
		p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// eventually polls cond every 20ms until it holds or timeout passes. Time
// bounds here are generous liveness limits, never performance assertions.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, timeout, what, cond)
}
