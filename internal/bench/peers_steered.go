package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed/epp"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/pickd"
)

// Steered nginx: Routers nginx 1.22 processes that ask one pick service
// (`fleetwatch epp`'s /v1/pick, internal/pickd, in process) for every
// request through auth_request and retry a failed attempt once on another
// pick, as docs/INTEGRATIONS.md "nginx steered by fleetwatch" configures
// nginx; each process's access log is followed by the nginx log adapter
// (internal/ingest, as `fleetwatch ingest nginx` runs it, one per
// process), whose events reach the serve the fleetwatch routers follow
// and finish the pick service's picks.
//
// The steered nginx instances have a pool of their own (steeredPool, the
// same four backends), so that their breakers open from their own
// traffic's outcomes only, as every other kind learns from its own: in
// the routers' pool, route's events and nginx's would open each other's
// breakers.
//
// Where the benchmark's configuration departs from the document's:
// proxy_read_timeout is the first-byte budget, no X-Fleetwatch-Backend
// is added to the answers, and the group nginx falls back on when it cannot
// steer is the unsteered nginx's (least_conn, max_fails=3
// fail_timeout=10s, keepalive), so that failing open is that balancer.

// PeerSteeredNginx is the steered nginx kind.
const PeerSteeredNginx = "steered nginx"

const (
	// steeredPool is the pool of the steered nginx instances.
	steeredPool = peerModel + "-nginx"
	// steeredSource is the source of the log adapter's events: that of
	// `fleetwatch ingest nginx`, which the pick service takes by default
	// (pickd.DefaultPickSources).
	steeredSource = config.DefaultIngestSource + "-" + ingest.AdapterNginx
)

// steeredNginxConfig is the nginx configuration of a steered instance:
// docs/INTEGRATIONS.md's, with the benchmark's departures (above).
func steeredNginxConfig(dir string, port int, backends []string, pickAddr string, firstByte time.Duration) string {
	var servers strings.Builder
	for _, u := range backends {
		fmt.Fprintf(&servers, "        server %s max_fails=3 fail_timeout=10s;\n", strings.TrimPrefix(u, "http://"))
	}
	return fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    log_format fleetwatch escape=json
        '{"msec":"$msec","status":"$status","upstream_name":"$proxy_host",'
        '"upstream_addr":"$upstream_addr","upstream_status":"$upstream_status",'
        '"upstream_connect_time":"$upstream_connect_time","upstream_header_time":"$upstream_header_time",'
        '"upstream_response_time":"$upstream_response_time","request_time":"$request_time"}';
    upstream fleetwatch_pick {
        server %[2]s;
        keepalive 16;
    }
    upstream unsteered {
        least_conn;
%[3]s        keepalive 64;
    }
    server {
        listen 127.0.0.1:%[4]d;
        access_log %[1]s/access.log fleetwatch;
        proxy_http_version 1.1;
        proxy_buffering off;
        proxy_connect_timeout 1s;
        proxy_read_timeout %[5]dms;
        location /v1/ {
            set $fleetwatch_tried "";
            auth_request /.fleetwatch/pick;
            auth_request_set $fleetwatch_upstream $upstream_http_x_fleetwatch_upstream;
            auth_request_set $fleetwatch_shed $upstream_http_x_fleetwatch_shed;
            auth_request_set $fleetwatch_retry_after $upstream_http_retry_after;
            error_page 403 = @fleetwatch_shed;
            error_page 500 = @fleetwatch_unsteered;
            try_files /.fleetwatch-none @fleetwatch_first;
        }
        location @fleetwatch_first {
            proxy_pass http://$fleetwatch_upstream;
            proxy_intercept_errors on;
            error_page 429 500 502 503 504 = @fleetwatch_retry;
        }
        location @fleetwatch_retry {
            set $fleetwatch_tried $fleetwatch_upstream;
            auth_request /.fleetwatch/pick;
            auth_request_set $fleetwatch_upstream $upstream_http_x_fleetwatch_upstream;
            recursive_error_pages on;
            error_page 403 500 = @fleetwatch_unsteered;
            try_files /.fleetwatch-none @fleetwatch_second;
        }
        location @fleetwatch_second {
            proxy_pass http://$fleetwatch_upstream;
        }
        location @fleetwatch_unsteered {
            proxy_pass http://unsteered;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_500 http_502 http_503 http_504 http_429 non_idempotent;
            proxy_next_upstream_tries 3;
        }
        location @fleetwatch_shed {
            default_type application/json;
            add_header Retry-After $fleetwatch_retry_after always;
            add_header X-Fleetwatch-Shed $fleetwatch_shed always;
            return 503 '{"error":{"message":"every backend of the pool is open","type":"server_error","code":"fleetwatch_shed"}}\n';
        }
        location = /.fleetwatch/pick {
            internal;
            proxy_pass http://fleetwatch_pick/v1/pick?pool=%[6]s;
            proxy_pass_request_headers off;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Connection "";
            proxy_set_header X-Fleetwatch-Tried $fleetwatch_tried;
            proxy_set_header X-Fleetwatch-Shed-Status 403;
            proxy_connect_timeout 200ms;
            proxy_read_timeout 1s;
        }
    }
}
`, dir, pickAddr, servers.String(), port, firstByte.Milliseconds(), steeredPool)
}

// steeredPoolConfig is the steered instances' pool: the routers' backends
// under another id; unless analyzerDefaults, every 429 counts in the run
// and the rate that open a breaker (PeersSettings.SteeredAnalyzerDefaults).
func steeredPoolConfig(pool config.PoolConfig, analyzerDefaults bool) config.PoolConfig {
	pool.ID, pool.Models = steeredPool, []string{steeredPool}
	if !analyzerDefaults {
		all := "all"
		pool.Analyzer.ThrottledRunCounts, pool.Analyzer.ThrottleRateCounts = &all, &all
	}
	return pool
}

// startPickService runs the pick service (internal/pickd, as `fleetwatch
// epp` runs it) over the benchmark's configuration, following serve's
// decisions, and returns the host:port of its /v1/pick.
func (p *peerRun) startPickService(ctx context.Context) (string, error) {
	seed := p.s.Seed
	if seed == 0 {
		seed = 1
	}
	d, err := pickd.New(p.cfg, pickd.Options{
		GRPCListen: "127.0.0.1:0",
		HTTPListen: "127.0.0.1:0",
		Source:     "bench-pick",
		EPP:        epp.Settings{Pool: steeredPool, Seed: seed},
		Dial: func() (*nats.Conn, error) {
			return nats.Connect(p.natsURL, nats.Name("fleetwatch bench peers pick service"), nats.MaxReconnects(-1))
		},
		Logf: p.s.Logf,
	})
	if err != nil {
		return "", fmt.Errorf("bench peers: pick service: %w", err)
	}
	if err := d.Start(context.WithoutCancel(ctx)); err != nil { // ends at Close
		d.Close()
		return "", fmt.Errorf("bench peers: pick service: %w", err)
	}
	p.stops = append(p.stops, func() { d.Close() })
	return strings.TrimPrefix(d.HTTPURL(), "http://"), nil
}

