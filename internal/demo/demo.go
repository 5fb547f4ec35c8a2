// Package demo is `fleetwatch demo`: the daemon (internal/serve), four
// fake OpenAI-compatible backends (internal/fakeai) behind the router
// (internal/router, as `fleetwatch route` runs it), and client traffic through the router, all in one
// process, while a script breaks the backends (fast failures, 429
// saturation, scale to zero, a cold start, an artefact change, broken tool
// calls) and the narration says what fleetwatch decided and why.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/router"
	"github.com/fleetwatch/fleetwatch/internal/serve"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
)

// Settings configure a demo run. The zero value works.
type Settings struct {
	// Out receives the narration. If nil, os.Stdout.
	Out io.Writer
	// Logf receives fleetwatch's own log lines. If nil, they are dropped.
	Logf func(format string, args ...any)
	// Script is the length of the incident script. If zero, 2 minutes.
	Script time.Duration
	// Rate is the client requests per second through the router. If zero,
	// 40.
	Rate float64
	// Seed seeds the traffic. If zero, 1.
	Seed uint64
	// HTTPListen is the daemon's HTTP address. If empty, 127.0.0.1:8080,
	// or any free loopback port when 8080 is in use.
	HTTPListen string
	// NATSListen is the embedded NATS server's address. If empty, a free
	// loopback port.
	NATSListen string
	// Data is the data directory. If empty, a temporary directory removed
	// at the end.
	Data string
	// NATSOptions are added to the daemon's NATS connection options.
	NATSOptions []nats.Option
}

// pool is the pool the demo's fleet serves.
const pool = "llama-3.1-70b"

// demoBackend is one fake backend of the demo fleet.
type demoBackend struct {
	id     string
	srv    *fakeai.Server
	normal fakeai.Behavior
	served int64 // requests at the last report
}

// demoStep is one scripted incident (or its end), at an offset from start.
type demoStep struct {
	at   time.Duration
	what string
	do   func(d *demoRun)
}

// demoRun is one run of the demo.
type demoRun struct {
	out      io.Writer
	start    time.Time
	backends map[string]*demoBackend
	order    []string
	ref      *toylm.Model
	mu       sync.Mutex // serialises output lines
	ok, bad  atomic.Int64
	shed     atomic.Int64
}

func (d *demoRun) say(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demoRun) patch(id string, f func(b *fakeai.Behavior)) {
	be := d.backends[id]
	b := be.srv.Behavior()
	f(&b)
	be.srv.SetBehavior(b)
}

func (d *demoRun) restore(id string) { d.backends[id].srv.SetBehavior(d.backends[id].normal) }

// demoScript is the incident schedule for a run of total length; the
// offsets scale with it so that a short run still shows every incident.
func demoScript(total time.Duration) []demoStep {
	at := func(frac float64) time.Duration { return time.Duration(frac * float64(total)) }
	return []demoStep{
		{at(0.08), "INCIDENT vllm-b starts failing fast: instant 500s (the fast-failure trap)", func(d *demoRun) {
			d.patch("vllm-b", func(b *fakeai.Behavior) { b.InstantError = true })
		}},
		{at(0.20), "INCIDENT vllm-c is saturated: 95% of requests get 429 with Retry-After 3s", func(d *demoRun) {
			d.patch("vllm-c", func(b *fakeai.Behavior) { b.ThrottleRate = 0.95; b.RetryAfter = 3 * time.Second })
		}},
		{at(0.33), "RECOVERY vllm-b is fixed", func(d *demoRun) { d.restore("vllm-b") }},
		{at(0.45), "RECOVERY vllm-c has capacity again", func(d *demoRun) { d.restore("vllm-c") }},
		{at(0.50), "INCIDENT vllm-d scales to zero: connections refused", func(d *demoRun) {
			d.patch("vllm-d", func(b *fakeai.Behavior) { b.Refuse = true })
		}},
		{at(0.62), "RECOVERY vllm-d scales up again, cold: its first request takes 2s extra", func(d *demoRun) {
			d.patch("vllm-d", func(b *fakeai.Behavior) { b.Refuse = false; b.ColdStart = 2 * time.Second; b.IdleGap = time.Second })
		}},
		{at(0.66), "INCIDENT vllm-a silently serves another artefact: a q4-like quantization behind the same model name", func(d *demoRun) {
			q4, kl := d.ref.Quantized(0.04)
			d.backends["vllm-a"].srv.SetCompleter(q4.With(toylm.Options{Sigma: 0.003, Fingerprint: "fp_demo_a"}))
			d.say("        (measured KL of the new artefact against the old: %.3f nats/token; the fingerprint did not change)", kl)
		}},
		toolIncident(at(0.80)), // tools.go
	}
}

