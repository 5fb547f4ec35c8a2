package epp

import (
	"encoding/json"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch/feed/route"
)

// The ext_proc messages the server sends, and what it reads of the ones
// it receives.

// The response headers of the decision visibility (Settings.Visibility)
// are route's (route.Why.SetHeaders) and the pick endpoint's
// HeaderBackend, lowercased as HTTP/2 carries them.
var (
	visBackend = strings.ToLower(HeaderBackend)
	visState   = strings.ToLower(route.HeaderState)
	visWeight  = strings.ToLower(route.HeaderWeight)
	visReason  = strings.ToLower(route.HeaderReasonClass)
	visAge     = strings.ToLower(route.HeaderDecisionAge)
)

// setHeader is a header mutation that sets key to value, replacing what
// the request carried: a client's own x-gateway-destination-endpoint must
// not reach the data plane's load balancer beside the pick.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// headerValue returns the value of header key (case-insensitive; the
// raw_value, or the value when the data plane sent that: Envoy fills the
// first, agentgateway the second for pseudo headers such as :status).
func headerValue(h *corev3.HeaderMap, key string) (string, bool) {
	for _, hv := range h.GetHeaders() {
		if strings.EqualFold(hv.GetKey(), key) {
			if raw := hv.GetRawValue(); len(raw) > 0 {
				return string(raw), true
			}
			return hv.GetValue(), true
		}
	}
	return "", false
}

// immediateResponse answers the request at once with code, body and
// headers; the data plane sends it to the client and ends the request.
func immediateResponse(code int, body []byte, headers ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    body,
		},
	}}
}

// openAIError is an OpenAI-style error body, as route answers its own
// errors.
func openAIError(code int, msg string) []byte {
	typ := "service_unavailable"
	if code == 429 {
		typ = "rate_limit_exceeded"
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
	return b
}

// bodyAck acknowledges a body chunk without changing it (every body mode
// but FULL_DUPLEX_STREAMED).
func bodyAck(request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// bodyChunk passes a body chunk on in FULL_DUPLEX_STREAMED.
func bodyChunk(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos},
		}},
	}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// trailersResponse answers trailers without changing them.
func trailersResponse(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{},
		}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{},
	}}
}

// whyStruct is the decision visibility as dynamic metadata (namespace
// VisibilityNamespace).
func (srv *Server) whyStruct(pool, backend string) *structpb.Struct {
	w := srv.core.Why(pool, backend)
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"backend":        structpb.NewStringValue(backend),
		"state":          structpb.NewStringValue(string(w.State)),
		"weight":         structpb.NewNumberValue(w.Weight),
		"reason_class":   structpb.NewStringValue(w.Class),
		"decision_age_s": structpb.NewNumberValue(w.AgeSeconds()),
	}}
}

// whyHeaders is the decision visibility as response headers.
func (srv *Server) whyHeaders(pool, backend string) []*corev3.HeaderValueOption {
	w := srv.core.Why(pool, backend)
	return whyHeaderList(backend, w)
}

func whyHeaderList(backend string, w route.Why) []*corev3.HeaderValueOption {
	return []*corev3.HeaderValueOption{
		setHeader(visBackend, backend),
		setHeader(visState, string(w.State)),
		setHeader(visWeight, strconv.FormatFloat(w.Weight, 'f', -1, 64)),
		setHeader(visReason, w.Class),
		setHeader(visAge, strconv.FormatFloat(w.AgeSeconds(), 'f', -1, 64)),
	}
}
