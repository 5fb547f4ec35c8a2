package serve

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// deployDir is the repository's deploy directory.
func deployDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// TestHADeployFiles runs deploy/nats/nats-cluster.conf as three nodes (on
// loopback ports of their own instead of 4222 and 6222) and a serve
// instance with deploy/fleetwatch/fleetwatch-ha.yaml as the fleetwatch user,
// whose permissions must allow the lease bucket; and checks that
// deploy/compose-ha.yaml runs three NATS nodes and two serve instances with
// those files.
func TestHADeployFiles(t *testing.T) {
	dir := deployDir(t)
	for k, v := range map[string]string{
		"FLEETWATCH_NATS_PASSWORD": "fw-secret", "PROXY_NATS_PASSWORD": "proxy-secret",
		"ROUTER_NATS_PASSWORD": "router-secret", "NATS_ADMIN_PASSWORD": "admin-secret",
	} {
		t.Setenv(k, v)
	}
	ports := make([]int, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	var nodes []*server.Server
	var urls []string
	for i := range 3 {
		t.Setenv("NATS_SERVER_NAME", "nats-"+strconv.Itoa(i+1))
		opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats", "nats-cluster.conf"))
		if err != nil {
			t.Fatal(err)
		}
		if opts.Cluster.Name != "fleetwatch" || len(opts.Routes) != 3 {
			t.Fatalf("cluster %q with %d routes, want fleetwatch with 3", opts.Cluster.Name, len(opts.Routes))
		}
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
			}
		}
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", ports[i]
		opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		opts.StoreDir = t.TempDir()
		opts.NoLog, opts.NoSigs = true, true
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("node not ready")
		}
		nodes = append(nodes, ns)
		urls = append(urls, ns.ClientURL())
	}
	testkit.Eventually(t, 30*time.Second, "JetStream clustered", func() bool {
		leader := false
		for _, n := range nodes {
			if !n.JetStreamIsCurrent() {
				return false
			}
			leader = leader || n.JetStreamIsLeader()
		}
		return leader
	})

	cfg, err := config.Load(filepath.Join(dir, "fleetwatch", "fleetwatch-ha.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.HASettings(); h.Replicas != 3 || h.Partitions != 16 {
		t.Errorf("fleetwatch-ha.yaml: ha %+v, want 3 replicas and 16 partitions", h)
	}
	cfg.NATS.URL = strings.Join(urls, ",")
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = t.TempDir()
	cfg.Probes.Disabled = true
	s, err := New(cfg, Options{Logf: t.Logf, NATSOptions: []nats.Option{nats.UserInfo("fleetwatch", "fw-secret")}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testkit.Eventually(t, 30*time.Second, "the instance to lease every partition as the fleetwatch user", func() bool {
		return len(s.ownedPartitions()) == 16
	})

	data, err := os.ReadFile(filepath.Join(dir, "compose-ha.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nats-1", "nats-2", "nats-3", "fleetwatch-1", "fleetwatch-2"} {
		svc, ok := compose.Services[name]
		if !ok {
			t.Errorf("compose-ha.yaml has no service %s", name)
			continue
		}
		for _, v := range svc.Volumes {
			src := strings.Split(v, ":")[0]
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			}
		}
	}
	if got := len(compose.Services); got != 5 {
		t.Errorf("compose-ha.yaml has %d services, want 5", got)
	}
}