// report prints each backend's share of the requests since the last report.
func (d *demoRun) report() {
	var total int64
	counts := map[string]int64{}
	for _, id := range d.order {
		be := d.backends[id]
		n := be.srv.Stats().Requests
		counts[id] = n - be.served
		be.served = n
		total += counts[id]
	}
	if total == 0 {
		return
	}
	parts := make([]string, 0, len(d.order))
	for _, id := range d.order {
		parts = append(parts, fmt.Sprintf("%s %3.0f%%", id, 100*float64(counts[id])/float64(total)))
	}
	d.say("traffic share, last 10s: %s   (clients: %d ok, %d failed so far)", strings.Join(parts, "  "), d.ok.Load(), d.bad.Load())
}

// demoSystemPrompts are shared prefixes: requests with the same one prefer
// the backend holding its cache.
var demoSystemPrompts = []string{
	"You are a concise assistant for an airline's customer service.",
	"You classify support tickets into billing, outage or other.",
	"You summarise legal documents for non-lawyers.",
	"You translate product descriptions into French.",
	"You answer questions about the employee handbook.",
	"You write SQL for the analytics warehouse.",
	"You extract invoice fields as JSON.",
	"You review pull requests for security problems.",
}

// traffic sends chat completions to the router at about rate per second
// (Poisson arrivals), a third of them streaming, until ctx is done.
func (d *demoRun) traffic(ctx context.Context, base string, rate float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	client := &http.Client{Timeout: 30 * time.Second}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for ctx.Err() == nil {
		gap := time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		// Half the requests share one of a few system prompts (prefix
		// affinity keeps each on the backend holding its cache); the rest
		// have none and are spread by the picker.
		messages := []map[string]string{{"role": "user", "content": fmt.Sprintf("request %d", rng.IntN(1_000_000))}}
		if rng.IntN(2) == 0 {
			messages = append([]map[string]string{{"role": "system", "content": demoSystemPrompts[rng.IntN(len(demoSystemPrompts))]}}, messages...)
		}
		body, _ := json.Marshal(map[string]any{
			"model":      pool,
			"messages":   messages,
			"max_tokens": 8 + rng.IntN(24),
			"stream":     rng.IntN(3) == 0,
		})
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					d.bad.Add(1)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				d.ok.Add(1)
			case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
				d.shed.Add(1)
			default:
				d.bad.Add(1)
			}
		}()
	}
}

