package main

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// startEPPCmd runs `fleetwatch epp` in-process on free loopback ports and
// returns its gRPC address and HTTP base URL; it stops in t.Cleanup.
func startEPPCmd(t *testing.T, configPath string, args ...string) (grpcAddr, httpURL string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	all := append([]string{"--config", configPath, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--source", "test-epp", "--drain-timeout", "1s"}, args...)
	go func() { done <- runEPP(ctx, all, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("epp: %v\nstderr:\n%s", err, stderr.String())
		}
	})
	eventually(t, 30*time.Second, "epp to listen", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("epp exited: %v\nstderr:\n%s", err, stderr.String())
		default:
		}
		out := stdout.String()
		i := strings.Index(out, "ext_proc on ")
		if i < 0 {
			return false
		}
		f := strings.Fields(out[i+len("ext_proc on "):])
		grpcAddr, httpURL = strings.TrimSuffix(f[0], ","), f[3]
		return true
	})
	return grpcAddr, httpURL
}

// TestEPPPicksAndReportsHealth is the smoke test of `fleetwatch epp` as a
// command: flags, configuration, NATS, ext_proc and gRPC health on --grpc,
// /metrics on --http. The picker itself is tested in feed/epp.
func TestEPPPicksAndReportsHealth(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	log := testkit.CollectEvents(t, nc)
	backends := testkit.StartFakeBackends(t, 2)
	var addrs []string
	for _, b := range backends {
		u, _ := url.Parse(b.URL())
		addrs = append(addrs, u.Host)
	}
	grpcAddr, httpURL := startEPPCmd(t, routeConfig(t, natsURL, backends, ""), "--visibility", "headers")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	if check("liveness") != healthpb.HealthCheckResponse_SERVING {
		t.Error("liveness not SERVING")
	}
	feedtest.NewScript(t, nc, "").Publish(feedtest.Snapshot("llama", "e1", 1, time.Now(), feedtest.Closed("b0"), feedtest.Closed("b1")))
	eventually(t, 20*time.Second, "readiness after the decision", func() bool {
		return check("readiness") == healthpb.HealthCheckResponse_SERVING && check("envoy.service.ext_proc.v3.ExternalProcessor") == healthpb.HealthCheckResponse_SERVING
	})

	s, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hm := func(k, v string) *corev3.HeaderMap {
		return &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: k, RawValue: []byte(v)}}}
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm(":path", "/v1/models"), EndOfStream: true}}})
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	picked := string(r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue())
	if !slices.Contains(addrs, picked) {
		t.Errorf("picked %q, want one of %v", picked, addrs)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm(":status", "200"), EndOfStream: true}}})
	r, err = s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()) == 0 {
		t.Error("--visibility headers: no X-Fleetwatch-* headers on the response")
	}
	s.CloseSend()
	eventually(t, 20*time.Second, "the outcome event", func() bool { return log.Messages("fw.outcomes.test-epp") == 1 })
	status, body := testkit.HTTPGet(t, httpURL+"/metrics")
	if status != 200 || !strings.Contains(body, `fleetwatch_epp_picks_total{pool="llama",result="ok"} 1`) {
		t.Errorf("/metrics: %d\n%s", status, body)
	}
}

func TestEPPFlagErrors(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	path := routeConfig(t, natsURL, testkit.StartFakeBackends(t, 1), "")
	for _, args := range [][]string{
		{"--fallbacks", "-1"},
		{"--visibility", "everything"},
		{"--body-mode", "duplex"},
		{"--prefix-from", "user"},
		{"--pool", "nope"},
		{"--grpc-tls", "on"},
		{"--grpc-cert", "x.pem"},
		{"--grpc-tls", "files", "--grpc-cert", "missing.pem", "--grpc-key", "missing.key"},
	} {
		var stdout, stderr syncBuffer
		err := runEPP(context.Background(), append([]string{"--config", path}, args...), &stdout, &stderr)
		if err == nil || (!errors.Is(err, errUsage) && !strings.Contains(err.Error(), "config:")) {
			t.Errorf("%v: %v, want a usage or configuration error", args, err)
		}
	}
}

// TestMetricsCatalogueEPP checks the "fleetwatch epp" section of
// docs/METRICS.md against the /metrics of a real `fleetwatch epp` that has
// followed a decision, picked, shed and reported an outcome.
func TestMetricsCatalogueEPP(t *testing.T) {
	natsURL, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, natsURL)
	backends := testkit.StartFakeBackends(t, 2)
	grpcAddr, httpURL := startEPPCmd(t, routeConfig(t, natsURL, backends, ""))
	script := feedtest.NewScript(t, nc, "")
	script.Publish(feedtest.Snapshot("llama", "e1", 1, time.Now(), feedtest.Closed("b0"), feedtest.Closed("b1")))
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	exchange := func(msgs ...*extprocv3.ProcessingRequest) {
		s, err := client.Process(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			s.Send(m)
		}
		s.CloseSend()
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}
	hm := func(k, v string) *corev3.HeaderMap {
		return &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: k, RawValue: []byte(v)}}}
	}
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm(":path", "/"), EndOfStream: true}}},
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm(":status", "200"), EndOfStream: true}}})
	eventually(t, 20*time.Second, "the outcome published", func() bool {
		_, body := testkit.HTTPGet(t, httpURL+"/metrics")
		return strings.Contains(body, "fleetwatch_route_events_published_total 1")
	})
	checkMetricsCatalogue(t, "## fleetwatch epp", httpURL+"/metrics")
}
