package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The two peers, configured as their documentation recommends for passive
// health checking, with the same first-byte budget as fleetwatch's router
// and the same number of attempts (3), retries on another server included.

// haproxyConfig is HAProxy 2.6's configuration: balance leastconn;
// observe layer7 with on-error mark-down takes a server down after
// error-limit consecutive errors (5xx and timeouts; HAProxy does not count
// a 429 as an error), and the HTTP health check brings it back; failed
// connections are retried on another server (option redispatch 1). With
// l7Retries, response timeouts and 5xx are retried too (retry-on; it has
// no 429), but a retried 5xx is then not seen by observe layer7. timeout
// server is the inactivity budget: the first byte included.
func haproxyConfig(port int, backends []string, firstByte time.Duration, l7Retries bool) string {
	retryOn := "conn-failure"
	if l7Retries {
		retryOn = "conn-failure empty-response response-timeout 500 502 503 504"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `global
    maxconn 4096
    log stderr format raw local0 notice

defaults
    mode http
    log global
    timeout connect 1s
    timeout client 120s
    timeout server %dms
    timeout queue 5s
    retries 2
    option redispatch 1
    retry-on %s

frontend bench
    bind 127.0.0.1:%d
    default_backend fleet

backend fleet
    balance leastconn
    option httpchk GET /v1/models
    http-check expect status 200
    default-server check inter 1s fall 3 rise 2 observe layer7 error-limit 5 on-error mark-down
`, firstByte.Milliseconds(), retryOn, port)
	for i, u := range backends {
		fmt.Fprintf(&b, "    server b%d %s\n", i, strings.TrimPrefix(u, "http://"))
	}
	return b.String()
}

// nginxConfig is nginx 1.22's configuration: least_conn; max_fails=3
// fail_timeout=10s marks a server unavailable for 10 s after 3 failed
// attempts within 10 s (errors, timeouts and the listed statuses, 429
// included); proxy_next_upstream retries those on another server, POST
// included (non_idempotent), 3 tries in all. proxy_read_timeout is the
// budget between two reads: the first byte included. Streams are passed on
// unbuffered.
func nginxConfig(dir string, port int, backends []string, firstByte time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, `daemon off;
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
    upstream fleet {
        least_conn;
`, dir)
	for _, u := range backends {
		fmt.Fprintf(&b, "        server %s max_fails=3 fail_timeout=10s;\n", strings.TrimPrefix(u, "http://"))
	}
	fmt.Fprintf(&b, `        keepalive 64;
    }
    server {
        listen 127.0.0.1:%d;
        location / {
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 1s;
            proxy_read_timeout %dms;
            proxy_next_upstream error timeout http_500 http_502 http_503 http_504 http_429 non_idempotent;
            proxy_next_upstream_tries 3;
        }
    }
}
`, port, firstByte.Milliseconds())
	return b.String()
}

func (p *peerRun) startHAProxy(ctx context.Context, l7Retries bool, instance int) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("haproxy-%d", instance)
	if l7Retries {
		name = fmt.Sprintf("haproxy-retries-%d", instance)
	}
	cfg := filepath.Join(p.dir, name+".cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(port, p.urls, p.s.FirstByte, l7Retries)), 0o644); err != nil {
		return "", err
	}
	if err := p.startProcess(ctx, name, p.s.HAProxy, "-db", "-f", cfg); err != nil {
		return "", err
	}
	return fmt.Sprintf("http://127.0.0.1:%d", port), nil
}

func (p *peerRun) startNginx(ctx context.Context, instance int) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(p.dir, fmt.Sprintf("nginx-%d", instance))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(nginxConfig(dir, port, p.urls, p.s.FirstByte)), 0o644); err != nil {
		return "", err
	}
	// -e: nginx opens its default error log before reading the
	// configuration otherwise.
	if err := p.startProcess(ctx, filepath.Base(dir), p.s.Nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", cfg); err != nil {
		return "", err
	}
	return fmt.Sprintf("http://127.0.0.1:%d", port), nil
}

// startProcess starts a peer and registers its stop: SIGTERM, then SIGKILL
// after 5 s. A process that exits early is an error naming its output.
func (p *peerRun) startProcess(ctx context.Context, name, bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the benchmark
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bench peers: %s: %w", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // ends when the process exits
	p.stops = append(p.stops, func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if o := strings.TrimSpace(out.String()); o != "" {
			p.s.Logf("bench peers: %s said:\n%s", name, o)
		}
	})
	// A configuration error shows within moments.
	select {
	case err := <-exited:
		exited <- err // for the stop
		return fmt.Errorf("bench peers: %s exited at start (%v): %s", name, err, out.String())
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	p.s.Logf("bench peers: %s running (pid %d)", name, cmd.Process.Pid)
	return nil
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
