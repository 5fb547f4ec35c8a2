package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
// changes their behavior at run time (fakeai.AdminHandler); with
// --completer toy, POST /admin/<name>/artefact {"variant":"fp16"} swaps the
// artefact served (toylm.ArtefactNames: fp16, q4-like, q6-like, q8-like,
// ref, swap).
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
	fs.BoolVar(&b.BareThrottle, "bare-throttle", false, "429s without Retry-After, as a full queue answers (not a quota)")
	fs.DurationVar(&b.ColdStart, "cold-start", 0, "extra time of the first request after an idle gap")
	fs.DurationVar(&b.IdleGap, "idle-gap", 0, "idle time that makes a backend cold again (default 5m)")
	fs.IntVar(&b.MaxConcurrent, "max-concurrent", 0, "requests in progress per backend; more wait (0: no limit)")
	completer := fs.String("completer", "echo", "content: echo (repeat the prompt) or toy (a toy language model whose artefact can be swapped, for drift demos)")
	sigma := fs.Float64("toy-sigma", 0.03, "with --completer toy: run-to-run logit noise")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	var toy *toylm.Artefacts
	switch *completer {
	case "echo":
	case "toy":
		toy = toylm.NewArtefacts(*sigma)
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
	var order []*fakeai.Server
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
			c, err := toy.Build("ref", uint64(i+1))
			if err != nil {
				return err
			}
			srv.SetCompleter(c)
		}
		if err := srv.Start(addr); err != nil {
			return err
		}
		servers[name] = srv
		order = append(order, srv)
		fmt.Fprintf(stdout, "fake: backend %s on %s\n", name, srv.URL())
	}
	serveErr := make(chan error, 1)
	if *admin != "" {
		ln, err := net.Listen("tcp", *admin)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		var artefact func(string) (fakeai.Completer, error)
		if toy != nil {
			artefact = func(v string) (fakeai.Completer, error) { return toy.Build(v, uint64(len(v))+1) }
		}
		hs := &http.Server{Handler: fakeai.AdminHandler(order, artefact), ReadHeaderTimeout: 10 * time.Second}
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
