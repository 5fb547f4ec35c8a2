package pickd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fleetwatch/fleetwatch/feed/epp"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// parseConfig is a configuration with NATS at natsURL and pool p of three
// endpoints (no server behind them: the picker never calls its backends).
func parseConfig(t *testing.T, natsURL string) *config.Config {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "nats: {url: %q}\npools:\n  - id: p\n    backends:\n", natsURL)
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(&b, "      - id: b%d\n        url: http://10.0.0.%d:8000\n", i, i)
	}
	cfg, err := config.Parse([]byte(b.String()), "fleetwatch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestDaemonLifecycle(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	cfg := parseConfig(t, natsURL)
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		d, err := New(cfg, Options{Logf: t.Logf, DrainTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return testkit.Lifecycle{Run: d.Run, Close: d.Close, Ready: d.Ready(), Once: true}
	}, ErrRunning, ErrClosed)
}

func TestNewChecksTheConfiguration(t *testing.T) {
	if _, err := New(config.Default(), Options{}); !errors.Is(err, ErrNoPools) {
		t.Errorf("no pools: %v, want ErrNoPools", err)
	}
	cfg := parseConfig(t, "nats://127.0.0.1:1")
	if _, err := New(cfg, Options{EPP: epp.Settings{Visibility: "all"}}); !errors.Is(err, epp.ErrConfig) {
		t.Errorf("a bad visibility: %v, want epp.ErrConfig", err)
	}
	cfg.Pools[0].Backends[0].URL = ""
	if _, err := New(cfg, Options{}); !errors.Is(err, route.ErrConfig) {
		t.Errorf("a backend without url: %v, want route.ErrConfig", err)
	}
}

// healthOf asks the daemon's gRPC health service about service.
func healthOf(t *testing.T, addr, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	return r.GetStatus()
}

func waitHealth(t *testing.T, d *Daemon, want healthpb.HealthCheckResponse_ServingStatus, why string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, why, func() bool {
		return healthOf(t, d.GRPCAddr(), epp.ExtProcService) == want && healthOf(t, d.GRPCAddr(), epp.ReadinessService) == want
	})
	if got := healthOf(t, d.GRPCAddr(), epp.LivenessService); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("%s: liveness %v, want SERVING", why, got)
	}
	status, _ := testkit.HTTPGet(t, d.HTTPURL()+"/healthz")
	if (want == healthpb.HealthCheckResponse_SERVING) != (status == http.StatusOK) {
		t.Errorf("%s: /healthz %d", why, status)
	}
}

// Readiness: not ready until the pool's first decision (with no timeout),
// ready once it came while NATS is connected, not ready while NATS is
// away, ready again when it is back.
func TestReadinessFollowsDecisionsAndNATS(t *testing.T) {
	natsURL, srv := feedtest.NewServer(t)
	port := feedtest.Port(srv)
	cfg := parseConfig(t, natsURL)
	d, err := New(cfg, Options{ReadyTimeout: -1, Logf: t.Logf, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, d, healthpb.HealthCheckResponse_NOT_SERVING, "not ready before a decision")
	nc := feedtest.Connect(t, natsURL)
	feedtest.NewScript(t, nc, "").Publish(feedtest.Snapshot("p", "e1", 1, time.Now(), feedtest.Closed("b1"), feedtest.Closed("b2"), feedtest.Closed("b3")))
	waitHealth(t, d, healthpb.HealthCheckResponse_SERVING, "ready after the first decision")

	srv.Shutdown()
	srv.WaitForShutdown()
	waitHealth(t, d, healthpb.HealthCheckResponse_NOT_SERVING, "not ready while NATS is away")
	feedtest.NewServer(t, feedtest.WithPort(port))
	waitHealth(t, d, healthpb.HealthCheckResponse_SERVING, "ready again when NATS is back")
}

// Without a decision, the picker is ready once ReadyTimeout passed (it
// then picks on equal weights).
func TestReadyAfterTheTimeout(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	d, err := New(parseConfig(t, natsURL), Options{ReadyTimeout: 300 * time.Millisecond, Logf: t.Logf, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, d, healthpb.HealthCheckResponse_SERVING, "ready after the timeout without a decision")
}

// The daemon serves ext_proc on its gRPC port (a pick and its outcome,
// published on <prefix>.outcomes.<source>), /metrics with the picker's
// series, and the routes of the HTTP hook.
func TestDaemonServes(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	events := testkit.CollectEvents(t, nc)
	d, err := New(parseConfig(t, natsURL), Options{Source: "epp.1", Logf: t.Logf, DrainTimeout: time.Second,
		HTTP: func(d *Daemon) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "pools %v", d.Core().IDs()) })
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d.Subject() != "fw.outcomes.epp_1" {
		t.Errorf("subject %q", d.Subject())
	}
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hm := func(kv ...string) *corev3.HeaderMap {
		return &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: kv[0], RawValue: []byte(kv[1])}}}
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm(":path", "/v1/models"), EndOfStream: true}}})
	r, err := s.Recv()
	if err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("answer %v, %v", r, err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm(":status", "200"), EndOfStream: true}}})
	s.Recv()
	s.CloseSend()
	testkit.Eventually(t, 10*time.Second, "the outcome event", func() bool {
		return len(events.Events()) == 1 && events.Messages("fw.outcomes.epp_1") == 1
	})
	if ev := events.Events()[0]; ev.Pool != "p" || ev.Source != "epp.1" || ev.Status != 200 {
		t.Errorf("event %+v", ev)
	}
	_, body := testkit.HTTPGet(t, d.HTTPURL()+"/metrics")
	for _, want := range []string{`fleetwatch_epp_picks_total{pool="p",result="ok"} 1`, "fleetwatch_route_events_published_total", "fleetwatch_feed_"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if status, body := testkit.HTTPGet(t, d.HTTPURL()+"/extra"); status != 200 || body != "pools [p]" {
		t.Errorf("the HTTP hook: %d %q", status, body)
	}
}

