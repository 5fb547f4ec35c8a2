package epp

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fleetwatch/fleetwatch/feed/route"
)

// Names of the protocol (GIE docs/proposals/004-endpoint-picker-protocol
// at f540ee91; the dropped-reason header is llm-d-router's,
// pkg/common/error/error.go at ebab6879).
const (
	// SubsetNamespace and SubsetKey carry the data plane's subset hint in
	// the request's filter metadata.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// DestinationNamespace is the dynamic metadata namespace of the
	// picked endpoint (DestinationKey) and of the served one (ServedKey,
	// in the response phase's metadata_context).
	DestinationNamespace = "envoy.lb"
	// DestinationKey is the header and metadata key of the picked
	// endpoint(s).
	DestinationKey = "x-gateway-destination-endpoint"
	// ServedKey is the metadata key of the endpoint that served.
	ServedKey = "x-gateway-destination-endpoint-served"
	// DroppedReasonHeader says why a request was shed.
	DroppedReasonHeader = "x-llm-d-request-dropped-reason"
	// VisibilityNamespace is the dynamic metadata namespace of the
	// decision visibility (Settings.Visibility).
	VisibilityNamespace = "fleetwatch"
	// ExtProcService is the ext_proc service's name, also a health service.
	ExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor"
	// Health services besides ExtProcService (and "", which follows
	// readiness, as llm-d-router's cmd/epp/runner/health.go answers it).
	LivenessService  = "liveness"
	ReadinessService = "readiness"
)

// MaxChunk is the largest body chunk the server sends back: GIE's
// BodyByteLimit (pkg/common/envoy/chunking.go), a margin under the 64 KiB
// per chunk that processing_mode.proto recommends and some data planes cap.
const MaxChunk = 62000

// Dropped reasons (DroppedReasonHeader), in llm-d-router's vocabulary.
const (
	// DroppedNoEndpoints: no endpoint can take the request (503).
	DroppedNoEndpoints = "rejected-no-endpoints"
	// DroppedSaturated: every backend's breaker is open and the pool
	// sheds (429).
	DroppedSaturated = "rejected-saturated"
)

// BodyMode is the ext_proc body send mode the server assumes for a stream
// whose first message carries no protocol_config (Envoy and agentgateway
// send one; older data planes do not).
type BodyMode string

// Body modes (Settings.BodyMode).
const (
	BodyFullDuplex = BodyMode("full_duplex_streamed")
	BodyStreamed   = BodyMode("streamed")
	BodyBuffered   = BodyMode("buffered")
	BodyNone       = BodyMode("none")
)

// Visibility says where the decision that chose a backend is shown
// (docs/INTEGRATIONS.md "Decision visibility").
type Visibility string

// Visibility values (Settings.Visibility).
const (
	VisibilityOff      = Visibility("off")
	VisibilityMetadata = Visibility("metadata") // dynamic metadata, namespace "fleetwatch"
	VisibilityHeaders  = Visibility("headers")  // X-Fleetwatch-* response headers
	VisibilityBoth     = Visibility("both")
)

// DefaultSource is Settings.Source's default.
const DefaultSource = "epp"

// ErrConfig: New was given Settings it cannot use.
var ErrConfig = errors.New("epp: invalid settings")

