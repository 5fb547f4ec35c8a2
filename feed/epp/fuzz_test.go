package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// FuzzMessageSequences sends arbitrary sequences of ext_proc messages
// (request and response headers, bodies and trailers in any order, any
// end_of_stream flags, empty messages, protocol_config, garbage subset and
// served metadata, observability mode) over a real gRPC stream, then
// half-closes it. The picker must never panic (a panic kills the test
// binary), must end every stream (an answer or a close, within a liveness
// bound), must leave nothing in flight once the stream ended (every pick's
// Choice finished), must never finish a Choice twice, and every
// destination it answers must say the same thing in the header and in the
// metadata.
func FuzzMessageSequences(f *testing.F) {
	n := newNATS(f)
	pk := startPicker(f, n, Settings{PrefixFrom: route.PrefixSystem, Fallbacks: 1, Visibility: VisibilityBoth, MaxBody: 4096})
	now := time.Now()
	pk.publish(f, n, feedtest.Snapshot("llama", "e1", 1, now,
		feedtest.Closed(llama.addrs[0]), feedtest.Open(llama.addrs[1], now.Add(time.Hour), "x"), feedtest.Closed(llama.addrs[2])))
	for _, seed := range [][]byte{
		{0, 1}, // header-only
		{0, 0, 1, 40, 1, 41, 3, 52, 4, 80, 4, 81}, // full duplex, both phases, a 2xx SSE answer
		{3, 0, 4, 20, 4, 1},                       // response only
		{0x08, 0, 1, 0xff, 2, 0},                  // hinted, a long body, trailers
		{0x40, 0, 1, 3, 0x13, 50, 4, 1},           // protocol_config, served by another backend of the pool
		{0, 1, 0x13, 51},                          // served by an endpoint outside the pool
		{6, 0, 0x20, 1, 0, 1, 1, 1},               // empty message, observability, headers twice
		{4, 1, 1, 1, 5, 0, 2, 0},                  // everything out of order
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs := decodeSequence(data)
		answers, err := runSequence(pk, msgs)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the stream did not end after the data plane half-closed it (%d messages)", len(msgs))
		}
		for _, r := range answers {
			if r.GetRequestHeaders() != nil {
				if h, m := destination(r); h != m || h == "" {
					t.Fatalf("destination header %q, metadata %q", h, m)
				}
			}
		}
		if got := pk.inFlight("llama"); got != 0 {
			t.Fatalf("%d picks left in flight after the stream ended (%d messages, stream error %v)", got, len(msgs), err)
		}
		if u := pk.core.Picker("llama").UnbalancedDone(); u != 0 {
			t.Fatalf("%d Choices finished twice", u)
		}
	})
}

// runSequence sends msgs, half-closes, and reads to the stream's end.
func runSequence(pk *picker, msgs []*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := pk.client.Process(ctx)
	if err != nil {
		return nil, err
	}
	type result struct {
		out []*extprocv3.ProcessingResponse
		err error
	}
	done := make(chan result, 1)
	go func() { // exits at the stream's end
		var res result
		for {
			r, err := s.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					res.err = err
				}
				if ctx.Err() != nil {
					res.err = ctx.Err()
				}
				done <- res
				return
			}
			res.out = append(res.out, r)
		}
	}()
	for _, m := range msgs {
		if s.Send(m) != nil {
			break
		}
	}
	s.CloseSend()
	res := <-done
	return res.out, res.err
}

// decodeSequence turns fuzz bytes into at most 32 messages: each message
// is an op byte (low 3 bits the kind; 0x08 a garbage subset hint, 0x10 a
// served endpoint, 0x20 observability mode, 0x40 protocol_config) and an
// argument byte (bit 0 end_of_stream, the rest a size or a status).
func decodeSequence(data []byte) []*extprocv3.ProcessingRequest {
	var msgs []*extprocv3.ProcessingRequest
	for len(data) >= 2 && len(msgs) < 32 {
		op, arg := data[0], data[1]
		data = data[2:]
		eos := arg&1 != 0
		size := int(arg>>1) * 41
		if arg == 0xff {
			size = 200 << 10
		}
		var m *extprocv3.ProcessingRequest
		switch op & 7 {
		case 0:
			m = reqHeaders(map[string]string{":path": "/v1/chat/completions", "x-n": fmt.Sprint(arg)}, eos)
		case 1:
			m = reqBody(chatBody(size), eos)
		case 2:
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
		case 3:
			ct := "application/json"
			if arg&2 != 0 {
				ct = "text/event-stream"
			}
			m = respHeaders(map[string]string{":status": fmt.Sprint(100 + int(arg)*2), "content-type": ct}, eos)
		case 4:
			event := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
			m = respBody(strings.Repeat(event, size/len(event)+1)[:size], eos)
		case 5:
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
		default:
			m = &extprocv3.ProcessingRequest{} // no phase at all
		}
		if op&0x08 != 0 {
			withHint(m, garbage(arg))
		}
		if op&0x10 != 0 {
			served := []string{llama.addrs[2], "10.9.9.9:1", "not an endpoint", "[::1]:8000", ""}[int(arg)%5]
			if m.MetadataContext == nil {
				m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
			}
			m.MetadataContext.FilterMetadata[DestinationNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(served)}}
		}
		m.ObservabilityMode = op&0x20 != 0
		if op&0x40 != 0 {
			modes := []filterv3.ProcessingMode_BodySendMode{0, 1, 2, 3, 4, 5, 77}
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(arg)%7], ResponseBodyMode: modes[int(arg>>3)%7],
				SendBodyWithoutWaitingForHeaderResponse: arg&0x80 != 0}
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// garbage is a subset hint value of every shape a data plane might send.
func garbage(arg byte) *structpb.Value {
	switch arg % 7 {
	case 0:
		return structpb.NewNumberValue(float64(arg))
	case 1:
		return structpb.NewBoolValue(true)
	case 2:
		return listValue(llama.addrs[int(arg)%3], " , ", "[::1]", "192.168.1.1")
	case 3:
		return structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNullValue(), structpb.NewNumberValue(1)}})
	case 4:
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue(llama.addrs[0])}})
	case 5:
		return structpb.NewStringValue(strings.Repeat(",", int(arg)))
	}
	return listValue()
}
