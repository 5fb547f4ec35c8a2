package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/router"
	"github.com/fleetwatch/fleetwatch/internal/serve"
)

// The peers benchmark: real balancers side by side on the same real
// traffic. Four fake OpenAI-compatible backends (internal/fakeai) sit
// behind four balancers at once: fleetwatch's router (feed/route, fed by
// serve's analyzer over an embedded NATS server, as `fleetwatch route` and
// `fleetwatch serve` run it), HAProxy (balance leastconn, observe layer7,
// on-error mark-down), the same HAProxy with L7 retries, and nginx
// (least_conn, max_fails). One load generator
// sends every request to each balancer at the same instant, through one
// incident script: a healthy phase, then one backend failing fast with
// 500s, then another answering 429, then a third stalling (accepting and
// never answering). Each backend counts the attempts of each balancer (the
// load generator tags requests with a header the balancers pass on), so
// the broken backend's share of attempts is measured per balancer.

// Balancer names, in report order.
const (
	PeerFleetwatch = "fleetwatch route"
	PeerHAProxy    = "HAProxy"
	// PeerHAProxyRetry is HAProxy with L7 retries (retry-on) as well: its
	// retries hide the 5xx answers from observe layer7, which then never
	// marks the failing server down.
	PeerHAProxyRetry = "HAProxy + L7 retries"
	PeerNginx        = "nginx"
)

var peerNames = []string{PeerFleetwatch, PeerHAProxy, PeerHAProxyRetry, PeerNginx}

// balancerHeader and phaseHeader tag each request with the index of the
// balancer it was sent to and of the phase it was sent in, so the backends
// count each attempt for its balancer and its request's phase (a retry
// that reaches a backend after the phase changed still counts for it).
const (
	balancerHeader = "X-Bench-Balancer"
	phaseHeader    = "X-Bench-Phase"
)

// peerModel is the model (and the pool id) of the benchmark.
const peerModel = "bench"

// PeersSettings configure RunPeers. The zero value runs the full script
// (four phases of 30 s) against /usr/sbin/haproxy and /usr/sbin/nginx.
type PeersSettings struct {
	// HAProxy and Nginx are the binaries. If empty, /usr/sbin/haproxy and
	// /usr/sbin/nginx.
	HAProxy, Nginx string
	// Phase is the length of each of the four phases. If zero, 30s.
	Phase time.Duration
	// Rate is the requests per second sent to each balancer. If zero, 20.
	Rate float64
	// FirstByte is the time every balancer gives a backend to start
	// answering: fleetwatch's route.stall_floor, HAProxy's timeout server,
	// nginx's proxy_read_timeout. If zero, 10s (route's default floor).
	FirstByte time.Duration
	// ClientTimeout is the load generator's timeout per request. If zero,
	// 30s.
	ClientTimeout time.Duration
	// Routers is the number of instances of each balancer (the fleet
	// scale): N nginx and N HAProxy processes that each learn alone, N
	// fleetwatch routers sharing one serve; the load generator spreads each
	// balancer's requests over its N instances in turn. If zero, 1.
	Routers int
	// Logf receives progress messages. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Portkey is the start script of Portkey's open-source gateway (see
	// PortkeyScript), run as a fifth balancer under node; empty: not run.
	// Node is the node binary; if empty, "node" on the PATH.
	Portkey, Node string
	// Config is the configuration fleetwatch's serve and routers start
	// from (its analyzer and route blocks); the benchmark sets the NATS,
	// HTTP, data, probes and pool parts. If nil, config.Default().
	Config *config.Config
}