// Settings configure a Server. Pools is required.
type Settings struct {
	// Pools is the pick core the server picks through, shared with the
	// process's other front ends; its pickers follow the decisions
	// (route.Pools.Apply). Required.
	Pools *route.Pools
	// Pool is the pool this picker serves (an EPP serves one
	// InferencePool). If empty, the only pool of Pools; with several pools
	// and no PoolHeader, New fails.
	Pool string
	// PoolHeader, if set, is a request header whose value names the pool
	// of a request (a pool id or one of its models, as route.Pools.ForModel
	// finds it; Envoy AI Gateway sets x-ai-eg-model from the body's
	// model). A request without it, or naming no pool, goes to Pool.
	PoolHeader string
	// Publisher receives one outcome event per request whose response
	// phase the server saw. If nil, events are not published.
	Publisher route.Publisher
	// Source is this picker's id: the source field of its events. If
	// empty, DefaultSource.
	Source string
	// Fallbacks is how many endpoints follow the picked one in the
	// answer, an ordered fallback list for data planes that walk it on
	// retries (Envoy's override_host). If zero, one endpoint: several data
	// planes take only the first value or reject a list.
	Fallbacks int
	// PrefixFrom is route.PrefixNone (pick at the request headers) or
	// route.PrefixSystem (pick at the end of the body where the data plane
	// allows it, with the affinity prefix of the system prompt). If empty,
	// route.PrefixNone.
	PrefixFrom string
	// BodyMode is the body send mode assumed for both directions of a
	// stream whose first message has no protocol_config. If empty,
	// BodyFullDuplex (the mode the protocol requires an EPP to support).
	BodyMode BodyMode
	// MaxBody bounds the request body held for a pick at the end of the
	// body; a longer body is picked without a prefix and passed on. If
	// zero, route.DefaultMaxBody.
	MaxBody int64
	// Visibility shows the decision behind the chosen backend (state,
	// weight, reason class, decision age). If empty, VisibilityOff.
	Visibility Visibility
	// LeaveAfterResponseHeaders makes the server end each stream once it
	// answered the response headers (asking the data plane, through
	// mode_override, to send no response body): the outcome is the status
	// alone.
	LeaveAfterResponseHeaders bool
	// Metrics receives the fleetwatch_epp_* series (metrics.go). If nil, a
	// private set.
	Metrics *metrics.Set
	// Now is the clock of events and TTFT. If nil, time.Now.
	Now func() time.Time
	// Seed seeds the per-stream random sources of the picks. If zero, a
	// random seed.
	Seed uint64
	// Logf receives operational messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
}

// Server is the endpoint picker. It is safe for concurrent use: every
// stream has its own state.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	core       *route.Pools
	pool       *poolIndex // Settings.Pool's; nil with PoolHeader only
	pools      map[string]*poolIndex
	poolHeader string
	events     route.Publisher
	source     string
	fallbacks  int
	prefix     bool // PrefixFrom == route.PrefixSystem
	bodyMode   BodyMode
	maxBody    int64
	visMeta    bool
	visHeaders bool
	leave      bool
	now        func() time.Time
	logf       func(string, ...any)
	metrics    *eppMetrics
	health     *health.Server
	ready      atomic.Bool
	rngs       sync.Pool // *rand.Rand: a p2c.Rand per stream
}

// New returns a Server over s.Pools; it starts nothing.
func New(s Settings) (*Server, error) {
	if s.Pools == nil {
		return nil, fmt.Errorf("%w: no pools", ErrConfig)
	}
	srv := &Server{
		core: s.Pools, poolHeader: s.PoolHeader, events: s.Publisher, source: s.Source,
		fallbacks: s.Fallbacks, bodyMode: s.BodyMode, maxBody: s.MaxBody, leave: s.LeaveAfterResponseHeaders,
		now: s.Now, logf: s.Logf, pools: map[string]*poolIndex{},
	}
	if err := srv.withDefaults(s); err != nil {
		return nil, err
	}
	for _, id := range s.Pools.IDs() {
		srv.pools[id] = newPoolIndex(s.Pools, id)
	}
	pool := s.Pool
	if ids := s.Pools.IDs(); pool == "" && len(ids) == 1 {
		pool = ids[0]
	}
	switch {
	case pool != "" && srv.pools[pool] == nil:
		return nil, fmt.Errorf("%w: Pool %q is not one of the pools %v", ErrConfig, pool, s.Pools.IDs())
	case pool == "" && s.PoolHeader == "":
		return nil, fmt.Errorf("%w: several pools %v: name the one this picker serves (Pool) or a PoolHeader", ErrConfig, s.Pools.IDs())
	}
	srv.pool = srv.pools[pool]
	seed := s.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	var n atomic.Uint64
	srv.rngs.New = func() any { return rand.New(rand.NewPCG(seed, n.Add(1))) }
	srv.metrics = newMetrics(s.Metrics)
	srv.health = health.NewServer()
	srv.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	srv.SetReady(false)
	return srv, nil
}

