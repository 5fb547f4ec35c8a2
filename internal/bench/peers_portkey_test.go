package bench

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRunPeersPortkey is the short run with Portkey's open-source gateway
// as a fifth balancer, npm-installed from the pinned lock file in
// testdata/portkey: every balancer, Portkey included, carries traffic in
// every phase, and the gateway listens on loopback only (RunPeers checks
// it before sending anything).
func TestRunPeersPortkey(t *testing.T) {
	testkit.RequireTool(t, testkit.ToolPath("node"), "nodejs")
	runPeersShort(t, 1, portkeyInstall(t))
}

// portkeyInstall runs `npm ci` on a copy of testdata/portkey and returns
// the directory.
func portkeyInstall(t *testing.T) string {
	t.Helper()
	npm := testkit.RequireTool(t, testkit.ToolPath("npm"), "npm")
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "portkey", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in a copy of testdata/portkey: %v\n%s", err, out)
	}
	return dir
}

// The config sent to Portkey: load balancing over one fallback chain per
// backend, each of three backends in ring order, moving on at 408, 429 and
// 5xx, with the first-byte budget as request_timeout.
func TestPortkeyConfig(t *testing.T) {
	got, err := portkeyConfig([]string{"http://a", "http://b", "http://c", "http://d"}, 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"strategy":{"mode":"loadbalance"}`,
		`"request_timeout":300`,
		`{"strategy":{"mode":"fallback","on_status_codes":[408,429,500,502,503,504]},"targets":[{"provider":"openai","api_key":"bench","custom_host":"http://d/v1"},{"provider":"openai","api_key":"bench","custom_host":"http://a/v1"},{"provider":"openai","api_key":"bench","custom_host":"http://b/v1"}],"weight":1}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %s:\n%s", want, got)
		}
	}
	if n := strings.Count(got, `"mode":"fallback"`); n != 4 {
		t.Errorf("%d fallback chains, want 4", n)
	}
}

// loopbackListener accepts a loopback listener and refuses one on every
// interface.
func TestLoopbackListener(t *testing.T) {
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"0100007F", true}, {"0200007F", true}, {"00000000", false}, {"0100000A", false},
		{"00000000000000000000000001000000", true}, {"00000000000000000000000000000000", false},
		{"0000000000000000FFFF00000100007F", true}, {"0000000000000000FFFF00000100000A", false},
	} {
		if got := loopbackHex(c.addr); got != c.ok {
			t.Errorf("loopbackHex(%s) = %v, want %v", c.addr, got, c.ok)
		}
	}
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := loopbackListener(ln.Addr().(*net.TCPAddr).Port); err != nil {
		t.Errorf("a 127.0.0.1 listener: %v", err)
	}
	all, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if err := loopbackListener(all.Addr().(*net.TCPAddr).Port); err == nil {
		t.Errorf("a listener on every interface passed as loopback only")
	}
}
