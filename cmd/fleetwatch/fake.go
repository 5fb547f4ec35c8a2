package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
)

func init() {
	register("fake", "run fake OpenAI-compatible backends with scriptable incidents (for demos and tests)", runFake)
}

// backendFlags collects repeated --backend name=host:port flags.
type backendFlags []string

func (b *backendFlags) String() string     { return strings.Join(*b, ",") }
func (b *backendFlags) Set(v string) error { *b = append(*b, v); return nil }

// runFake is `fleetwatch fake`: it runs fake OpenAI-compatible backends
// (internal/fakeai), each on its own address, and an admin listener that
// changes their behavior at run time:
//
//	GET  /admin/backends              names and URLs
//	GET  /admin/<name>/behavior       the current behavior
//	POST /admin/<name>/behavior       change it, e.g. {"refuse":true} or {"error_rate":0.5}
//	GET  /admin/<name>/stats          request counters
//	POST /admin/<name>/artefact       with --completer toy: serve another artefact,
//	                                  {"variant":"fp16"} (ref, swap, q4-like, q6-like, q8-like, fp16)
//
// The admin listener is separate from the backends so that a backend told
// to refuse connections can be told to accept them again.
func runFake(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fake", flag.ContinueOnError)
	var specs backendFlags
	fs.Var(&specs, "backend", "a backend as name=host:port (repeatable; default fake=127.0.0.1:9001)")
	admin := fs.String("admin", "127.0.0.1:9000", "admin listener address (empty: none)")
	var b fakeai.Behavior
	fs.StringVar(&b.Model, "model", "", "model id reported (default fake-model)")
	fs.StringVar(&b.Fingerprint, "fingerprint", "", "system_fingerprint reported (default the completer's, fp_echo)")
	fs.DurationVar(&b.TTFT, "ttft", 0, "base time to first token")
	fs.DurationVar(&b.TTFTPerPromptToken, "ttft-per-token", 0, "added to the TTFT per uncached prompt token")
	fs.DurationVar(&b.TokenTime, "token-time", 0, "time between generated tokens")
	fs.Float64Var(&b.ErrorRate, "error-rate", 0, "fraction of requests answered 500 after the TTFT")
	fs.Float64Var(&b.ThrottleRate, "throttle-rate", 0, "fraction of requests answered 429")
	fs.DurationVar(&b.RetryAfter, "retry-after", 0, "Retry-After of a 429 (default 1s)")
	fs.DurationVar(&b.ColdStart, "cold-start", 0, "extra time of the first request after an idle gap")
	fs.DurationVar(&b.IdleGap, "idle-gap", 0, "idle time that makes a backend cold again (default 5m)")
	fs.IntVar(&b.MaxConcurrent, "max-concurrent", 0, "requests in progress per backend; more wait (0: no limit)")
	completer := fs.String("completer", "echo", "content: echo (repeat the prompt) or toy (a toy language model whose artefact can be swapped, for drift demos)")
	sigma := fs.Float64("toy-sigma", 0.03, "with --completer toy: run-to-run logit noise")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	var toy *fakeToy
	switch *completer {
	case "echo":
	case "toy":
		toy = newFakeToy(*sigma)
	default:
		fmt.Fprintf(stderr, "--completer = %q: want echo or toy\n", *completer)
		return errUsage
	}
	if len(specs) == 0 {
		specs = backendFlags{"fake=127.0.0.1:9001"}
	}
	if _, err := (fakeai.BehaviorPatch{ErrorRate: &b.ErrorRate, ThrottleRate: &b.ThrottleRate}).Apply(b); err != nil {
		return err
	}
	servers := map[string]*fakeai.Server{}
	var order []string
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for i, spec := range specs {
		name, addr, ok := strings.Cut(spec, "=")
		if !ok || name == "" || addr == "" || strings.Contains(name, "/") {
			fmt.Fprintf(stderr, "--backend %q: want name=host:port\n", spec)
			return errUsage
		}
		if _, dup := servers[name]; dup {
			return fmt.Errorf("--backend %q: duplicate name", name)
		}
		srv := fakeai.New(fakeai.Settings{Name: name, Behavior: b, Seed: uint64(i + 1)})
		if toy != nil {
			c, err := toy.build("ref", uint64(i+1))
			if err != nil {
				return err
			}
			srv.SetCompleter(c)
		}
		if err := srv.Start(addr); err != nil {
			return err
		}
		servers[name] = srv
		order = append(order, name)
		fmt.Fprintf(stdout, "fake: backend %s on %s\n", name, srv.URL())
	}
	serveErr := make(chan error, 1)
	if *admin != "" {
		ln, err := net.Listen("tcp", *admin)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		hs := &http.Server{Handler: fakeAdmin(servers, order, toy), ReadHeaderTimeout: 10 * time.Second}
		go func() { serveErr <- hs.Serve(ln) }() // exits when hs closes below
		defer hs.Close()
		fmt.Fprintf(stdout, "fake: admin on http://%s\n", ln.Addr())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// fakeAdmin routes /admin/<name>/... to the named backend's admin handler.
func fakeAdmin(servers map[string]*fakeai.Server, order []string, toy *fakeToy) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/{name}/artefact", func(w http.ResponseWriter, r *http.Request) {
		srv := servers[r.PathValue("name")]
		if srv == nil || toy == nil {
			http.Error(w, "no such backend, or not --completer toy", http.StatusNotFound)
			return
		}
		var req struct {
			Variant string `json:"variant"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<12)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c, err := toy.build(req.Variant, uint64(len(req.Variant))+1)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		srv.SetCompleter(c)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"backend": srv.Name(), "variant": req.Variant})
	})
	mux.HandleFunc("GET /admin/backends", func(w http.ResponseWriter, r *http.Request) {
		type entry struct {
			Name string `json:"name"`
			URL  string `json:"url"`
		}
		list := make([]entry, len(order))
		for i, n := range order {
			list[i] = entry{n, servers[n].URL()}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("/admin/{name}/{rest...}", func(w http.ResponseWriter, r *http.Request) {
		srv := servers[r.PathValue("name")]
		if srv == nil {
			http.Error(w, "no such backend", http.StatusNotFound)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/admin/" + r.PathValue("rest")
		srv.AdminHandler().ServeHTTP(w, r2)
	})
	return mux
}

// fakeToy builds toy language model completers (internal/toylm): the
// reference artefact and its variants. Variants are built on first use (a
// quantized one is calibrated by measured KL, which takes a moment), so the
// command starts at once.
type fakeToy struct {
	ref   *toylm.Model
	sigma float64

	// mu guards built.
	mu    sync.Mutex
	built map[string]*toylm.Model
}

// fakeToyVariants are the artefacts /admin/<name>/artefact can serve.
var fakeToyVariants = map[string]func(ref *toylm.Model) *toylm.Model{
	"ref":     func(ref *toylm.Model) *toylm.Model { return ref },
	"swap":    func(ref *toylm.Model) *toylm.Model { return ref.Swapped(0xdead) },
	"fp16":    func(ref *toylm.Model) *toylm.Model { return ref.FP16() },
	"q8-like": func(ref *toylm.Model) *toylm.Model { m, _ := ref.Quantized(toylm.KLQ8); return m },
	"q6-like": func(ref *toylm.Model) *toylm.Model { m, _ := ref.Quantized(toylm.KLQ6); return m },
	"q4-like": func(ref *toylm.Model) *toylm.Model { m, _ := ref.Quantized(toylm.KLQ4); return m },
}

func newFakeToy(sigma float64) *fakeToy {
	return &fakeToy{ref: toylm.New(toylm.Config{}), sigma: sigma, built: map[string]*toylm.Model{}}
}

// build returns the completer serving variant, with its own noise seed.
func (t *fakeToy) build(variant string, seed uint64) (fakeai.Completer, error) {
	newModel, ok := fakeToyVariants[variant]
	if !ok {
		names := slices.Sorted(maps.Keys(fakeToyVariants))
		return nil, fmt.Errorf("variant %q: want one of %s", variant, strings.Join(names, ", "))
	}
	t.mu.Lock()
	m := t.built[variant]
	if m == nil {
		m = newModel(t.ref)
		t.built[variant] = m
	}
	t.mu.Unlock()
	return m.With(toylm.Options{Sigma: t.sigma, NoiseSeed: seed}), nil
}