func (s PeersSettings) withDefaults() PeersSettings {
	if s.HAProxy == "" {
		s.HAProxy = "/usr/sbin/haproxy"
	}
	if s.Nginx == "" {
		s.Nginx = "/usr/sbin/nginx"
	}
	if s.Phase <= 0 {
		s.Phase = 30 * time.Second
	}
	if s.Rate <= 0 {
		s.Rate = 20
	}
	if s.FirstByte <= 0 {
		s.FirstByte = 10 * time.Second
	}
	if s.ClientTimeout <= 0 {
		s.ClientTimeout = 30 * time.Second
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.Routers <= 0 {
		s.Routers = 1
	}
	if s.Node == "" {
		s.Node = "node"
	}
	return s
}

// peerPhase is one phase of the incident script: broken is the backend
// that misbehaves (-1: none) and how.
type peerPhase struct {
	name   string
	broken int
	break_ func(fakeai.Behavior) fakeai.Behavior
}

var peerPhases = []peerPhase{
	{name: "healthy", broken: -1},
	{name: "b1 fails fast (500)", broken: 1, break_: func(b fakeai.Behavior) fakeai.Behavior { b.InstantError = true; return b }},
	{name: "b2 answers 429", broken: 2, break_: func(b fakeai.Behavior) fakeai.Behavior { b.ThrottleRate = 1; return b }},
	{name: "b3 stalls", broken: 3, break_: func(b fakeai.Behavior) fakeai.Behavior { b.Hang = true; return b }},
}

const numPeerBackends = 4

// PeerRow is one balancer in one phase.
type PeerRow struct {
	Phase, Balancer string
	Requests        int
	Errors          int     // client errors: not a complete 200 stream
	P50Ms, P99Ms    float64 // over every request, failed ones at the time they failed
	Attempts        int64   // attempts the backends saw from this balancer
	BrokenAttempts  int64   // of which to the phase's broken backend
	HasBroken       bool    // the phase has a broken backend
}

// PeersReport is what RunPeers measured.
type PeersReport struct {
	Settings  PeersSettings
	Balancers []string // in report order, fleetwatch first
	Rows      []PeerRow
}

// maxPeers bounds the balancers of one run: peerNames and Portkey.
const maxPeers = 5

// attemptCounts are the attempts each backend saw, by balancer and phase.
type attemptCounts [maxPeers][4][numPeerBackends]atomic.Int64

// countingBackend serves one fake backend and counts the generation
// attempts each balancer sends it in each phase.
type countingBackend struct {
	idx    int
	fake   *fakeai.Server
	counts *attemptCounts
}

var digits = []string{"0", "1", "2", "3", "4"}

func (c *countingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		b, ph := slices.Index(digits, r.Header.Get(balancerHeader)), slices.Index(digits, r.Header.Get(phaseHeader))
		if b >= 0 && ph >= 0 {
			c.counts[b][ph][c.idx].Add(1)
		}
	}
	c.fake.ServeHTTP(w, r)
}

// peerRun is one RunPeers in progress: what it started, to stop it.
type peerRun struct {
	s       PeersSettings
	names   []string // the balancers, in report order
	dir     string
	fakes   []*fakeai.Server
	normal  fakeai.Behavior
	servers []*http.Server
	urls    []string // backend base URLs
	counts  attemptCounts
	stops   []func() // in reverse order at the end
}

func (p *peerRun) stopAll() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
}

// RunPeers runs the incident script through fleetwatch's router, HAProxy
// and nginx at once and returns each balancer's results per phase.
func RunPeers(ctx context.Context, s PeersSettings) (*PeersReport, error) {
	s = s.withDefaults()
	for _, bin := range []string{s.HAProxy, s.Nginx} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("bench peers: %w", err)
		}
	}
	names := slices.Clone(peerNames)
	if s.Portkey != "" {
		script, err := PortkeyScript(s.Portkey)
		if err != nil {
			return nil, err
		}
		if s.Node, err = exec.LookPath(s.Node); err != nil {
			return nil, fmt.Errorf("bench peers: portkey: %w", err)
		}
		s.Portkey = script
		names = append(names, PeerPortkey)
	}
	dir, err := os.MkdirTemp("", "fleetwatch-peers-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p := &peerRun{s: s, names: names, dir: dir, normal: fakeai.Behavior{
		TTFT: 40 * time.Millisecond, TokenTime: 5 * time.Millisecond, Model: peerModel, RetryAfter: time.Second,
	}}
	defer p.stopAll()
	if err := p.startBackends(); err != nil {
		return nil, err
	}
	urls, err := p.startBalancers(ctx)
	if err != nil {
		return nil, err
	}
	for i, us := range urls {
		for _, u := range us {
			if err := waitListening(ctx, u, 10*time.Second); err != nil {
				return nil, fmt.Errorf("bench peers: %s: %w", names[i], err)
			}
		}
	}
	results, err := p.drive(ctx, urls)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return p.report(results), nil
}

