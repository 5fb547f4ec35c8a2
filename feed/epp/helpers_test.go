package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// The test harness: every test runs the picker as `fleetwatch epp` runs
// it, on real parts: an embedded NATS server (feedtest), decisions
// published by a scripted publisher the way serve publishes them
// (feedtest.Script: the subject and the KV bucket), a feed Watcher
// applying them to the pick core, the batching OutcomePublisher, and the
// ext_proc server on a loopback gRPC listener, driven by a real gRPC
// client. Outcome events are read back from NATS (testkit.CollectEvents).

// testPool is the pool the tests pick from: its id and its backends'
// addresses (ip:port), each backend named after its address.
type testPool struct {
	id    string
	addrs []string
}

func (p testPool) routePool() route.Pool {
	rp := route.Pool{ID: p.id}
	for _, a := range p.addrs {
		rp.Backends = append(rp.Backends, route.Backend{ID: a, URL: "http://" + a})
	}
	return rp
}

// llama is the default pool: three endpoints, as GIE's and llm-d's tests
// name theirs.
var llama = testPool{id: "llama", addrs: []string{"192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"}}

// natsEnv is a NATS server with a decisions publisher and an event log.
type natsEnv struct {
	url    string
	nc     *nats.Conn
	script *feedtest.Script
	events *testkit.EventLog
}

func newNATS(t testing.TB) *natsEnv {
	t.Helper()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	return &natsEnv{url: url, nc: nc, script: feedtest.NewScript(t, nc, ""), events: testkit.CollectEvents(t, nc)}
}

// picker is one running endpoint picker: a replica of `fleetwatch epp`.
type picker struct {
	srv     *Server
	core    *route.Pools
	set     *metrics.Set
	addr    string
	client  extprocv3.ExternalProcessorClient
	conn    *grpc.ClientConn
	mu      sync.Mutex
	applied map[string]uint64 // pool -> the seq of the last snapshot applied
}

// startPicker runs a picker over pools on n's NATS with s (Pools,
// Publisher, Metrics filled in), serving on a loopback port; everything
// stops in t.Cleanup.
func startPicker(t testing.TB, n *natsEnv, s Settings, pools ...testPool) *picker {
	t.Helper()
	if len(pools) == 0 {
		pools = []testPool{llama}
	}
	var rps []route.Pool
	for _, p := range pools {
		rps = append(rps, p.routePool())
	}
	core, err := route.NewPools(rps, s.Now, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	pk := &picker{core: core, set: metrics.NewSet(), applied: map[string]uint64{}}
	nc := feedtest.Connect(t, n.url)
	if s.Source == "" {
		s.Source = "test-epp"
	}
	events, err := route.NewOutcomePublisher(route.PublisherSettings{
		Subject: fleetwatch.Subjects{}.OutcomesFrom(s.Source), Publish: nc.Publish, Metrics: pk.set, Interval: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Pools, s.Publisher, s.Metrics = core, events, pk.set
	if pk.srv, err = New(s); err != nil {
		t.Fatal(err)
	}
	w, err := feed.NewWatcher(nc, feed.WatcherSettings{Pools: core.IDs(), Metrics: pk.set, OnUpdate: func(snap *fleetwatch.Snapshot) {
		core.Apply(snap)
		pk.mu.Lock()
		pk.applied[snap.Pool] = snap.Seq
		pk.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); events.Run(ctx) }() // exits on cancel
	go func() { defer wg.Done(); w.Run(ctx) }()      // exits on cancel
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pk.srv.Register(g)
	wg.Add(1)
	go func() { defer wg.Done(); g.Serve(ln) }() // exits on Stop
	pk.addr = ln.Addr().String()
	pk.conn, err = grpc.NewClient(pk.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	pk.client = extprocv3.NewExternalProcessorClient(pk.conn)
	t.Cleanup(func() {
		pk.conn.Close()
		g.Stop()
		cancel()
		wg.Wait()
	})
	return pk
}

// publish publishes snap and waits until the picker applied it.
func (pk *picker) publish(t testing.TB, n *natsEnv, snaps ...*fleetwatch.Snapshot) {
	t.Helper()
	n.script.Publish(snaps...)
	for _, snap := range snaps {
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("the picker to apply %s seq %d", snap.Pool, snap.Seq), func() bool {
			pk.mu.Lock()
			defer pk.mu.Unlock()
			return pk.applied[snap.Pool] >= snap.Seq
		})
	}
}

// inFlight is the requests the picker counts in flight on pool's backends.
func (pk *picker) inFlight(pool string) int {
	n := 0
	for _, id := range pk.core.Backends(pool) {
		n += pk.core.Picker(pool).InFlight(id)
	}
	return n
}

// metricsText is the picker's metrics set as /metrics serves it.
func (pk *picker) metricsText() string {
	var b strings.Builder
	pk.set.WritePrometheus(&b)
	return b.String()
}

// exchange sends msgs on a new stream, half-closes it and returns every
// answer until the server ended the stream (read while sending, as a data
// plane reads: a long echoed body must not stall on flow control; bounded
// by a liveness limit).
func (pk *picker) exchange(t testing.TB, msgs ...*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	t.Helper()
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
	go func() { // exits when the stream ends (EOF, error or ctx)
		var res result
		for {
			r, err := s.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					res.err = err
				}
				done <- res
				return
			}
			res.out = append(res.out, r)
		}
	}()
	for _, m := range msgs {
		if s.Send(m) != nil {
			break // the server ended the stream; Recv says why
		}
	}
	s.CloseSend()
	res := <-done
	return res.out, res.err
}

// Messages of the data plane.

// hv is a header as Envoy sends it (raw_value).
func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// headerMap builds a HeaderMap from key, value pairs, sorted by key.
func headerMap(kv map[string]string) *corev3.HeaderMap {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	m := &corev3.HeaderMap{}
	for _, k := range keys {
		m.Headers = append(m.Headers, hv(k, kv[k]))
	}
	return m
}

func reqHeaders(h map[string]string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h), EndOfStream: eos},
	}}
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos},
	}}
}

