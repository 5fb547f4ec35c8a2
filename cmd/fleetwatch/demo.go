package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
)

func init() {
	register("demo", "serve plus a simulated fleet with scripted incidents (the newcomer's first command)", runDemo)
}

// demoPool is the pool the demo's fleet serves.
const demoPool = "llama-3.1-70b"

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
	}
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted; the incidents take about 2 minutes)")
	script := fs.Duration("script", 2*time.Minute, "length of the incident script")
	rate := fs.Float64("rate", 40, "client requests per second through the router")
	seed := fs.Uint64("seed", 1, "seed of the traffic")
	verbose := fs.Bool("v", false, "also print fleetwatch's own log lines")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if f.http == "" {
		f.http = "127.0.0.1:8080"
		if ln, err := net.Listen("tcp", f.http); err != nil {
			f.http = "127.0.0.1:0" // 8080 is taken: any free port
		} else {
			ln.Close()
		}
	}
	if f.natsListen == "" {
		f.natsListen = "127.0.0.1:-1"
	}
	if f.data == "" {
		dir, err := os.MkdirTemp("", "fleetwatch-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		f.data = dir
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	d := &demoRun{out: stdout, backends: map[string]*demoBackend{}, ref: toylm.New(toylm.Config{})}
	fmt.Fprintln(stdout, "fleetwatch demo: four fake OpenAI-compatible backends behind `fleetwatch route`, traffic through it, incidents on a schedule.")
	for i, id := range []string{"vllm-a", "vllm-b", "vllm-c", "vllm-d"} {
		normal := fakeai.Behavior{
			TTFT:       time.Duration(60+15*i) * time.Millisecond,
			TokenTime:  4 * time.Millisecond,
			Model:      demoPool,
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

	cfgPath, cfg, err := demoConfig(f, d)
	if err != nil {
		return err
	}
	logOut := io.Discard
	if *verbose {
		logOut = stderr
	}
	opts, err := f.options(logOut)
	if err != nil {
		return err
	}
	opts.OnTransition = func(t analyzer.Transition) {
		d.say("DECISION %s: %s -> %s: %s", t.Backend, t.From, t.To, t.Reason)
	}
	opts.OnAlert = func(a fleetwatch.DriftAlert) {
		d.say("DRIFT %s: %s -> %s (score %.1f, threshold %.1f): %s", a.Backend, a.Previous, a.Status, a.Score, a.Threshold, a.Reason)
	}
	srv, err := serve.New(cfg, opts)
	if err != nil {
		return err
	}
	d.start = time.Now()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	natsURL := srv.NATSURL()
	httpAddr := srv.HTTPAddr()

	routeAddr, err := freeAddr()
	if err != nil {
		return err
	}
	routeCtx, stopRoute := context.WithCancel(context.WithoutCancel(ctx))
	routeDone := make(chan error, 1)
	go func() {
		routeDone <- runRoute(routeCtx, []string{"--nats", natsURL, "--config", cfgPath, "--listen", routeAddr, "--source", "demo"}, io.Discard, logOut)
	}()

	fmt.Fprintf(stdout, "  status page   http://%s/\n", httpAddr)
	fmt.Fprintf(stdout, "  metrics       http://%s/metrics\n", httpAddr)
	fmt.Fprintf(stdout, "  decisions     http://%s/api/decisions   (or: nats -s %s sub 'fw.decisions.>')\n", httpAddr, natsURL)
	fmt.Fprintf(stdout, "  router        http://%s/v1/chat/completions (model %q)\n", routeAddr, demoPool)
	fmt.Fprintf(stdout, "  live table    go run ./cmd/fleetwatch watch --nats %s %s\n", natsURL, demoPool)
	fmt.Fprintf(stdout, "Drift probes run every 10s; each backend enrols a baseline over its first 3 cycles.\n\n")

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	traffic.Add(1)
	go func() { defer traffic.Done(); d.traffic(trafficCtx, "http://"+routeAddr, *rate, *seed) }()

	steps := demoScript(*script)
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
	stopTraffic()
	traffic.Wait()
	stopRoute()
	<-routeDone
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

// demoConfig writes the demo's configuration file (route reads it too) and
// returns it parsed.
func demoConfig(f serveFlags, d *demoRun) (string, *config.Config, error) {
	backends := make([]map[string]any, 0, len(d.order))
	for i, id := range d.order {
		backends = append(backends, map[string]any{"id": id, "url": d.backends[id].srv.URL(), "cost_per_mtok": 0.5 + 0.1*float64(i)})
	}
	doc := map[string]any{
		"prefix": fleetwatch.DefaultPrefix,
		"analyzer": map[string]any{
			"open_base":    "8s",
			"open_max":     "30s",
			"min_requests": 20,
		},
		"pools": []map[string]any{{
			"id": demoPool, "models": []string{demoPool}, "backends": backends,
		}},
		"probes": map[string]any{"schedule": "@every 10s", "timeout": "5s", "quarantine": true, "enrol": 3, "enrol_min": "0s"},
		"review": map[string]any{"schedule": "@every 1m"},
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(doc); err != nil {
		return "", nil, err
	}
	path := filepath.Join(f.data, "demo.yaml")
	if err := os.MkdirAll(f.data, 0o755); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", nil, err
	}
	f.nats.configFile = path
	cfg, err := f.nats.loadConfig()
	if err == nil {
		err = f.apply(cfg)
	}
	if err != nil {
		return "", nil, fmt.Errorf("demo config: %w", err)
	}
	return path, cfg, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
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
			"model":      demoPool,
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
