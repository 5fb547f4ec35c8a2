// Package epp is fleetwatch's endpoint picker for the Gateway API
// Inference Extension: an Envoy ext_proc v3 gRPC server
// (envoy.service.ext_proc.v3.ExternalProcessor/Process) that an
// InferencePool's endpointPickerRef names, picking each request's endpoint
// from fleetwatch's fleet-wide decisions through the same pick core as
// feed/route (route.Pools: feed/p2c over the decisions, failing static when
// they are stale) and turning the response phase it is shown into outcome
// events, published as route publishes them (route.Publisher).
//
// The protocol is GIE's docs/proposals/004-endpoint-picker-protocol
// (kubernetes-sigs/gateway-api-inference-extension at f540ee91,
// 2026-07-22), over the body send modes of Envoy's ext_proc filter
// (api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto).
// What this server does, and where each rule comes from, is in
// docs/DECISIONS.md "The endpoint picker"; in short:
//
//   - One stream is one HTTP request. The pool is the one this picker
//     serves (Settings.Pool: an EPP serves one InferencePool), or the pool
//     whose id or models a request header names (Settings.PoolHeader).
//   - The pick happens at the request headers, or, when Settings.PrefixFrom
//     is route.PrefixSystem and the data plane streams the body without
//     waiting for the headers' answer (FULL_DUPLEX_STREAMED, or
//     send_body_without_waiting_for_header_response), at the end of the
//     body, so that the system prompt's hash keeps a prefix on its sticky
//     backend exactly as route keeps it.
//   - The subset hint (filter metadata envoy.lb.subset_hint /
//     x-gateway-destination-endpoint-subset, a list or a comma-separated
//     string of ip:port or bare ip) restricts the pick (p2c.Request.Among);
//     an empty hint, or one without an eligible endpoint, is answered
//     ImmediateResponse 503.
//   - The answer is one endpoint by default, in the header
//     x-gateway-destination-endpoint and, with the same value, in dynamic
//     metadata envoy.lb / x-gateway-destination-endpoint; Settings.Fallbacks
//     appends an ordered fallback list to both.
//   - A pool whose every backend is open sheds (all_open=shed):
//     ImmediateResponse 429; no eligible endpoint: 503. Both carry
//     x-llm-d-request-dropped-reason and Retry-After.
//   - In FULL_DUPLEX_STREAMED the body is echoed back in chunks of at most
//     MaxChunk bytes (the mode requires a StreamedBodyResponse for the
//     body); in the other modes each body message is acknowledged without
//     a mutation.
//   - The response phase gives the status (:status), the served endpoint
//     (metadata_context envoy.lb / x-gateway-destination-endpoint-served;
//     the picked one when the data plane does not say), TTFT (the first
//     content event of an SSE answer, else the first body chunk, measured
//     from the pick) and the in-passing stream checks of feed/route; its
//     end finishes the pick's p2c.Choice and publishes one outcome event.
//     An answer served by another endpoint than the one picked finishes the
//     pick as canceled and is reported against the backend that served it.
//
// Server has no goroutine of its own: the gRPC server that serves it (with
// Register) runs Process on a goroutine per stream, and Process returns
// when its stream ends. Health (grpc.health.v1) is registered on the same
// server: liveness always SERVING; readiness, "" and the ext_proc service
// as SetReady says.
package epp