// startSteeredNginx starts one steered nginx instance and the log adapter
// that follows its access log, and returns its base URL.
func (p *peerRun) startSteeredNginx(ctx context.Context, instance int, pickAddr string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(p.dir, fmt.Sprintf("steered-nginx-%d", instance))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(steeredNginxConfig(dir, port, p.urls, pickAddr, p.s.FirstByte)), 0o644); err != nil {
		return "", err
	}
	if err := p.startProcess(ctx, filepath.Base(dir), p.s.Nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", cfg); err != nil {
		return "", err
	}
	if err := p.followAccessLog(filepath.Join(dir, "access.log")); err != nil {
		return "", err
	}
	return fmt.Sprintf("http://127.0.0.1:%d", port), nil
}

// followAccessLog runs the nginx log adapter on path until the benchmark
// stops, publishing the steered pool's outcome events to serve's NATS
// server as `fleetwatch ingest nginx --file path` does (default poll).
func (p *peerRun) followAccessLog(path string) error {
	nc, err := nats.Connect(p.natsURL, nats.Name("fleetwatch bench peers ingest nginx"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("bench peers: ingest nginx: %w", err)
	}
	var upstreams []ingest.Upstream
	for i, u := range p.urls {
		upstreams = append(upstreams, ingest.Upstream{Match: strings.TrimPrefix(u, "http://"), Pool: steeredPool, Backend: fmt.Sprintf("b%d", i)})
	}
	in, err := ingest.NewLogIngester(ingest.LogSettings{
		Format:  ingest.AdapterNginx,
		Mapping: ingest.NewMapping(upstreams, false, ""),
		Emitter: ingest.NewEmitter(nc, ingest.EmitterSettings{Source: steeredSource}),
		Metrics: ingest.NewMetrics(metrics.NewSet(), ingest.AdapterNginx),
	})
	if err != nil {
		nc.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { // ends at cancel
		done <- ingest.RunLog(ctx, ingest.LogRunSettings{Ingester: in, File: path,
			Tail: ingest.TailSettings{FromStart: true, OffsetFile: path + ".offset"}, Logf: p.s.Logf})
	}()
	p.stops = append(p.stops, func() {
		cancel()
		if err := <-done; err != nil {
			p.s.Logf("bench peers: ingest nginx %s: %v", path, err)
		}
		nc.Close()
	})
	return nil
}
