package epp

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The health client is a third party's: grpc-health-probe, the probe
// Kubernetes deployments of GIE's EPP use, at the version below, from the
// module proxy.
const healthProbeModule = "github.com/grpc-ecosystem/grpc-health-probe@v0.4.63"

var (
	probeOnce sync.Once
	probePath string
	probeErr  error
)

// healthProbe returns the grpc-health-probe binary: on the PATH, else
// built once with go install into the user's cache directory. Outside CI
// a failed build skips the test; in CI (CI set) it fails it.
func healthProbe(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		if p, err := exec.LookPath("grpc-health-probe"); err == nil {
			probePath = p
			return
		}
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		dir := filepath.Join(cache, "fleetwatch-test-tools", "grpc-health-probe-v0.4.63")
		probePath = filepath.Join(dir, "grpc-health-probe")
		if _, err := os.Stat(probePath); err == nil {
			return
		}
		cmd := exec.Command("go", "install", healthProbeModule)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			probeErr = errors.New("go install " + healthProbeModule + ": " + err.Error() + "\n" + string(out))
		}
	})
	if probeErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(probeErr)
		}
		t.Skip(probeErr)
	}
	return probePath
}

// probe runs grpc-health-probe against service and returns its exit code
// (0 SERVING, 4 NOT_SERVING; 2 and 3 connection and RPC failures).
func probe(t *testing.T, bin, addr, service string) int {
	t.Helper()
	out, err := exec.Command(bin, "-addr="+addr, "-service="+service, "-connect-timeout=5s", "-rpc-timeout=5s").CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		t.Logf("grpc-health-probe -service=%q: %s", service, out)
		return exit.ExitCode()
	}
	t.Fatalf("grpc-health-probe: %v\n%s", err, out)
	return -1
}

// gRPC health on the ext_proc port, as a third-party client checks it:
// liveness always SERVING; readiness, "" and the ext_proc service NOT_SERVING
// until SetReady(true), and again after SetReady(false); an unknown
// service is not found.
func TestHealthWithGRPCHealthProbe(t *testing.T) {
	bin := healthProbe(t)
	n := newNATS(t)
	pk := startPicker(t, n, Settings{})
	services := []string{LivenessService, ReadinessService, "", ExtProcService}
	check := func(ready bool) {
		t.Helper()
		for _, svc := range services {
			want := 4
			if ready || svc == LivenessService {
				want = 0
			}
			if got := probe(t, bin, pk.addr, svc); got != want {
				t.Errorf("ready %v: service %q: exit %d, want %d", ready, svc, got, want)
			}
		}
	}
	check(false)
	pk.srv.SetReady(true)
	check(true)
	pk.srv.SetReady(false)
	check(false)
	if got := probe(t, bin, pk.addr, "no.such.Service"); got == 0 {
		t.Errorf("an unknown service: exit 0, want a failure")
	}
	if ExtProcService != "envoy.service.ext_proc.v3.ExternalProcessor" || healthpb.Health_ServiceDesc.ServiceName != "grpc.health.v1.Health" {
		t.Error("service names drifted")
	}
}
