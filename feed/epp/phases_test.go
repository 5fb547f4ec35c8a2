package epp

import (
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// withConfig sets protocol_config on m (the first message of a stream).
func withConfig(m *extprocv3.ProcessingRequest, req, resp filterv3.ProcessingMode_BodySendMode, early bool) *extprocv3.ProcessingRequest {
	m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp, SendBodyWithoutWaitingForHeaderResponse: early}
	return m
}

// The body modes: in BUFFERED and STREAMED each body message is
// acknowledged without a mutation (a StreamedBodyResponse is only allowed
// in FULL_DUPLEX_STREAMED), whether the data plane says so in
// protocol_config or the picker's BodyMode assumes it; a pick at the end
// of the body happens only where the data plane sends the body before the
// headers' answer (otherwise it would wait for an answer that waits for
// it).
func TestBodyModes(t *testing.T) {
	buffered, streamed := filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED
	body := chatBody(10)
	for _, c := range []struct {
		name  string
		s     Settings
		first *extprocv3.ProcessingRequest
		want  string
	}{
		{"BUFFERED by protocol_config", Settings{}, withConfig(reqHeaders(nil, false), buffered, buffered, false),
			"RequestHeaders,RequestBody,ResponseHeaders,ResponseBody"},
		{"STREAMED by protocol_config", Settings{}, withConfig(reqHeaders(nil, false), streamed, streamed, false),
			"RequestHeaders,RequestBody,ResponseHeaders,ResponseBody"},
		{"BUFFERED assumed (no protocol_config)", Settings{BodyMode: BodyBuffered}, reqHeaders(nil, false),
			"RequestHeaders,RequestBody,ResponseHeaders,ResponseBody"},
		{"BUFFERED, prefix_from system: picked at the headers", Settings{PrefixFrom: route.PrefixSystem}, withConfig(reqHeaders(nil, false), buffered, buffered, false),
			"RequestHeaders,RequestBody,ResponseHeaders,ResponseBody"},
		{"STREAMED without waiting, prefix_from system: held", Settings{PrefixFrom: route.PrefixSystem}, withConfig(reqHeaders(nil, false), streamed, streamed, true),
			"RequestHeaders,RequestBody,ResponseHeaders,ResponseBody"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNATS(t)
			pk := startPicker(t, n, c.s)
			rs, err := pk.exchange(t, c.first, reqBody(body, true), respHeaders(map[string]string{":status": "200"}, false), respBody("{}", true))
			if err != nil {
				t.Fatal(err)
			}
			if got := kinds(rs); got != c.want {
				t.Fatalf("answers %s, want %s", got, c.want)
			}
			for _, r := range rs {
				if r.GetRequestBody().GetResponse().GetBodyMutation() != nil || r.GetResponseBody().GetResponse().GetBodyMutation() != nil {
					t.Errorf("a body mutation outside FULL_DUPLEX_STREAMED: %v", r)
				}
			}
			testkit.Eventually(t, 5*time.Second, "no pick in flight", func() bool { return pk.inFlight("llama") == 0 })
		})
	}
}

// A held body longer than MaxBody is picked without waiting for its end;
// request trailers end a held body like an end_of_stream chunk.
func TestHeldBodyBounds(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{PrefixFrom: route.PrefixSystem, MaxBody: 100})
	long := strings.Repeat("x", 150)
	rs, err := pk.exchange(t, reqHeaders(nil, false), reqBody(long, false), reqBody("tail", true))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(rs); got != "RequestHeaders,RequestBody,RequestBody" {
		t.Errorf("a body over MaxBody: answers %s", got)
	}
	if got, ended, _ := echoed(rs, true); got != long+"tail" || !ended {
		t.Errorf("body passed %q ended %v", got, ended)
	}
	rs, err = pk.exchange(t, reqHeaders(nil, false), reqBody(chatBody(5), false),
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(rs); got != "RequestHeaders,RequestBody,RequestTrailers" {
		t.Errorf("a body ended by trailers: answers %s", got)
	}
}

// The response phase's outcome: a 429's Retry-After becomes the event's
// retry_after_ms; a 200 SSE stream cut before its end is an outcome error
// with stream_error cut (feed/route's check in passing), counted.
func TestResponseOutcomes(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{Source: "outcomes"})
	_, err := pk.exchange(t, reqHeaders(nil, true), respHeaders(map[string]string{":status": "429", "retry-after": "7"}, false), respBody(`{"error":"slow down"}`, true))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pk.exchange(t, reqHeaders(nil, true), respHeaders(map[string]string{":status": "200", "content-type": "text/event-stream"}, false),
		respBody("data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n", false), respBody("", true))
	if err != nil {
		t.Fatal(err)
	}
	evs := eventsOf(t, n, "outcomes", 2)
	if evs[0].Outcome != fleetwatch.OutcomeThrottled || evs[0].RetryAfterMs != 7000 {
		t.Errorf("429 event %+v: want throttled with retry_after_ms 7000", evs[0])
	}
	if evs[1].Outcome != fleetwatch.OutcomeError || evs[1].StreamError != fleetwatch.StreamCut || evs[1].Status != 200 {
		t.Errorf("cut stream event %+v: want error with stream_error cut", evs[1])
	}
	if !strings.Contains(pk.metricsText(), `reason="cut"} 1`) {
		t.Errorf("the cut stream is not counted:\n%s", pk.metricsText())
	}
}

