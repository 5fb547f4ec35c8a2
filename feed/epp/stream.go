package epp

import (
	"math/rand/v2"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// bodyMode is how one direction of a stream carries its body.
type bodyMode struct {
	// echo: FULL_DUPLEX_STREAMED, where every body chunk must come back
	// in a StreamedBodyResponse (processing_mode.proto).
	echo bool
	// early: the data plane sends the body without waiting for the
	// headers' answer (FULL_DUPLEX_STREAMED, or
	// send_body_without_waiting_for_header_response), so the answer to the
	// headers may wait for the body's end.
	early bool
}

// modeOf is the body mode of a direction whose protocol_config says m.
func modeOf(m filterv3.ProcessingMode_BodySendMode) bodyMode {
	full := m == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	return bodyMode{echo: full, early: full}
}

// defaultMode is the body mode of a stream that did not say
// (Settings.BodyMode).
func (srv *Server) defaultMode() bodyMode {
	full := srv.bodyMode == BodyFullDuplex
	return bodyMode{echo: full, early: full}
}

// stream is the state of one Process call: one request and its response.
// Only Process's goroutine touches it.
type stream struct {
	srv *Server
	g   extprocv3.ExternalProcessor_ProcessServer
	rng *rand.Rand

	reqMode, respMode bodyMode
	configured        bool // the protocol_config was read (first message only)
	observe           bool // observability_mode: the data plane wants no answers
	closedByPeer      bool // the data plane half-closed the stream

	// The request phase.
	reqHeaders bool          // request headers seen
	reqDone    bool          // the request body (or trailers) ended
	pool       *poolIndex    // the request's pool, once its headers came
	hint       []string      // the subset hint's endpoints
	hinted     bool          // the subset key was present
	deferring  bool          // holding the body for a pick at its end
	held       [][]byte      // the held chunks
	heldBytes  int64         // their size
	pick       *pickState    // the pick, once made
	resp       responseState // the response phase
}

// pickState is one pick: the Choice it holds until the outcome is known,
// and what the data plane was told.
type pickState struct {
	choice    p2c.Choice
	backend   string   // the picked backend (the served one once known)
	endpoints []string // the addresses answered, primary first
	at        time.Time
	prefix    string // the affinity prefix, hex, when the pick had one
	done      bool   // the Choice is finished
}

// handle serves one message; done ends the stream.
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	if pc := req.GetProtocolConfig(); pc != nil && !st.configured {
		st.reqMode, st.respMode = modeOf(pc.GetRequestBodyMode()), modeOf(pc.GetResponseBodyMode())
		st.reqMode.early = st.reqMode.early || pc.GetSendBodyWithoutWaitingForHeaderResponse()
	}
	st.configured = true
	st.observe = req.GetObservabilityMode()
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(req, r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(req, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return st.responseTrailers()
	}
	return false, nil // a message without a phase (flow control): nothing to answer
}

// send sends resp unless the data plane runs in observability mode (it
// ignores answers). A failed send ends the stream.
func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if st.observe {
		return nil
	}
	if err := st.g.Send(resp); err != nil {
		st.srv.metrics.grpcError("send").Inc()
		return err
	}
	return nil
}

// protocolError ends the stream on a message the protocol does not allow
// where it came (a second request headers, a body before its headers, a
// message after the end of its phase): the data plane's stream fails.
func (st *stream) protocolError(what string) (bool, error) {
	st.srv.metrics.grpcError("protocol").Inc()
	return true, status.Errorf(codes.FailedPrecondition, "epp: %s", what)
}

// end finishes what the stream leaves: a pick whose outcome is known by
// the status alone (the data plane closed the stream after the response
// headers, with no body to follow), or else a pick finished as canceled
// and counted unreported.
func (st *stream) end() {
	p := st.pick
	if p == nil || p.done {
		return
	}
	if st.closedByPeer && st.resp.headers && !st.resp.bodySeen {
		st.finish()
		return
	}
	p.choice.Done(fleetwatch.OutcomeCanceled, 0, false)
	p.done = true
	st.srv.metrics.unreported(st.pool.id).Inc()
}

// prefixOf returns the affinity prefix of a held body.
func prefixOf(chunks [][]byte, size int64) (p2c.Request, string) {
	body := make([]byte, 0, size)
	for _, c := range chunks {
		body = append(body, c...)
	}
	_, prefix, has, ok := route.BodyHints(body)
	if !ok || !has {
		return p2c.Request{}, ""
	}
	return p2c.Request{Prefix: prefix, HasPrefix: true}, formatPrefix(prefix)
}
