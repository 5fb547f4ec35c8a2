package epp

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// requestHeaders finds the request's pool and picks now, or, for a pick
// at the end of the body, holds the answer until the body's end.
func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.reqHeaders || st.resp.headers {
		return st.protocolError("request headers after the request started")
	}
	st.reqHeaders = true
	st.readHint(req.GetMetadataContext())
	st.pool = st.srv.poolFor(h.GetHeaders())
	if st.pool == nil {
		return true, st.reject(http.StatusServiceUnavailable, DroppedNoEndpoints, "", "no pool serves this request")
	}
	if h.GetEndOfStream() {
		st.reqDone = true
		return st.pickAndAnswer(p2c.Request{}, "", false, nil)
	}
	if st.srv.prefix && st.reqMode.early {
		st.deferring = true
		return false, nil
	}
	return st.pickAndAnswer(p2c.Request{}, "", false, nil)
}

// requestBody passes a body chunk on: held for a pick at the body's end,
// echoed in FULL_DUPLEX_STREAMED, acknowledged otherwise.
func (st *stream) requestBody(req *extprocv3.ProcessingRequest, b *extprocv3.HttpBody) (bool, error) {
	if !st.reqHeaders || st.reqDone || st.resp.headers {
		return st.protocolError("request body outside the request body phase")
	}
	eos := b.GetEndOfStream()
	st.reqDone = eos
	if st.deferring {
		st.readHint(req.GetMetadataContext())
		st.held = append(st.held, b.GetBody())
		st.heldBytes += int64(len(b.GetBody()))
		switch {
		case eos:
			preq, prefix := prefixOf(st.held, st.heldBytes)
			return st.pickAndAnswer(preq, prefix, true, nil)
		case st.heldBytes > st.srv.maxBody:
			return st.pickAndAnswer(p2c.Request{}, "", false, nil) // too long to hold: no prefix
		}
		return false, nil
	}
	return false, st.passBody(b.GetBody(), eos, true)
}

// requestTrailers answers the request trailers (which also end a held
// body: the data plane sends them instead of an end_of_stream chunk).
func (st *stream) requestTrailers() (bool, error) {
	if !st.reqHeaders || st.resp.headers {
		return st.protocolError("request trailers outside the request")
	}
	st.reqDone = true
	if st.deferring {
		preq, prefix := prefixOf(st.held, st.heldBytes)
		return st.pickAndAnswer(preq, prefix, false, trailersResponse(true))
	}
	return false, st.send(trailersResponse(true))
}

// pickAndAnswer picks the request's backend and answers the request
// headers with it, then the held body (its last chunk ending the body when
// endBody), then after if not nil; or it sheds the request with an
// ImmediateResponse, which ends the stream.
func (st *stream) pickAndAnswer(preq p2c.Request, prefix string, endBody bool, after *extprocv3.ProcessingResponse) (bool, error) {
	st.deferring = false
	pool := st.pool.id
	if st.hinted {
		preq.Among = st.pool.among(st.hint)
		if len(preq.Among) == 0 {
			st.srv.metrics.pick(pool, "no_endpoint").Inc()
			return true, st.reject(http.StatusServiceUnavailable, DroppedNoEndpoints, pool,
				"no endpoint of the subset hint is in the pool")
		}
	}
	t0 := time.Now() // the histogram measures real time, whatever the clock
	choice, err := st.srv.core.Pick(pool, st.rng, preq)
	st.srv.metrics.pickSeconds.UpdateDuration(t0)
	switch {
	case errors.Is(err, p2c.ErrShed) && st.hinted:
		// The protocol's subset rule: no eligible endpoint in the list is
		// a 503, whatever the pool's all_open policy says of the pool.
		st.srv.metrics.pick(pool, "no_endpoint").Inc()
		return true, st.reject(http.StatusServiceUnavailable, DroppedNoEndpoints, pool,
			"every endpoint of the subset hint is open")
	case errors.Is(err, p2c.ErrShed):
		st.srv.metrics.pick(pool, "shed").Inc()
		return true, st.reject(http.StatusTooManyRequests, DroppedSaturated, pool,
			"every backend of the pool is open (all_open=shed)")
	case err != nil:
		st.srv.metrics.pick(pool, "no_endpoint").Inc()
		return true, st.reject(http.StatusServiceUnavailable, DroppedNoEndpoints, pool, err.Error())
	}
	st.srv.metrics.pick(pool, "ok").Inc()
	p := &pickState{choice: choice, backend: choice.Backend, at: st.srv.now(), prefix: prefix}
	p.endpoints = append(p.endpoints, st.srv.core.Address(pool, choice.Backend))
	if n := st.srv.fallbacks; n > 0 {
		for _, id := range st.srv.core.Fallbacks(pool, st.rng, preq, choice.Backend, n, nil) {
			p.endpoints = append(p.endpoints, st.srv.core.Address(pool, id))
		}
	}
	st.pick = p
	if err := st.send(st.destinationResponse(p)); err != nil {
		return true, err
	}
	held := st.held
	st.held, st.heldBytes = nil, 0
	for i, c := range held {
		if err := st.passBody(c, endBody && i == len(held)-1, true); err != nil {
			return true, err
		}
	}
	if after != nil {
		return false, st.send(after)
	}
	return false, nil
}