// withDefaults checks s's knobs and sets the defaults of those unset.
func (srv *Server) withDefaults(s Settings) error {
	switch s.PrefixFrom {
	case "", route.PrefixNone:
	case route.PrefixSystem:
		srv.prefix = true
	default:
		return fmt.Errorf("%w: PrefixFrom = %q: want %q or %q", ErrConfig, s.PrefixFrom, route.PrefixSystem, route.PrefixNone)
	}
	switch srv.bodyMode {
	case "":
		srv.bodyMode = BodyFullDuplex
	case BodyFullDuplex, BodyStreamed, BodyBuffered, BodyNone:
	default:
		return fmt.Errorf("%w: BodyMode = %q: want %s, %s, %s or %s", ErrConfig, s.BodyMode, BodyFullDuplex, BodyStreamed, BodyBuffered, BodyNone)
	}
	switch s.Visibility {
	case "", VisibilityOff:
	case VisibilityMetadata:
		srv.visMeta = true
	case VisibilityHeaders:
		srv.visHeaders = true
	case VisibilityBoth:
		srv.visMeta, srv.visHeaders = true, true
	default:
		return fmt.Errorf("%w: Visibility = %q: want off, metadata, headers or both", ErrConfig, s.Visibility)
	}
	if s.Fallbacks < 0 {
		return fmt.Errorf("%w: Fallbacks = %d: must be >= 0", ErrConfig, s.Fallbacks)
	}
	if srv.maxBody <= 0 {
		srv.maxBody = route.DefaultMaxBody
	}
	if srv.source == "" {
		srv.source = DefaultSource
	}
	if srv.now == nil {
		srv.now = time.Now
	}
	if srv.logf == nil {
		srv.logf = func(string, ...any) {}
	}
	return nil
}

// Pool is the pool this picker serves ("" when it serves by PoolHeader
// only).
func (srv *Server) Pool() string {
	if srv.pool == nil {
		return ""
	}
	return srv.pool.id
}

// Pools returns the pools whose decisions readiness waits for: the
// served pool, or every pool when the server serves by PoolHeader only.
func (srv *Server) Pools() []string {
	if srv.pool != nil {
		return []string{srv.pool.id}
	}
	return srv.core.IDs()
}

// Register registers the ext_proc service and the gRPC health service on
// g (one port for both, as the protocol's health checking expects).
func (srv *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, srv)
	healthpb.RegisterHealthServer(g, srv.health)
}

// SetReady sets the readiness services (readiness, "" and the ext_proc
// service) SERVING or NOT_SERVING; liveness stays SERVING. The assembly
// sets it ready once the pool's first decision arrived (or its wait for
// one timed out) while NATS is connected, and not ready again when NATS
// goes away or the process drains.
func (srv *Server) SetReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	srv.ready.Store(ready)
	for _, svc := range []string{ReadinessService, "", ExtProcService} {
		srv.health.SetServingStatus(svc, st)
	}
}

// Ready reports what SetReady last set.
func (srv *Server) Ready() bool { return srv.ready.Load() }

// Process serves one ext_proc stream: one HTTP request and its response.
func (srv *Server) Process(g extprocv3.ExternalProcessor_ProcessServer) error {
	rng := srv.rngs.Get().(*rand.Rand)
	defer srv.rngs.Put(rng)
	st := &stream{srv: srv, g: g, rng: rng, reqMode: srv.defaultMode(), respMode: srv.defaultMode()}
	defer st.end()
	for {
		req, err := g.Recv()
		if err == io.EOF {
			st.closedByPeer = true
			return nil
		}
		if err != nil {
			if status.Code(err) != codes.Canceled {
				srv.metrics.grpcError("recv").Inc()
			}
			return err
		}
		done, err := st.handle(req)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// poolIndex is one pool's endpoints as data planes name them: the
// host:port of each configured backend, and the backends of each host (a
// subset hint may name a bare IP: every port of it).
type poolIndex struct {
	id     string
	byAddr map[string]string   // host:port -> backend id
	byHost map[string][]string // host -> backend ids
}

func newPoolIndex(ps *route.Pools, pool string) *poolIndex {
	ix := &poolIndex{id: pool, byAddr: map[string]string{}, byHost: map[string][]string{}}
	for _, id := range ps.Backends(pool) {
		addr := ps.Address(pool, id)
		if _, dup := ix.byAddr[addr]; !dup {
			ix.byAddr[addr] = id
		}
		if host, _, err := net.SplitHostPort(addr); err == nil {
			ix.byHost[host] = append(ix.byHost[host], id)
		}
	}
	return ix
}

// backendAt returns the backend at endpoint (ip:port, in any of the forms
// net.SplitHostPort reads), "" when none is.
func (ix *poolIndex) backendAt(endpoint string) string {
	if id, ok := ix.byAddr[endpoint]; ok {
		return id
	}
	if host, port, err := net.SplitHostPort(endpoint); err == nil {
		return ix.byAddr[net.JoinHostPort(host, port)]
	}
	return ""
}
