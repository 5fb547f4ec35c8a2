package main

import (
	"context"
	"errors"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFakeCommandScriptsIncidents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runFake(ctx, []string{"--backend", "a=127.0.0.1:0", "--backend", "b=127.0.0.1:0",
			"--admin", "127.0.0.1:0", "--model", "llama"}, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fake: %v\n%s", err, stderr.String())
		}
	})
	urlRe := regexp.MustCompile(`fake: (backend b|admin) on (http://\S+)`)
	urls := map[string]string{}
	eventually(t, 30*time.Second, "fake to listen", func() bool {
		for _, m := range urlRe.FindAllStringSubmatch(stdout.String(), -1) {
			urls[m[1]] = m[2]
		}
		return len(urls) == 2
	})
	c := testkit.NewChatClient(urls["backend b"])
	c.HTTP.Transport = &http.Transport{DisableKeepAlives: true}
	if r, err := c.Post("/v1/completions", map[string]any{"prompt": "x"}); err != nil || r.Status != 200 ||
		!strings.Contains(string(r.Body), `"model":"llama"`) {
		t.Fatalf("healthy: %v %d %s", err, r.Status, r.Body)
	}
	admin := testkit.NewChatClient(urls["admin"])
	if r, err := admin.Post("/admin/b/behavior", map[string]any{"refuse": true}); err != nil || r.Status != 200 {
		t.Fatalf("admin: %v %d %s", err, r.Status, r.Body)
	}
	if _, err := c.Post("/v1/completions", map[string]any{"prompt": "x"}); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refusing backend: error %v, want connection refused", err)
	}
	if r, err := admin.Post("/admin/b/behavior", map[string]any{"refuse": false, "throttle_rate": 1}); err != nil || r.Status != 200 {
		t.Fatalf("admin: %v %d", err, r.Status)
	}
	if r, err := c.Post("/v1/completions", map[string]any{"prompt": "x"}); err != nil || r.Status != 429 {
		t.Errorf("throttling backend: %v status %d, want 429", err, r.Status)
	}
	if r, err := admin.Post("/admin/nope/behavior", map[string]any{}); err != nil || r.Status != 404 {
		t.Errorf("unknown backend: %v status %d, want 404", err, r.Status)
	}
}

func TestFakeCommandSwapsTheToyArtefact(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runFake(ctx, []string{"--backend", "a=127.0.0.1:0", "--admin", "127.0.0.1:0",
			"--completer", "toy", "--toy-sigma", "0"}, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fake: %v\n%s", err, stderr.String())
		}
	})
	urlRe := regexp.MustCompile(`fake: (backend a|admin) on (http://\S+)`)
	urls := map[string]string{}
	eventually(t, 30*time.Second, "fake to listen", func() bool {
		for _, m := range urlRe.FindAllStringSubmatch(stdout.String(), -1) {
			urls[m[1]] = m[2]
		}
		return len(urls) == 2
	})
	c := testkit.NewChatClient(urls["backend a"])
	admin := testkit.NewChatClient(urls["admin"])
	greedy := func() string {
		r, err := c.Post("/v1/completions", map[string]any{"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0})
		if err != nil || r.Status != 200 {
			t.Fatalf("completion: %v %d", err, r.Status)
		}
		return string(r.Body[strings.Index(string(r.Body), `"choices"`):])
	}
	ref := greedy()
	if again := greedy(); again != ref {
		t.Fatalf("greedy output of the reference is not stable:\n%s\n%s", ref, again)
	}
	if r, err := admin.Post("/admin/a/artefact", map[string]any{"variant": "swap"}); err != nil || r.Status != 200 {
		t.Fatalf("artefact swap: %v %d %s", err, r.Status, r.Body)
	}
	if swapped := greedy(); swapped == ref {
		t.Errorf("greedy output unchanged after swapping the artefact:\n%s", swapped)
	}
	if r, err := admin.Post("/admin/a/artefact", map[string]any{"variant": "nope"}); err != nil || r.Status != 400 {
		t.Errorf("unknown variant: %v status %d, want 400", err, r.Status)
	}
}