// destinationResponse is the answer to the request headers: the
// endpoint(s) in the header and, with the same value, in dynamic metadata,
// and the decision visibility when asked.
func (st *stream) destinationResponse(p *pickState) *extprocv3.ProcessingResponse {
	value := strings.Join(p.endpoints, ",")
	lb := map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(value)}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		DestinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: lb}),
	}}
	if st.srv.visMeta {
		md.Fields[VisibilityNamespace] = structpb.NewStructValue(st.srv.whyStruct(st.pool.id, p.backend))
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				ClearRouteCache: true,
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(DestinationKey, value)}},
			},
		}},
		DynamicMetadata: md,
	}
}

// reject sheds the request: an ImmediateResponse with status code, the
// dropped reason, a Retry-After and an OpenAI-style error body.
func (st *stream) reject(code int, reason, pool, msg string) error {
	retry := 1
	if pool != "" {
		retry = st.srv.core.RetryAfter(pool)
	} else {
		pool = "-"
	}
	st.srv.metrics.shed(pool, reason).Inc()
	body := openAIError(code, "epp: pool "+pool+": "+msg)
	return st.send(immediateResponse(code, body,
		setHeader(DroppedReasonHeader, reason),
		setHeader("retry-after", strconv.Itoa(retry)),
		setHeader("content-type", "application/json"),
	))
}

// passBody answers a body chunk of the request (request true) or of the
// response: echoed in chunks of at most MaxChunk in FULL_DUPLEX_STREAMED
// (an empty chunk only to end the body), acknowledged otherwise.
func (st *stream) passBody(body []byte, eos, request bool) error {
	mode := st.respMode
	if request {
		mode = st.reqMode
	}
	if !mode.echo {
		return st.send(bodyAck(request))
	}
	if len(body) == 0 {
		if !eos {
			return nil
		}
		return st.send(bodyChunk(request, nil, true))
	}
	for len(body) > 0 {
		n := min(len(body), MaxChunk)
		if err := st.send(bodyChunk(request, body[:n], eos && n == len(body))); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// poolFor returns the pool of a request: the one PoolHeader names, else
// the served pool (nil when neither is).
func (srv *Server) poolFor(h *corev3.HeaderMap) *poolIndex {
	if srv.poolHeader != "" {
		if v, ok := headerValue(h, srv.poolHeader); ok {
			if id, found := srv.core.ForModel(v); found {
				return srv.pools[id]
			}
		}
	}
	return srv.pool
}

// readHint reads the subset hint from a request message's filter metadata
// (the last message that carries one wins: GIE's integration harness sets
// it on the headers and on the body).
func (st *stream) readHint(md *corev3.Metadata) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return
	}
	st.hinted, st.hint = true, appendEndpoints(st.hint[:0], v)
}

// appendEndpoints appends the endpoints of a subset value: a list of
// strings or a string, each comma separated and trimmed (GIE's
// pkg/lwepp/handlers/request.go reads both forms); anything else adds
// none.
func appendEndpoints(dst []string, v *structpb.Value) []string {
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				dst = append(dst, e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				add(s.StringValue)
			}
		}
	}
	return dst
}

// among returns the backends of the pool that endpoints name: ip:port
// exactly, a bare ip every port of it.
func (ix *poolIndex) among(endpoints []string) []string {
	var ids []string
	for _, e := range endpoints {
		if id := ix.backendAt(e); id != "" {
			ids = append(ids, id)
			continue
		}
		host := strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")
		ids = append(ids, ix.byHost[host]...)
	}
	return ids
}

// formatPrefix is the prefix field of an event, as route writes it.
func formatPrefix(p uint64) string { return strconv.FormatUint(p, 16) }