// An answer served by a fallback of the list finishes the pick as
// canceled and reports the outcome against the fallback, counted as
// served_fallback; one served by an endpoint outside the list is counted
// served_elsewhere. The decision visibility names the picked backend and
// why (state, weight, class, decision age) in the dynamic metadata, and
// the backend that served in the response headers.
func TestServedFallbackAndVisibility(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{Fallbacks: 1, Visibility: VisibilityBoth, Source: "vis"})
	now := time.Now()
	down := feedtest.Closed(llama.addrs[1])
	down.Weight = 0.5
	pk.publish(t, n, feedtest.Snapshot("llama", "e1", 1, now.Add(-1500*time.Millisecond),
		feedtest.Closed(llama.addrs[0]), down, feedtest.Closed(llama.addrs[2])))

	// The data plane reads the answer, then reports the fallback served.
	s, err := pk.client.Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(reqHeaders(nil, true)); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	header, _ := destination(first)
	list := strings.Split(header, ",")
	if len(list) != 2 {
		t.Fatalf("destination %q: want a primary and one fallback", header)
	}
	vis := first.GetDynamicMetadata().GetFields()[VisibilityNamespace].GetStructValue().GetFields()
	if vis["backend"].GetStringValue() != list[0] || vis["reason_class"].GetStringValue() == "" || vis["decision_age_s"].GetNumberValue() < 1 {
		t.Errorf("visibility metadata %v: want the picked backend, its reason class and the decision's age", vis)
	}
	if err := s.Send(withServed(respHeaders(map[string]string{":status": "200"}, true), list[1])); err != nil {
		t.Fatal(err)
	}
	second, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	s.CloseSend()
	got := second.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if headerOf(got, visBackend) != list[1] || headerOf(got, visReason) == "" || headerOf(got, visAge) == "" {
		t.Errorf("visibility headers %v: want the served backend %s and why", got, list[1])
	}
	if evs := eventsOf(t, n, "vis", 1); evs[0].Backend != list[1] {
		t.Errorf("event %+v: want it against the fallback that served, %s", evs[0], list[1])
	}

	// Served outside the answer: the subset allowed only one endpoint.
	only, other := llama.addrs[0], llama.addrs[2]
	if _, err := pk.exchange(t, withHint(reqHeaders(nil, true), listValue(only)), withServed(respHeaders(map[string]string{":status": "200"}, true), other)); err != nil {
		t.Fatal(err)
	}
	if evs := eventsOf(t, n, "vis", 2); evs[1].Backend != other {
		t.Errorf("event %+v: want it against %s, which served", evs[1], other)
	}
	for _, want := range []string{`fleetwatch_epp_served_fallback_total{pool="llama"} 1`, `fleetwatch_epp_served_elsewhere_total{pool="llama"} 1`} {
		if !strings.Contains(pk.metricsText(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	testkit.Eventually(t, 5*time.Second, "no pick in flight", func() bool { return pk.inFlight("llama") == 0 })
}

// LeaveAfterResponseHeaders: the answer to the response headers asks for
// no response body (mode_override) and the stream ends; the outcome is the
// status alone.
func TestLeaveAfterResponseHeaders(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{LeaveAfterResponseHeaders: true, Source: "leave"})
	rs, err := pk.exchange(t, reqHeaders(nil, true), respHeaders(map[string]string{":status": "503"}, false), respBody("late", true))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(rs); got != "RequestHeaders,ResponseHeaders" {
		t.Fatalf("answers %s: want the stream to end at the response headers", got)
	}
	mo := rs[1].GetModeOverride()
	if mo.GetResponseBodyMode() != filterv3.ProcessingMode_NONE || mo.GetResponseTrailerMode() != filterv3.ProcessingMode_SKIP {
		t.Errorf("mode_override %v: want no response body or trailers", mo)
	}
	if evs := eventsOf(t, n, "leave", 1); evs[0].Status != 503 || evs[0].Outcome != fleetwatch.OutcomeError {
		t.Errorf("event %+v: want 503 error from the status alone", evs[0])
	}
	testkit.Eventually(t, 5*time.Second, "no pick in flight", func() bool { return pk.inFlight("llama") == 0 })
}

// PoolHeader routes a request to the pool its header names; without it,
// the served pool. Observability mode: the data plane wants no answers.
func TestPoolHeaderAndObservabilityMode(t *testing.T) {
	n := newNATS(t)
	qwen := testPool{id: "qwen", addrs: []string{"10.9.0.1:8000"}}
	pk := startPicker(t, n, Settings{Pool: "llama", PoolHeader: "x-ai-eg-model"}, llama, qwen)
	rs, err := pk.exchange(t, reqHeaders(map[string]string{"x-ai-eg-model": "qwen"}, true))
	if err != nil || len(rs) != 1 {
		t.Fatal(rs, err)
	}
	if h, _ := destination(rs[0]); h != qwen.addrs[0] {
		t.Errorf("x-ai-eg-model qwen routed to %q", h)
	}
	rs, err = pk.exchange(t, reqHeaders(map[string]string{"x-ai-eg-model": "unknown"}, true))
	if err != nil || len(rs) != 1 {
		t.Fatal(rs, err)
	}
	if h, _ := destination(rs[0]); !strings.Contains(strings.Join(llama.addrs, " "), h) || h == "" {
		t.Errorf("an unknown model routed to %q, want the served pool llama", h)
	}
	m := reqHeaders(nil, true)
	m.ObservabilityMode = true
	if rs, err = pk.exchange(t, m); err != nil || len(rs) != 0 {
		t.Errorf("observability mode: answers %v (%v), want none", rs, err)
	}
}
