package epp

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
)

// responseState is what the response phase told so far.
type responseState struct {
	headers    bool      // response headers seen
	done       bool      // the response ended (end_of_stream or trailers)
	bodySeen   bool      // a response body message came
	status     int       // :status; 0 when absent or not a number
	sse        bool      // content-type text/event-stream
	headersAt  time.Time // when the response headers came
	firstByte  time.Time // the first non-empty body chunk
	firstToken time.Time // the first content event of an SSE body
	retryMs    float64   // the wait a 429 or 5xx stated, capped (retryhint.MaxMs)
	quotaMs    float64   // the wait beyond the cap a quota stated
	check      route.StreamCheck
}

// responseHeaders reads the status and the served endpoint, settles the
// pick on the backend that served, and answers (with the visibility
// headers when asked). With LeaveAfterResponseHeaders, or when no body
// follows, the outcome is final here.
func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.resp.headers {
		return st.protocolError("a second response headers")
	}
	r := &st.resp
	r.headers, r.headersAt = true, st.srv.now()
	hm := h.GetHeaders()
	if v, ok := headerValue(hm, ":status"); ok {
		r.status, _ = strconv.Atoi(strings.TrimSpace(v))
	}
	if v, ok := headerValue(hm, "content-type"); ok {
		r.sse = strings.HasPrefix(strings.TrimSpace(strings.ToLower(v)), "text/event-stream")
	}
	if r.status == http.StatusTooManyRequests || r.status >= 500 {
		hint := retryhint.Parse(r.status, func(k string) string { v, _ := headerValue(hm, k); return v }, nil, r.headersAt)
		r.retryMs, r.quotaMs = hint.Ms, hint.QuotaMs
	}
	if st.pick != nil && !st.pick.done {
		st.settleServed(servedEndpoint(req.GetMetadataContext()))
	}
	resp := &extprocv3.CommonResponse{}
	if st.srv.visHeaders && st.pick != nil && !st.pick.done {
		resp.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: st.srv.whyHeaders(st.pool.id, st.pick.backend)}
	}
	answer := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: resp},
	}}
	leave := st.srv.leave
	if leave {
		answer.ModeOverride = &filterv3.ProcessingMode{
			ResponseBodyMode:    filterv3.ProcessingMode_NONE,
			ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
		}
	}
	if err := st.send(answer); err != nil {
		return true, err
	}
	if leave || h.GetEndOfStream() {
		r.done = true
		st.finish()
	}
	return leave, nil
}

// responseBody times the first byte and first token, checks an SSE stream
// in passing, passes the chunk on, and finishes at the body's end.
func (st *stream) responseBody(b *extprocv3.HttpBody) (bool, error) {
	r := &st.resp
	if !r.headers || r.done {
		return st.protocolError("response body outside the response body phase")
	}
	r.bodySeen = true
	chunk := b.GetBody()
	if len(chunk) > 0 {
		now := st.srv.now()
		if r.firstByte.IsZero() {
			r.firstByte = now
		}
		if r.sse && r.check.Scan(chunk) > 0 && r.firstToken.IsZero() {
			r.firstToken = now
		}
	}
	if err := st.passBody(chunk, b.GetEndOfStream(), false); err != nil {
		return true, err
	}
	if b.GetEndOfStream() {
		r.done = true
		st.finish()
	}
	return false, nil
}

// responseTrailers end the response.
func (st *stream) responseTrailers() (bool, error) {
	if !st.resp.headers || st.resp.done {
		return st.protocolError("response trailers outside the response")
	}
	st.resp.done = true
	st.finish()
	return false, st.send(trailersResponse(false))
}

// settleServed moves the pick to the backend that served the request when
// the data plane reports another endpoint than the one picked: the pick's
// Choice is finished as canceled and the served backend takes the request
// in flight (a fallback of the answer's list, or elsewhere: the data plane
// did not follow the pick). An endpoint outside the pool leaves nothing to
// report against: the pick is finished and the outcome dropped.
func (st *stream) settleServed(served string) {
	p := st.pick
	if served == "" || served == p.endpoints[0] {
		return
	}
	if host, port, err := net.SplitHostPort(served); err == nil && net.JoinHostPort(host, port) == p.endpoints[0] {
		return
	}
	pool := st.pool.id
	id := st.pool.backendAt(served)
	if slices.Contains(p.endpoints[1:], served) {
		st.srv.metrics.servedFallback(pool).Inc()
	} else {
		st.srv.metrics.servedElsewhere(pool).Inc()
	}
	p.choice.Done(fleetwatch.OutcomeCanceled, 0, false)
	if id == "" {
		st.srv.logf("epp: pool %s: the data plane served %s, which is not a backend of the pool; its outcome is not reported", pool, served)
		p.done = true
		st.srv.metrics.unreported(pool).Inc()
		return
	}
	choice, err := st.srv.core.Choose(pool, id)
	if err != nil {
		p.done = true
		st.srv.metrics.unreported(pool).Inc()
		return
	}
	p.choice, p.backend = choice, id
}

// finish reports the pick's outcome: the Choice is done with it and one
// outcome event is published.
func (st *stream) finish() {
	p := st.pick
	if p == nil || p.done {
		return
	}
	p.done = true
	r := &st.resp
	end := st.srv.now()
	ev := fleetwatch.Event{
		Pool: st.pool.id, Backend: p.backend, TS: end,
		Status: r.status, HasStatus: true, Outcome: fleetwatch.OutcomeFromStatus(r.status),
		RetryAfterMs: r.retryMs, QuotaResetMs: r.quotaMs, Prefix: p.prefix, Source: st.srv.source,
	}
	if r.sse && ev.Outcome == fleetwatch.OutcomeOK && r.bodySeen {
		if ev.StreamError = r.check.Error(); ev.StreamError != "" {
			ev.Outcome = fleetwatch.OutcomeError // a 200 stream that failed on its way
			st.srv.metrics.streamError(ev.Pool, ev.Backend, ev.StreamError).Inc()
		}
	}
	first := r.firstByte
	if r.sse {
		first = r.firstToken
	}
	switch {
	case !first.IsZero():
	case !r.sse || ev.Outcome != fleetwatch.OutcomeOK:
		first = r.headersAt
	}
	if !first.IsZero() {
		ev.TTFTMs, ev.HasTTFT = ms(first.Sub(p.at)), true
	}
	ev.DurationMs, ev.HasDuration = ms(end.Sub(p.at)), true
	if r.sse {
		ev.OutputTokens = r.check.ContentEvents()
	}
	p.choice.Done(ev.Outcome, ev.TTFTMs, false)
	st.srv.metrics.outcome(ev.Pool, ev.Status).Inc()
	if st.srv.events != nil {
		st.srv.events.Publish(ev)
	}
}

// servedEndpoint is the endpoint the data plane reports it served
// (metadata_context envoy.lb / x-gateway-destination-endpoint-served), ""
// when it does not say.
func servedEndpoint(md *corev3.Metadata) string {
	ns := md.GetFilterMetadata()[DestinationNamespace]
	if ns == nil {
		return ""
	}
	var eps []string
	if v, ok := ns.GetFields()[ServedKey]; ok {
		eps = appendEndpoints(eps, v)
	}
	if len(eps) == 0 {
		return ""
	}
	return eps[0]
}

func ms(d time.Duration) float64 {
	v := float64(d) / float64(time.Millisecond)
	return min(max(v, 0), fleetwatch.MaxDurationMs)
}