// startBalancers starts Routers instances of each balancer and returns
// their base URLs by balancer, in p.names' order.
func (p *peerRun) startBalancers(ctx context.Context) ([][]string, error) {
	urls := make([][]string, len(p.names))
	var err error
	if urls[0], err = p.startFleetwatch(ctx); err != nil {
		return nil, err
	}
	for i := range p.s.Routers {
		ha, err := p.startHAProxy(ctx, false, i)
		if err != nil {
			return nil, err
		}
		haRetry, err := p.startHAProxy(ctx, true, i)
		if err != nil {
			return nil, err
		}
		ng, err := p.startNginx(ctx, i)
		if err != nil {
			return nil, err
		}
		urls[1], urls[2], urls[3] = append(urls[1], ha), append(urls[2], haRetry), append(urls[3], ng)
		if p.s.Portkey != "" {
			pk, err := p.startPortkey(ctx, i)
			if err != nil {
				return nil, err
			}
			urls[4] = append(urls[4], pk)
		}
	}
	return urls, nil
}

// startBackends starts the fake backends, each behind a counting handler
// on its own loopback port.
func (p *peerRun) startBackends() error {
	for i := range numPeerBackends {
		fake := fakeai.New(fakeai.Settings{Name: fmt.Sprintf("b%d", i), Behavior: p.normal, Seed: uint64(i + 1)})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: &countingBackend{idx: i, fake: fake, counts: &p.counts}}
		done := make(chan struct{})
		go func() { defer close(done); hs.Serve(ln) }() // ends at Close
		p.stops = append(p.stops, func() { hs.Close(); <-done })
		p.fakes = append(p.fakes, fake)
		p.urls = append(p.urls, "http://"+ln.Addr().String())
	}
	return nil
}

// startFleetwatch runs serve (embedded NATS, analyzer with its defaults,
// probes off) and Routers instances of `fleetwatch route`
// (internal/router), each following the decisions and publishing one
// outcome event per attempt under its own source.
func (p *peerRun) startFleetwatch(ctx context.Context) ([]string, error) {
	cfg := config.Default()
	if p.s.Config != nil {
		c := *p.s.Config
		cfg = &c
	}
	cfg.NATS.Listen = "127.0.0.1:-1"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Data = p.dir + "/fleetwatch"
	cfg.Probes.Disabled = true
	floor := config.Duration{Duration: p.s.FirstByte}
	cfg.Route.StallFloor = &floor
	pool := config.PoolConfig{ID: peerModel, Models: []string{peerModel}}
	for i, u := range p.urls {
		pool.Backends = append(pool.Backends, config.BackendConfig{ID: fmt.Sprintf("b%d", i), URL: u})
	}
	cfg.Pools = []config.PoolConfig{pool}
	srv, err := serve.New(cfg, serve.Options{Logf: p.s.Logf})
	if err != nil {
		return nil, fmt.Errorf("bench peers: serve: %w", err)
	}
	srvCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(srvCtx) }() // ends at stopServe
	p.stops = append(p.stops, func() { stopServe(); <-srvDone; srv.Close() })

	var urls []string
	for i := range p.s.Routers {
		source := "bench"
		if p.s.Routers > 1 {
			source = fmt.Sprintf("bench-%d", i)
		}
		rt, err := router.New(cfg, router.Options{
			Source: source,
			Dial: func() (*nats.Conn, error) {
				nc, err := nats.Connect(srv.NATSURL(), nats.Name("fleetwatch bench peers router "+source), nats.MaxReconnects(-1))
				if err != nil {
					return nil, fmt.Errorf("bench peers: router: nats: %w", err)
				}
				return nc, nil
			},
			Logf: p.s.Logf,
		})
		if err != nil {
			return nil, err
		}
		if err := rt.Start(context.WithoutCancel(ctx)); err != nil { // ends at Close
			rt.Close()
			return nil, err
		}
		p.stops = append(p.stops, func() { rt.Close() })
		urls = append(urls, rt.URL())
	}
	return urls, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// peerClient is the load generator's client for one balancer: its
