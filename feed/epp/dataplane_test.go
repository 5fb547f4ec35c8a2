package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Data plane drivers: each drives the picker over real gRPC the way one
// data plane drives an endpoint picker, as read from its source (no Envoy,
// agentgateway or NGINX Gateway Fabric runs here). A profile says what the
// data plane sends (protocol_config, header encoding, how the body is cut
// and ended, the subset hint, the served endpoint), what it reads back
// (the header or the metadata, one endpoint or a list) and whether it has
// a response phase. dataPlanes in profiles_test.go lists them with their
// sources.

// profile is one data plane's behaviour toward an endpoint picker.
type profile struct {
	name   string
	source string // the files and commits the profile was derived from
	// protocolConfig: the first message carries protocol_config
	// (FULL_DUPLEX_STREAMED both ways).
	protocolConfig bool
	// valueHeaders: header values in value, not raw_value (pseudoValue:
	// only the pseudo headers, such as :status).
	valueHeaders, pseudoValue bool
	// chunk is the size the data plane cuts a body into (0: one message).
	chunk int
	// emptyEnd: the body's last message is an empty end_of_stream chunk.
	emptyEnd bool
	// waitHeaders: the response body is sent only after the response
	// headers were answered.
	waitHeaders bool
	// readMetadata: the endpoint is read from the envoy.lb metadata and a
	// list is walked to the first endpoint the cluster has (override_host);
	// otherwise from the header, which must be exactly one ip:port.
	readMetadata bool
	// hint: the data plane can send a subset hint.
	hint bool
	// served: the response phase reports the served endpoint.
	served bool
	// responsePhase: the data plane shows the picker the response; without
	// it, it half-closes the stream after the body and reads to its end.
	responsePhase bool
}

// upstream is a model server's answer.
type upstream struct {
	status  int
	ctype   string
	chunks  []string
	headers map[string]string
}

// exchangeSpec is one HTTP request a data plane proxies.
type exchangeSpec struct {
	headers map[string]string // without the pseudo headers, which the driver adds
	body    string            // "" for a request without a body
	hint    *structpb.Value   // the subset hint (profiles that send one)
	answer  func(endpoint, body string) upstream
}

// outcome is what the data plane did with the picker's answers.
type outcome struct {
	endpoint    string // where it sent the request; "" when the picker shed it
	forwarded   string // the request body it sent there
	shedCode    int    // the ImmediateResponse's status, when shed
	shedReason  string
	header      string           // the destination header the picker set
	meta        string           // the destination metadata the picker set
	picker      *structpb.Struct // the whole dynamic metadata of the answer
	clientBody  string           // the response body the client got
	respHeaders []*corev3.HeaderValueOption
}

// drive runs one exchange through the picker as p does.
func (p profile) drive(t testing.TB, pk *picker, x exchangeSpec) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := pk.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	answers := make(chan *extprocv3.ProcessingResponse, 1024)
	recvErr := make(chan error, 1)
	go func() { // exits when the stream ends
		for {
			r, err := s.Recv()
			if err != nil {
				close(answers)
				recvErr <- err
				return
			}
			answers <- r
		}
	}()
	d := &driver{t: t, p: p, s: s, answers: answers}
	var out outcome
	d.request(x, &out)
	if out.shedCode == 0 && p.responsePhase {
		d.response(x, &out)
	}
	s.CloseSend()
	for r := range answers {
		t.Errorf("%s: an answer after the exchange: %v", p.name, r)
	}
	if err := <-recvErr; !errors.Is(err, io.EOF) {
		t.Errorf("%s: the stream ended with %v, want a clean end", p.name, err)
	}
	return out
}

// driver is one stream of a profile.
type driver struct {
	t       testing.TB
	p       profile
	s       extprocv3.ExternalProcessor_ProcessClient
	answers <-chan *extprocv3.ProcessingResponse
	first   bool // the first message was sent
}

func (d *driver) send(m *extprocv3.ProcessingRequest) {
	if !d.first && d.p.protocolConfig {
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		}
	}
	d.first = true
	if err := d.s.Send(m); err != nil && !errors.Is(err, io.EOF) {
		d.t.Fatalf("%s: send: %v", d.p.name, err) // io.EOF: the picker ended the stream (a shed); Recv says how
	}
}

func (d *driver) next(what string) *extprocv3.ProcessingResponse {
	d.t.Helper()
	r, ok := <-d.answers
	if !ok {
		d.t.Fatalf("%s: the stream ended while waiting for %s", d.p.name, what)
	}
	return r
}

// headers encodes h as the profile does, with the pseudo headers.
func (d *driver) headers(h map[string]string, pseudo map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	add := func(k, v string, isPseudo bool) {
		if d.p.valueHeaders || (isPseudo && d.p.pseudoValue) {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, Value: v})
		} else {
			m.Headers = append(m.Headers, hv(k, v))
		}
	}
	for k, v := range pseudo {
		add(k, v, true)
	}
	for k, v := range h {
		add(k, v, false)
	}
	return m
}