// Run runs the demo until ctx ends, then prints the final decisions.
func Run(ctx context.Context, s Settings) error {
	anyHTTPPort := s.withDefaults()
	if s.Data == "" {
		dir, err := os.MkdirTemp("", "fleetwatch-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		s.Data = dir
	}
	stdout := s.Out

	d := &demoRun{out: stdout, backends: map[string]*demoBackend{}, ref: toylm.New(toylm.Config{})}
	fmt.Fprintln(stdout, "fleetwatch demo: four fake OpenAI-compatible backends behind the fleetwatch router, traffic through it, incidents on a schedule.")
	for i, id := range []string{"vllm-a", "vllm-b", "vllm-c", "vllm-d"} {
		normal := fakeai.Behavior{
			TTFT:       time.Duration(60+15*i) * time.Millisecond,
			TokenTime:  4 * time.Millisecond,
			Model:      pool,
			RetryAfter: time.Second,
		}
		srv, err := fakeai.Listen(fakeai.Settings{
			Name:      id,
			Behavior:  normal,
			Completer: d.ref.With(toylm.Options{Sigma: 0.003, NoiseSeed: uint64(i + 1), Fingerprint: "fp_demo_" + id[len(id)-1:]}),
			Seed:      uint64(i + 1),
		})
		if err != nil {
			return err
		}
		defer srv.Close()
		d.backends[id] = &demoBackend{id: id, srv: srv, normal: normal}
		d.order = append(d.order, id)
	}
	cfg, err := d.config(s)
	if err != nil {
		return err
	}

	opts := serve.Options{
		NATSOptions: s.NATSOptions,
		Logf:        s.Logf,
		OnTransition: func(t analyzer.Transition) {
			d.say("DECISION %s: %s -> %s: %s", t.Backend, t.From, t.To, t.Reason)
		},
		OnAlert: func(a fleetwatch.DriftAlert) {
			d.say("DRIFT %s: %s -> %s (score %.1f, threshold %.1f): %s", a.Backend, a.Previous, a.Status, a.Score, a.Threshold, a.Reason)
		},
	}
	srv, err := serve.New(cfg, opts)
	if anyHTTPPort && errors.Is(err, syscall.EADDRINUSE) {
		cfg.HTTP.Listen = "127.0.0.1:0" // 8080 is taken: any free port
		srv, err = serve.New(cfg, opts)
	}
	if err != nil {
		return err
	}
	d.start = time.Now()
	srvCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServe()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(srvCtx) }()
	natsURL := srv.NATSURL()
	httpAddr := srv.HTTPAddr()

	router, stopRouter, err := startRouter(cfg, natsURL, s)
	if err != nil {
		stopServe()
		<-srvDone
		return err
	}

	banner(stdout, httpAddr, natsURL, router)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	traffic.Go(func() { d.traffic(trafficCtx, router, s.Rate, s.Seed) })

	d.play(ctx, demoScript(s.Script))
	stopTraffic()
	traffic.Wait()
	stopRouter()
	stopServe()
	werr := <-srvDone
	fmt.Fprintf(stdout, "\nDemo over after %.0fs: %d requests answered, %d failed, %d shed. Final decisions:\n",
		time.Since(d.start).Seconds(), d.ok.Load(), d.bad.Load(), d.shed.Load())
	for _, snap := range srv.Snapshots() {
		for _, b := range snap.Backends {
			fmt.Fprintf(stdout, "  %-8s %-9s weight %.2f  drift %-8s %s\n", b.Backend, b.State, b.Weight, b.Drift, b.Reason)
		}
	}
	if werr != nil && !errors.Is(werr, context.Canceled) {
		return werr
	}
	return nil
}