func respHeaders(h map[string]string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h), EndOfStream: eos},
	}}
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos},
	}}
}

// withHint sets the subset hint v on m's filter metadata.
func withHint(m *extprocv3.ProcessingRequest, v *structpb.Value) *extprocv3.ProcessingRequest {
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: v}},
	}}
	return m
}

// withServed sets the served endpoint on m's metadata context.
func withServed(m *extprocv3.ProcessingRequest, endpoint string) *extprocv3.ProcessingRequest {
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		DestinationNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(endpoint)}},
	}}
	return m
}

func listValue(items ...string) *structpb.Value {
	vs := make([]*structpb.Value, len(items))
	for i, s := range items {
		vs[i] = structpb.NewStringValue(s)
	}
	return structpb.NewListValue(&structpb.ListValue{Values: vs})
}

// Reading the answers.

// destination is the endpoint(s) an answer to the request headers names
// in the header and in the envoy.lb metadata.
func destination(r *extprocv3.ProcessingResponse) (header, meta string) {
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == DestinationKey {
			header = string(h.GetHeader().GetRawValue())
		}
	}
	meta = r.GetDynamicMetadata().GetFields()[DestinationNamespace].GetStructValue().GetFields()[DestinationKey].GetStringValue()
	return header, meta
}

// immediate returns the answer's ImmediateResponse status and its dropped
// reason header (0, "" when it is not one).
func immediate(r *extprocv3.ProcessingResponse) (code int, reason, retryAfter string) {
	ir := r.GetImmediateResponse()
	if ir == nil {
		return 0, "", ""
	}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case DroppedReasonHeader:
			reason = string(h.GetHeader().GetRawValue())
		case "retry-after":
			retryAfter = string(h.GetHeader().GetRawValue())
		}
	}
	return int(ir.GetStatus().GetCode()), reason, retryAfter
}

// echoed concatenates the streamed body chunks of the answers of one
// direction and reports whether the last one ended the body.
func echoed(rs []*extprocv3.ProcessingResponse, request bool) (body string, ended bool, chunks int) {
	var b strings.Builder
	for _, r := range rs {
		var br *extprocv3.BodyResponse
		if request {
			br = r.GetRequestBody()
		} else {
			br = r.GetResponseBody()
		}
		if sr := br.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
			b.Write(sr.GetBody())
			ended = sr.GetEndOfStream()
			chunks++
		}
	}
	return b.String(), ended, chunks
}

// eventsOf waits for n outcome events from source and returns them.
func eventsOf(t testing.TB, n *natsEnv, source string, want int) []fleetwatch.Event {
	t.Helper()
	var got []fleetwatch.Event
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d outcome events from %s", want, source), func() bool {
		got = got[:0]
		for _, ev := range n.events.Events() {
			if ev.Source == source {
				got = append(got, ev)
			}
		}
		return len(got) >= want
	})
	return got
}
