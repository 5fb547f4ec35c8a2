package epp

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// dataPlanes are the data planes the picker is driven as, each derived from
// the peer's source (read here, never run: docs/INTEGRATIONS.md).
var dataPlanes = []profile{
	{
		name: "envoy override_host",
		source: "envoyproxy/envoy source/extensions/load_balancing_policies/override_host/load_balancer.cc @ 043486c7 " +
			"(the endpoint from envoy.lb/x-gateway-destination-endpoint metadata, a comma list walked in order; " +
			"selected_host_key reports the served endpoint) and api/envoy/extensions/load_balancing_policies/override_host/v3/override_host.proto @ 0bd17f59; " +
			"the filter as envoyproxy/ai-gateway internal/extensionserver/inferencepool.go @ 635780cc configures it " +
			"(FULL_DUPLEX_STREAMED both ways, trailers SEND, FailOpen pools on override_host); " +
			"protocol_config on the first message is assumed for an Envoy recent enough to have override_host",
		protocolConfig: true, chunk: 16 << 10, readMetadata: true, hint: true, served: true, responsePhase: true,
	},
	{
		name: "envoy ORIGINAL_DST",
		source: "llm-d/llm-d-router deploy/environments/dev/e2e-infra/envoy.yaml @ feafdf44 " +
			"(Envoy v1.33.2, FULL_DUPLEX_STREAMED both ways, trailers SEND, an ORIGINAL_DST cluster with " +
			"original_dst_lb_config.use_http_header on x-gateway-destination-endpoint: one ip:port; no served endpoint); " +
			"envoyproxy/ai-gateway internal/extensionserver/inferencepool.go @ 635780cc configures FailClose pools the same way; " +
			"no protocol_config (the picker assumes its BodyMode)",
		chunk: 16 << 10, hint: true, responsePhase: true,
	},
	{
		name: "agentgateway",
		source: "agentgateway/agentgateway crates/agentgateway/src/http/ext_proc.rs @ 19078fe9 (snapshot 75b4e6ce): " +
			"protocol_config FULL_DUPLEX_STREAMED both ways on the first message, the body streamed without waiting for " +
			"the headers' answer and ended by an empty end_of_stream chunk, the response body sent after the response " +
			"headers' answer, envoy.lb/x-gateway-destination-endpoint-served in the response metadata_context, and " +
			"x-gateway-destination-endpoint read from the header as one SocketAddr (a list is an error); " +
			"ext_proc/headers.rs: headers in raw_value, pseudo headers (:status) in value",
		protocolConfig: true, pseudoValue: true, chunk: 8 << 10, emptyEnd: true, waitHeaders: true, served: true, responsePhase: true,
	},
	{
		name: "NGINX Gateway Fabric",
		source: "nginx/nginx-gateway-fabric cmd/gateway/endpoint_picker.go @ 07e47095: the Go shim sends the headers " +
			"(value, end_of_stream false) and the whole body in one message (end_of_stream true), half-closes, reads " +
			"until the end: an ImmediateResponse's status, or x-gateway-destination-endpoint from the headers' answer; " +
			"no response phase",
		valueHeaders: true,
	},
}

// chatBody is a chat request with a system prompt of n bytes.
func chatBody(n int) string {
	return `{"model":"llama","stream":true,"messages":[{"role":"system","content":"` + strings.Repeat("s", n) +
		`"},{"role":"user","content":"hi"}]}`
}

// sseAnswer is a model server's streamed answer naming the endpoint.
func sseAnswer(endpoint, _ string) upstream {
	return upstream{status: 200, ctype: "text/event-stream", chunks: []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"" + endpoint + "\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
	}}
}

// Every data plane, driven as it drives an endpoint picker, gets a request
// to an endpoint of the pool with its body intact (a 220 KB prompt
// included: echoed in chunks of at most 62,000 bytes), never to an open
// breaker, a shed as an ImmediateResponse 429, and its client gets the
// model server's answer intact; the pick's outcome is published against
// the endpoint that served, except where the data plane shows no response
// (NGF: counted unreported), and no pick stays in flight.
func TestDataPlaneProfiles(t *testing.T) {
	for _, p := range dataPlanes {
		t.Run(p.name, func(t *testing.T) {
			t.Logf("derived from %s", p.source)
			n := newNATS(t)
			source := "dp-" + strings.ReplaceAll(p.name, " ", "-")
			pk := startPicker(t, n, Settings{Source: source})
			now := time.Now()
			pk.publish(t, n, feedtest.Snapshot("llama", "e1", 1, now,
				feedtest.Closed(llama.addrs[0]),
				feedtest.Open(llama.addrs[1], now.Add(time.Minute), "error rate 0.9"),
				feedtest.Closed(llama.addrs[2])))
			reported := 0
			for i, size := range []int{10, 220 << 10, 10, 10, 10, 10} {
				body := chatBody(size)
				out := p.drive(t, pk, exchangeSpec{body: body, answer: sseAnswer})
				if out.endpoint == llama.addrs[1] || !slices.Contains(llama.addrs, out.endpoint) {
					t.Errorf("request %d routed to %q: want a healthy endpoint of the pool", i, out.endpoint)
				}
				if out.forwarded != body {
					t.Errorf("request %d: the body forwarded is %d bytes, want the %d sent, unchanged", i, len(out.forwarded), len(body))
				}
				if p.responsePhase {
					reported++
					if want := sseAnswer(out.endpoint, "").chunks; out.clientBody != strings.Join(want, "") {
						t.Errorf("request %d: the client got %q", i, out.clientBody)
					}
				}
			}
			if reported > 0 {
				for _, ev := range eventsOf(t, n, source, reported) {
					if ev.Backend == llama.addrs[1] || ev.Status != 200 || ev.Outcome != fleetwatch.OutcomeOK || !ev.HasTTFT {
						t.Errorf("event %+v: want 200 ok with a TTFT on a healthy backend", ev)
					}
				}
			} else if !strings.Contains(pk.metricsText(), `fleetwatch_epp_unreported_total{pool="llama"} 6`) {
				t.Errorf("no response phase: the 6 picks are not counted unreported:\n%s", pk.metricsText())
			}
			pk.publish(t, n, feedtest.Snapshot("llama", "e1", 2, now,
				feedtest.Open(llama.addrs[0], now.Add(time.Minute), "x"),
				feedtest.Open(llama.addrs[1], now.Add(time.Minute), "x"),
				feedtest.Open(llama.addrs[2], now.Add(time.Minute), "x")))
			out := p.drive(t, pk, exchangeSpec{body: chatBody(10), answer: sseAnswer})
			if out.shedCode != 429 || out.shedReason != DroppedSaturated || out.endpoint != "" {
				t.Errorf("every backend open: shed %d %q, routed to %q; want 429 %s", out.shedCode, out.shedReason, out.endpoint, DroppedSaturated)
			}
			testkit.Eventually(t, 5*time.Second, "no pick in flight", func() bool { return pk.inFlight("llama") == 0 })
		})
	}
}
