package demo

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// The tool-call scenario: every backend is probed with function-calling
// prompts as well (probes.suite default-v1+<a subset of tools-v1>), and a
// redeploy with a broken tool-call parser breaks 40% of vllm-d's calls
// while its text answers stay the same; the tool tier of the probes
// catches it. The incident comes late enough in the script for vllm-d to
// have enrolled (its probes fail while it refuses connections), so its
// baseline is the healthy parser's.

// toolBreak is the share of vllm-d's calls the incident breaks.
const toolBreak = 0.4

// demoToolPrompts is how many tool prompts of tools-v1 the demo probes
// with (every third one): a cycle of 16 text and 16 tool prompts fits in
// the demo's 10-second schedule at the fake backends' latency.
const demoToolPrompts = 16

// writeToolSuite writes the demo's tool suite into dir and returns the
// probes.suite value that adds it to default-v1.
func writeToolSuite(dir string) (string, error) {
	full, err := drift.LoadSuite("default-v1+tools-v1")
	if err != nil {
		return "", err
	}
	t := *full.Tools
	t.Prompts = nil
	for i, p := range full.Tools.Prompts {
		if i%3 == 0 && len(t.Prompts) < demoToolPrompts {
			t.Prompts = append(t.Prompts, p)
		}
	}
	data, err := json.MarshalIndent(map[string]any{"name": "tools-v1-demo", "tools": t}, "", "  ")
	if err != nil {
		return "", err
	}
	// The data directory may not exist yet (--data of a new directory):
	// the embedded server creates its store in it later.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("demo: data directory: %w", err)
	}
	path := filepath.Join(dir, "tools-v1-demo.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", err
	}
	return drift.DefaultSuite + "+" + path, nil
}

// toolIncident is the script step that breaks vllm-d's tool calls.
func toolIncident(at time.Duration) demoStep {
	return demoStep{at, fmt.Sprintf("INCIDENT vllm-d is redeployed with a broken tool-call parser: %.0f%% of its tool calls come back broken (invalid JSON, a missing required field, a wrong function name, no call); its text answers do not change", 100*toolBreak),
		func(d *demoRun) {
			d.backends["vllm-d"].srv.SetToolModel(&fakeai.ToolModel{Break: toolBreak, Seed: 1})
		}}
}