// withDefaults fills what the caller left unset; anyHTTPPort reports
// that the status page's address was not chosen (8080, or any free port
// when it is taken).
func (s *Settings) withDefaults() (anyHTTPPort bool) {
	if s.Out == nil {
		s.Out = os.Stdout
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.Script <= 0 {
		s.Script = 2 * time.Minute
	}
	if s.Rate <= 0 {
		s.Rate = 40
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	anyHTTPPort = s.HTTPListen == ""
	if anyHTTPPort {
		s.HTTPListen = "127.0.0.1:8080"
	}
	if s.NATSListen == "" {
		s.NATSListen = "127.0.0.1:-1"
	}
	return anyHTTPPort
}

// banner says where everything the demo started is.
func banner(w io.Writer, httpAddr, natsURL, router string) {
	fmt.Fprintf(w, "  status page   http://%s/\n", httpAddr)
	fmt.Fprintf(w, "  metrics       http://%s/metrics\n", httpAddr)
	fmt.Fprintf(w, "  decisions     http://%s/api/decisions   (or: nats -s %s sub 'fw.decisions.>')\n", httpAddr, natsURL)
	fmt.Fprintf(w, "  router        %s/v1/chat/completions (model %q)\n", router, pool)
	fmt.Fprintf(w, "  live table    go run ./cmd/fleetwatch watch --nats %s %s\n", natsURL, pool)
	fmt.Fprintf(w, "Drift probes (16 text and %d tool-call prompts) run every 10s; each backend enrols a baseline over its first 3 cycles.\n\n", demoToolPrompts)
}

// play runs the script's steps at their times and reports every 10 s,
// until ctx ends.
func (d *demoRun) play(ctx context.Context, steps []demoStep) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextReport := 10 * time.Second
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		el := time.Since(d.start)
		for len(steps) > 0 && el >= steps[0].at {
			d.say("%s", steps[0].what)
			steps[0].do(d)
			steps = steps[1:]
		}
		if el >= nextReport {
			d.report()
			nextReport += 10 * time.Second
		}
	}
}

// config is the demo's configuration, built in code: the four backends in
// one pool, breakers that reopen within seconds, probes every 10s with
// quarantine on, a review every minute.
func (d *demoRun) config(s Settings) (*config.Config, error) {
	cfg := config.Default()
	cfg.NATS.Listen = s.NATSListen
	cfg.HTTP.Listen = s.HTTPListen
	cfg.Data = s.Data
	cfg.Analyzer.OpenBase = &config.Duration{Duration: 8 * time.Second}
	cfg.Analyzer.OpenMax = &config.Duration{Duration: 30 * time.Second}
	minRequests := 20
	cfg.Analyzer.MinRequests = &minRequests
	p := config.PoolConfig{ID: pool, Models: []string{pool}}
	for i, id := range d.order {
		cost := 0.5 + 0.1*float64(i)
		p.Backends = append(p.Backends, config.BackendConfig{ID: id, URL: d.backends[id].srv.URL(), CostPerMTok: &cost, MetricsURL: "auto"})
	}
	cfg.Pools = []config.PoolConfig{p}
	suite, err := writeToolSuite(cfg.Data) // tools.go: text and tool-call probes
	if err != nil {
		return nil, err
	}
	cfg.Probes.Suite = suite
	cfg.Probes.Schedule = "@every 10s"
	cfg.Probes.Timeout = &config.Duration{Duration: 5 * time.Second}
	cfg.Probes.Quarantine = true
	cfg.Probes.Enrol = 3
	cfg.Probes.EnrolMin = &config.Duration{}
	cfg.Review.Schedule = "@every 1m"
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo config: %w", err)
	}
	return cfg, nil
}

// startRouter runs `fleetwatch route` (internal/router) in front of the
// fake backends: it follows the decisions over its own NATS connection,
// publishes its outcome events there as source "demo", and serves on a
// free loopback port. stop drains it.
func startRouter(cfg *config.Config, natsURL string, s Settings) (base string, stop func(), err error) {
	rt, err := router.New(cfg, router.Options{
		Source: "demo",
		Dial: func() (*nats.Conn, error) {
			nc, err := nats.Connect(natsURL, append([]nats.Option{nats.Name("fleetwatch demo router"), nats.MaxReconnects(-1)}, s.NATSOptions...)...)
			if err != nil {
				return nil, fmt.Errorf("demo router: nats: %w", err)
			}
			return nc, nil
		},
		Logf: s.Logf,
	})
	if err != nil {
		return "", nil, err
	}
	if err := rt.Start(context.Background()); err != nil { // ends at Close
		rt.Close()
		return "", nil, err
	}
	return rt.URL(), func() { rt.Close() }, nil
}