// cut splits a body as the data plane reads it.
func (d *driver) cut(body string) []string {
	if d.p.chunk <= 0 || len(body) <= d.p.chunk {
		return []string{body}
	}
	var out []string
	for len(body) > 0 {
		n := min(d.p.chunk, len(body))
		out = append(out, body[:n])
		body = body[n:]
	}
	return out
}

// request sends the request phase and reads the picker's answers to it.
func (d *driver) request(x exchangeSpec, out *outcome) {
	h := reqHeadersMsg(d.headers(x.headers, map[string]string{":method": "POST", ":path": "/v1/chat/completions"}), x.body == "")
	if x.hint != nil && d.p.hint {
		withHint(h, x.hint)
	}
	d.send(h)
	if x.body != "" {
		chunks := d.cut(x.body)
		for i, c := range chunks {
			last := i == len(chunks)-1 && !d.p.emptyEnd
			m := reqBody(c, last)
			if x.hint != nil && d.p.hint {
				withHint(m, x.hint) // Envoy forwards the metadata with every message
			}
			d.send(m)
		}
		if d.p.emptyEnd {
			d.send(reqBody("", true))
		}
	}
	if !d.p.responsePhase {
		d.s.CloseSend() // NGF's shim: headers and body, then read to the end
	}
	var body strings.Builder
	for {
		r := d.next("the answer to the request")
		if code, reason, _ := immediate(r); code != 0 {
			out.shedCode, out.shedReason = code, reason
			return
		}
		if r.GetRequestHeaders() != nil {
			out.header, out.meta = destination(r)
			out.picker = r.GetDynamicMetadata()
			if x.body == "" {
				break
			}
			continue
		}
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			d.t.Fatalf("%s: answer %v, want the request body streamed back", d.p.name, r)
		}
		if len(sr.GetBody()) > MaxChunk {
			d.t.Errorf("%s: a body chunk of %d bytes, more than %d", d.p.name, len(sr.GetBody()), MaxChunk)
		}
		body.WriteString(string(sr.GetBody()))
		if sr.GetEndOfStream() {
			break
		}
	}
	out.forwarded = body.String()
	out.endpoint = d.route(out.header, out.meta)
}

// route is where the data plane sends the request, as it reads the answer.
func (d *driver) route(header, meta string) string {
	if d.p.readMetadata { // override_host: the list in order, the first host the cluster has
		for _, e := range strings.Split(meta, ",") {
			if e = strings.TrimSpace(e); e != "" {
				return e
			}
		}
		d.t.Fatalf("%s: no endpoint in the envoy.lb metadata %q", d.p.name, meta)
	}
	if _, _, err := net.SplitHostPort(header); err != nil || strings.Contains(header, ",") {
		d.t.Fatalf("%s: destination header %q: this data plane needs exactly one ip:port (%v)", d.p.name, header, err)
	}
	return header
}

// response sends the model server's answer and reads the picker's answers.
func (d *driver) response(x exchangeSpec, out *outcome) {
	up := x.answer(out.endpoint, out.forwarded)
	hm := d.headers(up.headers, map[string]string{":status": fmt.Sprint(up.status)})
	hm.Headers = append(hm.Headers, hv("content-type", up.ctype))
	m := respHeadersMsg(hm, len(up.chunks) == 0)
	if d.p.served {
		withServed(m, out.endpoint)
	}
	d.send(m)
	if d.p.waitHeaders || len(up.chunks) == 0 {
		out.respHeaders = d.next("the answer to the response headers").GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	}
	if len(up.chunks) == 0 {
		return
	}
	for i, c := range up.chunks {
		d.send(respBody(c, i == len(up.chunks)-1 && !d.p.emptyEnd))
	}
	if d.p.emptyEnd {
		d.send(respBody("", true))
	}
	var body strings.Builder
	for {
		r := d.next("the response body")
		if rh := r.GetResponseHeaders(); rh != nil {
			out.respHeaders = rh.GetResponse().GetHeaderMutation().GetSetHeaders()
			continue
		}
		sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			d.t.Fatalf("%s: answer %v, want the response body streamed back", d.p.name, r)
		}
		body.WriteString(string(sr.GetBody()))
		if sr.GetEndOfStream() {
			break
		}
	}
	out.clientBody = body.String()
}

func reqHeadersMsg(h *corev3.HeaderMap, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: eos},
	}}
}

func respHeadersMsg(h *corev3.HeaderMap, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: eos},
	}}
}

// headerOf returns the value a header mutation sets for key.
func headerOf(hs []*corev3.HeaderValueOption, key string) string {
	i := slices.IndexFunc(hs, func(h *corev3.HeaderValueOption) bool { return h.GetHeader().GetKey() == key })
	if i < 0 {
		return ""
	}
	return string(hs[i].GetHeader().GetRawValue())
}
