package toylm

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// Artefacts builds the completers of the reference model and of its
// variants, for fake backends whose artefact can be swapped at run time
// (`fleetwatch fake --completer toy`). Variants are built on first use (a
// quantized one is calibrated by measured KL, which takes a moment), so a
// fake backend starts at once. It is safe for concurrent use.
type Artefacts struct {
	ref   *Model
	sigma float64

	// mu guards built.
	mu    sync.Mutex
	built map[string]*Model
}

// artefactVariants are the variants Artefacts can build.
var artefactVariants = map[string]func(ref *Model) *Model{
	"ref":     func(ref *Model) *Model { return ref },
	"swap":    func(ref *Model) *Model { return ref.Swapped(0xdead) },
	"fp16":    func(ref *Model) *Model { return ref.FP16() },
	"q8-like": func(ref *Model) *Model { m, _ := ref.Quantized(KLQ8); return m },
	"q6-like": func(ref *Model) *Model { m, _ := ref.Quantized(KLQ6); return m },
	"q4-like": func(ref *Model) *Model { m, _ := ref.Quantized(KLQ4); return m },
}

// ArtefactNames returns the variants Artefacts builds, sorted: ref, swap,
// fp16 and the q4-, q6- and q8-like quantizations.
func ArtefactNames() []string { return slices.Sorted(maps.Keys(artefactVariants)) }

// NewArtefacts returns Artefacts around the default reference model
// (New(Config{})) whose completers have run-to-run logit noise sigma.
func NewArtefacts(sigma float64) *Artefacts {
	return &Artefacts{ref: New(Config{}), sigma: sigma, built: map[string]*Model{}}
}

// Build returns the completer serving variant, with its own noise seed.
func (a *Artefacts) Build(variant string, seed uint64) (fakeai.Completer, error) {
	newModel, ok := artefactVariants[variant]
	if !ok {
		return nil, fmt.Errorf("variant %q: want one of %s", variant, strings.Join(ArtefactNames(), ", "))
	}
	a.mu.Lock()
	m := a.built[variant]
	if m == nil {
		m = newModel(a.ref)
		a.built[variant] = m
	}
	a.mu.Unlock()
	return m.With(Options{Sigma: a.sigma, NoiseSeed: seed}), nil
}