// instances' base URLs, taken in turn.
type peerClient struct {
	bases  []string
	idx    int
	header map[string]string // extra request headers (Portkey's config)
	// plain: send the request without "stream" and take a 200 with
	// choices as complete (Portkey, see portkeyHeaders).
	plain bool
	http  *http.Client
}

// peerResult is one request's outcome at the load generator.
type peerResult struct {
	phase int
	ms    float64
	ok    bool
}

// drive runs the script: every 1/Rate seconds one request goes to every
// balancer at once (to its instances in turn); the phase changes every
// Phase. It returns the results per balancer.
func (p *peerRun) drive(ctx context.Context, urls [][]string) ([][]peerResult, error) {
	clients := make([]*peerClient, len(urls))
	for i, us := range urls {
		tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}
		clients[i] = &peerClient{bases: us, idx: i, http: &http.Client{Transport: tr, Timeout: p.s.ClientTimeout}}
		defer tr.CloseIdleConnections()
		if p.names[i] == PeerPortkey {
			h, err := p.portkeyHeaders()
			if err != nil {
				return nil, err
			}
			clients[i].header, clients[i].plain = h, true
		}
	}
	var mu sync.Mutex // guards results
	results := make([][]peerResult, len(urls))
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / p.s.Rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	start := time.Now()
	total := time.Duration(len(peerPhases)) * p.s.Phase
	current := -1
	for n := 0; ctx.Err() == nil; n++ {
		el := time.Since(start)
		if el >= total {
			break
		}
		if ph := int(el / p.s.Phase); ph != current {
			current = ph
			p.enterPhase(ph)
		}
		phase := current
		for _, c := range clients {
			base := c.bases[n%len(c.bases)]
			body := chatBody(n, !c.plain)
			wg.Go(func() {
				r := c.do(ctx, base, body, phase)
				mu.Lock()
				results[c.idx] = append(results[c.idx], r)
				mu.Unlock()
			})
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	p.enterPhase(-1) // back to healthy: hanging requests end at their timeouts
	wg.Wait()
	return results, nil
}

// chatBody is the n-th request of the script: a chat completion of 8
// tokens, streamed or not.
func chatBody(n int, stream bool) []byte {
	if stream {
		return fmt.Appendf(nil, `{"model":%q,"stream":true,"max_tokens":8,"messages":[{"role":"user","content":"request %d"}]}`, peerModel, n)
	}
	return fmt.Appendf(nil, `{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"request %d"}]}`, peerModel, n)
}

// enterPhase makes the fakes behave as phase ph says (-1: all healthy).
func (p *peerRun) enterPhase(ph int) {
	for i, f := range p.fakes {
		b := p.normal
		if ph >= 0 && peerPhases[ph].broken == i {
			b = peerPhases[ph].break_(b)
		}
		f.SetBehavior(b)
	}
	if ph >= 0 {
		p.s.Logf("bench peers: phase %d: %s", ph+1, peerPhases[ph].name)
	}
}

// do sends one chat completion and reads it to the end: ok is a 200 whose
// stream ends with [DONE] (or, for a plain client, a 200 with choices).
func (c *peerClient) do(ctx context.Context, base string, body []byte, phase int) peerResult {
	start := time.Now()
	res := peerResult{phase: phase}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(balancerHeader, digits[c.idx])
	req.Header.Set(phaseHeader, digits[phase])
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err == nil {
		data, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		end := []byte("[DONE]")
		if c.plain {
			end = []byte(`"choices":[{`)
		}
		res.ok = rerr == nil && resp.StatusCode == http.StatusOK && bytes.Contains(data, end)
	}
	res.ms = float64(time.Since(start)) / float64(time.Millisecond)
	return res
}

// report turns the results and the backends' counts into rows, phase by
// phase.
func (p *peerRun) report(results [][]peerResult) *PeersReport {
	r := &PeersReport{Settings: p.s, Balancers: p.names}
	for ph, phase := range peerPhases {
		for b, name := range p.names {
			row := PeerRow{Phase: phase.name, Balancer: name, HasBroken: phase.broken >= 0}
			var ms []float64
			for _, res := range results[b] {
				if res.phase != ph {
					continue
				}
				row.Requests++
				if !res.ok {
					row.Errors++
				}
				ms = append(ms, res.ms)
			}
			row.P50Ms, row.P99Ms = quantile(ms, 0.50), quantile(ms, 0.99)
			for be := range numPeerBackends {
				n := p.counts[b][ph][be].Load()
				row.Attempts += n
				if be == phase.broken {
					row.BrokenAttempts = n
				}
			}
			r.Rows = append(r.Rows, row)
		}
	}
	return r
}

// quantile is the nearest-rank q-quantile of v (NaN for none).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	slices.Sort(v)
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// PeersTableHeader is the header row of WriteMarkdown's table.
const PeersTableHeader = "| phase | balancer | requests | client errors | p50 ms | p99 ms | broken backend's share of attempts | attempts per request |"

// WriteMarkdown writes the settings and one table row per phase and
// balancer.
func (r *PeersReport) WriteMarkdown(w io.Writer) error {
	s := r.Settings
	var b strings.Builder
	fmt.Fprintf(&b, "%d phases of %s, %.0f requests/s to each balancer (streaming chat completions, 8 tokens), "+
		"first-byte budget %s for every balancer, client timeout %s; 4 fake backends b0-b3, TTFT 40 ms, 5 ms per token.\n\n",
		len(peerPhases), s.Phase, s.Rate, s.FirstByte, s.ClientTimeout)
	if s.Routers > 1 {
		fmt.Fprintf(&b, "%d instances of each balancer, the requests spread over them in turn (%.1f/s each): %d nginx and %d HAProxy processes of each kind that each learn alone, %d fleetwatch routers sharing one serve.\n\n",
			s.Routers, s.Rate/float64(s.Routers), s.Routers, s.Routers, s.Routers)
	}
	if slices.Contains(r.Balancers, PeerPortkey) {
		fmt.Fprintf(&b, "%s: %d node process(es) of @portkey-ai/gateway, each request load-balanced over four fallback chains of three backends (on 408, 429 and 5xx), request_timeout %s; the same requests without stream (its streaming fails on Node 20, see internal/bench/peers_portkey.go).\n\n",
			PeerPortkey, s.Routers, s.FirstByte)
	}
	b.WriteString(PeersTableHeader + "\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, row := range r.Rows {
		share := "-"
		if row.HasBroken && row.Attempts > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(row.BrokenAttempts)/float64(row.Attempts))
		}
		perReq := "-"
		if row.Requests > 0 {
			perReq = fmt.Sprintf("%.2f", float64(row.Attempts)/float64(row.Requests))
		}
		errs := "-"
		if row.Requests > 0 {
			errs = fmt.Sprintf("%d (%.1f%%)", row.Errors, 100*float64(row.Errors)/float64(row.Requests))
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s |\n", row.Phase, row.Balancer, row.Requests, errs,
			fmtMs(row.P50Ms), fmtMs(row.P99Ms), share, perReq)
	}
	b.WriteString("\nBroken backend's share of fleetwatch's attempts against each peer's:")
	for _, ph := range peerPhases {
		if ph.broken < 0 {
			continue
		}
		fmt.Fprintf(&b, " %s:", ph.name)
		for _, name := range r.Balancers[1:] {
			fmt.Fprintf(&b, " %s %.2fx", name, r.ShareVs(ph.name, name))
		}
		b.WriteString(";")
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ShareVs is the broken backend's share of fleetwatch's attempts over
// the other balancer's in the phase (NaN when either has none): the
// fleet-wide feed's advantage, which the issue wants at most 0.25 against
// nginx at 8 instances in the fast-failure and 429 phases.
func (r *PeersReport) ShareVs(phase, balancer string) float64 {
	share := func(name string) float64 {
		for _, row := range r.Rows {
			if row.Phase == phase && row.Balancer == name && row.HasBroken && row.Attempts > 0 {
				return float64(row.BrokenAttempts) / float64(row.Attempts)
			}
		}
		return math.NaN()
	}
	return share(PeerFleetwatch) / share(balancer)
}

func fmtMs(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// waitListening waits until base's host:port accepts connections.
func waitListening(ctx context.Context, base string, timeout time.Duration) error {
	addr := strings.TrimPrefix(base, "http://")
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("%s does not accept connections", addr), err, ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
