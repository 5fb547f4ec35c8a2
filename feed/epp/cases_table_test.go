package epp

import (
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// peerCases is the table of TestPeerCases.
func peerCases() []peerCase {
	str := structpb.NewStringValue
	bigPrompt := `{"model":"llama","prompt":"` + strings.Repeat("p", 220<<10) + `"}`
	sseChunks := []string{`data: {}`, `data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}` + "\n" + `data: [DONE]`, ""}
	return []peerCase{
		// GIE's reference picker: how a subset hint is read.
		{name: "subset hint as a list", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_FilteringViaFilterMetadata",
			msgs: hinted(listValue("10.0.0.3:8080")), repeat: 10, check: routedWithin(true, "10.0.0.3:8080")},
		{name: "subset hint as a comma string", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_FilteringViaFilterMetadata_StringValue",
			msgs: hinted(str("10.0.0.2:8080,10.0.0.3:8080")), repeat: 30, check: routedWithin(true, "10.0.0.2:8080", "10.0.0.3:8080")},
		{name: "an empty subset hint is a 503", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_SubsetFilterEmptyReturnsNoPods; GIE docs/proposals/004-endpoint-picker-protocol/README.md @ f540ee91",
			msgs: hinted(listValue()), check: rejected(503, DroppedNoEndpoints)},
		{name: "a subset whose endpoints are all open is a 503", source: gie + "docs/proposals/004-endpoint-picker-protocol/README.md @ f540ee91 " +
			"(\"If none of the endpoints in the list is eligible ... 503\"; an open breaker is not eligible, and the subset rule wins over all_open=shed's 429)",
			decisions: []fleetwatch.Backend{feedtest.Closed("10.0.0.1:8080"), feedtest.Open("10.0.0.2:8080", time.Now().Add(time.Minute), "x"), feedtest.Open("10.0.0.3:8080", time.Now().Add(time.Minute), "x")},
			msgs:      hinted(listValue("10.0.0.2:8080", "10.0.0.3:8080")), check: rejected(503, DroppedNoEndpoints)},
		{name: "subset entries trimmed, empty ones skipped", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_StringMetadataMalformedWhitespaceTrimming",
			msgs: hinted(str("  10.0.0.2:8080 ,  ,  10.0.0.3:8080  ")), repeat: 30, check: routedWithin(true, "10.0.0.2:8080", "10.0.0.3:8080")},
		{name: "a subset naming no endpoint of the pool is a 503", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_StringMetadataNoMatchesReturnsNoPods",
			msgs: hinted(str("192.168.1.1:8080")), check: rejected(503, DroppedNoEndpoints)},
		{name: "a list element holding a comma list", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_MixedArrayAndCommaStringElements",
			msgs: hinted(listValue("10.0.0.2:8080, 10.0.0.3:8080")), repeat: 30, check: routedWithin(true, "10.0.0.2:8080", "10.0.0.3:8080")},
		{name: "subset: a specific port only", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_PortAwareFiltering",
			pool: gie4, msgs: hinted(str("10.0.0.1:8080")), repeat: 10, check: routedWithin(true, "10.0.0.1:8080")},
		{name: "subset: a bare ip is every port of it", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_PortAwareFiltering",
			pool: gie4, msgs: hinted(str("10.0.0.1")), repeat: 30, check: routedWithin(true, "10.0.0.1:8080", "10.0.0.1:9090")},
		{name: "subset: ip:port and bare ip mixed", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_PortAwareFiltering",
			pool: gie4, msgs: hinted(str("10.0.0.1:8080,10.0.0.2")), repeat: 40, check: routedWithin(true, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.2:9090")},
		{name: "subset: no port matches is a 503", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_PortAwareFiltering",
			pool: gie4, msgs: hinted(str("10.0.0.1:3000")), check: rejected(503, DroppedNoEndpoints)},
		{name: "no subset metadata: any endpoint", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_NoSubsetMetadataReturnsAllPods",
			msgs: headersOnly, repeat: 30, check: routedWithin(true, gie3.addrs...)},
		{name: "the subset namespace without its key: any endpoint", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_MetadataNamespaceEmptyReturnsAllPods",
			msgs: func() []*extprocv3.ProcessingRequest {
				m := withHint(reqHeaders(nil, true), str("x"))
				m.MetadataContext.FilterMetadata[SubsetNamespace].Fields = map[string]*structpb.Value{"some-other-unrelated-key": str("val")}
				return []*extprocv3.ProcessingRequest{m}
			}, repeat: 30, check: routedWithin(true, gie3.addrs...)},
		{name: "deviation: the conformance test header steers nothing", source: gie + "pkg/lwepp/handlers/request_test.go TestHandleRequestHeaders_HeaderTakesPrecedenceOverMetadata " +
			"(test-epp-endpoint-selection is the conformance picker's test-only override; a client must not choose the backend past the decisions)",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{withHint(reqHeaders(map[string]string{"test-epp-endpoint-selection": "10.0.0.2"}, true), listValue("10.0.0.3:8080"))}
			}, repeat: 5, check: routedWithin(true, "10.0.0.3:8080")},
		{name: "the headers' answer waits for a held body, then the body", source: gie + "pkg/lwepp/handlers/server_test.go TestProcess_DeferredHeaderMutationOnStreamingBody " +
			"(with prefix_from system: the pick at the end of the body; the body comes back streamed, FULL_DUPLEX_STREAMED)",
			settings: Settings{PrefixFrom: route.PrefixSystem},
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(map[string]string{"hi": "mom"}, false), reqBody(`{"prompt": "hello"}`, true)}
			},
			check: all(answeredAs("RequestHeaders,RequestBody"), routedWithin(false, gie3.addrs...), bodyPassed(true, `{"prompt": "hello"}`, 1))},
		{name: "the served endpoint in the response metadata gets the outcome", source: gie + "pkg/lwepp/handlers/response_test.go TestHandleResponseHeaders_UsesServedEndpointFromMetadata",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{withHint(reqHeaders(nil, true), listValue("10.0.0.1:8080")),
					withServed(respHeaders(map[string]string{":status": "503"}, true), "10.0.0.2:8080")}
			}, check: all(servedGetsOutcome("10.0.0.2:8080"), metricSays(`fleetwatch_epp_served_elsewhere_total{pool="gie"} 1`))},
		{name: "no served endpoint: the picked one gets the outcome", source: gie + "pkg/lwepp/handlers/response_test.go TestHandleResponseHeaders_MissingEnvoyLBMetadata",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(nil, true), respHeaders(map[string]string{":status": "200"}, true)}
			}, check: servedGetsOutcome("")},
		{name: "a 220 KB body in one message comes back in 62,000-byte chunks", source: gie + "pkg/common/envoy/chunking.go BuildChunkedBodyResponses (BodyByteLimit 62000); " + llmd + "pkg/common/envoy/chunking.go",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(nil, false), reqBody(bigPrompt, true)}
			}, check: bodyPassed(true, bigPrompt, (len(bigPrompt)+MaxChunk-1)/MaxChunk)},

		// llm-d-router's hermetic integration test.
		{name: "split body across chunks", source: llmd + "test/integration/epp/hermetic_test.go \"split body across chunks\"",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(map[string]string{"hi": "mom"}, false),
					reqBody(`{"max_tokens":100,"model":"sql-lo`, false), reqBody(`ra-sheddable","prompt":"test6","temperature":0}`, true)}
			}, check: all(routedWithin(false, gie3.addrs...), bodyPassed(true, `{"max_tokens":100,"model":"sql-lora-sheddable","prompt":"test6","temperature":0}`, 2))},
		{name: "subsetting: select best from subset", source: llmd + "test/integration/epp/hermetic_test.go \"subsetting: select best from subset\"",
			msgs: hinted(listValue(gie3.addrs...)), repeat: 30, check: routedWithin(true, gie3.addrs...)},
		{name: "subsetting: partial match", source: llmd + "test/integration/epp/hermetic_test.go \"subsetting: partial match\"",
			msgs: hinted(listValue("10.0.0.3:8080")), repeat: 5, check: routedWithin(true, "10.0.0.3:8080")},
		{name: "subsetting: no pods match", source: llmd + "test/integration/epp/hermetic_test.go \"subsetting: no pods match\" (503 with x-llm-d-request-dropped-reason rejected-no-endpoints)",
			msgs: hinted(listValue("192.168.1.99:8000")), check: rejected(503, DroppedNoEndpoints)},
		{name: "protocol: simple GET (header only)", source: llmd + "test/integration/epp/hermetic_test.go \"protocol: simple GET (header only)\"; pkg/epp/handlers/request.go (end_of_stream on the headers: routed at once)",
			msgs: headersOnly, check: all(answeredAs("RequestHeaders"), routedWithin(false, gie3.addrs...))},
		{name: "response: multi-chunk JSON passes through", source: llmd + "test/integration/epp/hermetic_test.go \"response buffering: multi-chunk JSON\" (llm-d buffers and sends it back whole; streamed back chunk by chunk here, which FULL_DUPLEX_STREAMED allows)",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{respHeaders(map[string]string{"content-type": "application/json"}, false),
					respBody(`{"max_tokens":100,"model":"sql-lo`, false), respBody(`ra-sheddable","prompt":"test6","temperature":0}`, true)}
			}, check: all(answeredAs("ResponseHeaders,ResponseBody,ResponseBody"), bodyPassed(false, `{"max_tokens":100,"model":"sql-lora-sheddable","prompt":"test6","temperature":0}`, 2))},
		{name: "response: an empty end_of_stream chunk", source: llmd + "test/integration/epp/hermetic_test.go \"response buffering: empty EOS chunk (JSON)\"",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{respHeaders(map[string]string{"content-type": "application/json"}, false),
					respBody(`{"model":"m"}`, false), respBody("", true)}
			}, check: bodyPassed(false, `{"model":"m"}`, 2)},
		{name: "response: invalid JSON passes through", source: llmd + "test/integration/epp/hermetic_test.go \"response buffering: invalid JSON\"",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{respHeaders(map[string]string{"content-type": "application/json"}, false), respBody("no healthy upstream", true)}
			}, check: bodyPassed(false, "no healthy upstream", 1)},
		{name: "response: SSE chunks streamed back as they come", source: llmd + "test/integration/epp/hermetic_test.go \"response streaming: SSE token counting\"",
			msgs: func() []*extprocv3.ProcessingRequest {
				ms := []*extprocv3.ProcessingRequest{respHeaders(map[string]string{"content-type": "text/event-stream", ":status": "200"}, false)}
				for i, c := range sseChunks {
					ms = append(ms, respBody(c, i == len(sseChunks)-1))
				}
				return ms
			}, check: all(answeredAs("ResponseHeaders,ResponseBody,ResponseBody,ResponseBody"), bodyPassed(false, strings.Join(sseChunks, ""), 3))},
		{name: "response trailers end the response", source: llmd + "test/integration/epp/common_tests.go ReqRequestHeadersAndResponseGRPC (a gRPC answer ends with trailers)",
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(nil, true), respHeaders(map[string]string{":status": "200", "content-type": "application/grpc"}, false),
					respBody("\x00\x00\x00\x00\x02hi", false), {Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}}
			}, check: all(answeredAs("RequestHeaders,ResponseHeaders,ResponseBody,ResponseTrailers"), servedGetsOutcome(""))},
		{name: "deviation: no endpoint to pick is a 503, not a 500", source: llmd + "test/integration/epp/hermetic_test.go \"no backend pods available\" " +
			"(llm-d answers 500 Internal; the protocol says 503 when there are no ready endpoints. A configured pool is never empty, " +
			"and a decision weighing every backend 0 is spread rather than send nothing (feed/p2c): the case here is a request " +
			"that may go to no endpoint of the pool)",
			msgs: hinted(listValue("10.0.0.9:8080")), check: all(rejected(503, DroppedNoEndpoints), metricSays(`fleetwatch_epp_picks_total{pool="gie",result="no_endpoint"} 1`))},
		{name: "deviation: a body without a model is routed", source: llmd + "test/integration/epp/hermetic_test.go \"request missing model field\" and \"invalid json body\" " +
			"(llm-d answers 400; this picker serves one pool and picks at the headers: the model server judges the body)",
			settings: Settings{PrefixFrom: route.PrefixSystem},
			msgs: func() []*extprocv3.ProcessingRequest {
				return []*extprocv3.ProcessingRequest{reqHeaders(nil, false), reqBody("no healthy upstream", true)}
			}, check: all(routedWithin(false, gie3.addrs...), bodyPassed(true, "no healthy upstream", 1))},
	}
}

// servedGetsOutcome checks the one outcome event: against served, or the
// picked endpoint when served is "".
func servedGetsOutcome(served string) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		picked, _ := destination(r.answers[0][0])
		want := served
		if want == "" {
			want = picked
		}
		evs := eventsOf(t, r.n, r.source, 1)
		if len(evs) != 1 || evs[0].Backend != want {
			t.Errorf("events %+v: want one, against %s (picked %s)", evs, want, picked)
		}
	}
}

// metricSays checks a line of the picker's metrics.
func metricSays(line string) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		if !strings.Contains(r.pk.metricsText(), line) {
			t.Errorf("metrics lack %s:\n%s", line, r.pk.metricsText())
		}
	}
}