// The HTTP pick endpoint on the daemon's HTTP listener: a pick names an
// upstream and counts in flight until an outcome event of the steered
// proxy's log adapter (a pick source) finishes it, whether it comes on the
// source's own subject or, as `fleetwatch ingest nginx` publishes, on the
// pool's with the source in the event; an event of another source
// finishes nothing.
func TestDaemonServesPicks(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	d, err := New(parseConfig(t, natsURL), Options{Logf: t.Logf, DrainTimeout: time.Second, ReadyTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var id string
	for range 3 { // three picks on one backend
		req, _ := http.NewRequest(http.MethodGet, d.HTTPURL()+"/v1/pick", nil)
		if id != "" {
			req.Header.Set(epp.HeaderAmong, id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		up := resp.Header.Get(epp.HeaderUpstream)
		id = resp.Header.Get(epp.HeaderBackend)
		if resp.StatusCode != 200 || !strings.HasPrefix(up, "10.0.0.") || id == "" {
			t.Fatalf("/v1/pick: %d, upstream %q, backend %q", resp.StatusCode, up, id)
		}
	}
	if got := d.Core().InFlight("p", id); got != 3 {
		t.Fatalf("%s in flight after three picks: %d, want 3", id, got)
	}
	event := func(source string) string {
		return fmt.Sprintf(`{"v":1,"pool":"p","backend":%q,"status":200,"ttft_ms":40,"source":%q}`, id, source)
	}
	testkit.Publish(t, nc, "fw.outcomes.some-router", event("some-router"))
	testkit.Publish(t, nc, "fw.outcomes.p", event("some-router"))                                  // the pool's subject, another source
	testkit.Publish(t, nc, "fw.outcomes.p", event("fleetwatch-ingest-nginx"))                      // as the nginx adapter publishes
	testkit.Publish(t, nc, "fw.outcomes.fleetwatch-ingest-nginx", testkit.Event("p", id, 200, 40)) // the source's subject
	matched := func() string {
		_, body := testkit.HTTPGet(t, d.HTTPURL()+"/metrics")
		return grepLines(body, "fleetwatch_pick_outcomes_matched_total")
	}
	testkit.Eventually(t, 10*time.Second, "the two nginx outcomes to finish two picks", func() bool {
		return matched() == "fleetwatch_pick_outcomes_matched_total 2"
	})
	if got := d.Core().InFlight("p", id); got != 1 {
		t.Errorf("%s in flight %d after two outcomes of the pick source and two of another, want 1", id, got)
	}
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// With a self-signed certificate the gRPC port speaks TLS only: a client
// that skips verification (as data planes set up for GIE's picker do)
// gets its health; a plaintext client does not.
func TestSelfSignedTLS(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	tlsConfig, err := SelfSignedTLS()
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(parseConfig(t, natsURL), Options{GRPCTLS: tlsConfig, Logf: t.Logf, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	check := func(creds grpc.DialOption) error {
		conn, err := grpc.NewClient(d.GRPCAddr(), creds)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: epp.LivenessService})
		return err
	}
	if err := check(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))); err != nil {
		t.Errorf("over TLS: %v", err)
	}
	if err := check(grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		t.Error("a plaintext client got an answer from the TLS port")
	}
}
