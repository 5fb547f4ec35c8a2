package toylm

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

func TestArtefactNames(t *testing.T) {
	want := []string{"fp16", "q4-like", "q6-like", "q8-like", "ref", "swap"}
	if diff := cmp.Diff(want, ArtefactNames()); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
}

func TestArtefactsBuild(t *testing.T) {
	a := NewArtefacts(0)
	req := fakeai.CompletionRequest{Prompt: "the quick brown fox", MaxTokens: 12}
	text := func(variant string, seed uint64) string {
		c, err := a.Build(variant, seed)
		if err != nil {
			t.Fatalf("Build(%q): %v", variant, err)
		}
		return c.Complete(req).Text
	}
	ref := text("ref", 1)
	if again := text("ref", 2); again != ref {
		t.Errorf("noiseless greedy output of ref differs between seeds:\n%q\n%q", ref, again)
	}
	if swapped := text("swap", 1); swapped == ref {
		t.Errorf("swap's greedy output is the reference's: %q", swapped)
	}
	_, err := a.Build("nope", 1)
	if err == nil || !strings.Contains(err.Error(), "fp16, q4-like, q6-like, q8-like, ref, swap") {
		t.Errorf("Build(nope): %v, want an error naming the variants", err)
	}
}

// TestArtefactsConcurrentBuild builds the same variant from several
// goroutines (the race detector checks the cache) and gets one model.
func TestArtefactsConcurrentBuild(t *testing.T) {
	a := NewArtefacts(0.03)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			c, err := a.Build("fp16", uint64(i))
			if err == nil && c == nil {
				err = errors.New("nil completer")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(a.built) != 1 {
		t.Errorf("%d models cached, want 1", len(a.built))
	}
}
