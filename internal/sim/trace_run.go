package sim

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultKVBlocks is a simulated backend's KV cache, in 512-token blocks:
// about what vLLM leaves for the KV cache of a Llama-3-8B-class model
// (32 layers, 8 KV heads of 128, fp16: 128 KiB per token) on one 80 GB GPU
// at gpu_memory_utilization 0.9, after 16 GB of weights and ~2 GB of
// activations: 54 GB / 128 KiB = 412k tokens, 800 blocks (409,600 tokens).
const DefaultKVBlocks = 800

// TraceOptions are the fleet and replay of TraceScenario.
type TraceOptions struct {
	Speed    float64 // time compression (2: twice as fast); 0 is 1
	Routers  int     // 0 is 1
	Backends int     // identical backends; 0 is 4
	Slots    int     // per backend; 0 is 8
	KVBlocks int     // per backend; 0 is DefaultKVBlocks, < 0 none
	// DecodeMs is the decode time per output token; 0 is 5, the cost the
	// traces' README assumes.
	DecodeMs float64
	Policies []string // empty: TracePolicies
}

// TraceScenario is the scenario replaying tr through a fleet of identical
// backends: it runs for the trace's span at the speed-up plus the client
// timeout, so that the last requests finish.
func TraceScenario(tr *Trace, o TraceOptions) Scenario {
	if o.Speed <= 0 {
		o.Speed = 1
	}
	if o.Routers <= 0 {
		o.Routers = 1
	}
	if o.Backends <= 0 {
		o.Backends = 4
	}
	if o.KVBlocks == 0 {
		o.KVBlocks = DefaultKVBlocks
	}
	if o.DecodeMs <= 0 {
		o.DecodeMs = 5
	}
	if len(o.Policies) == 0 {
		o.Policies = TracePolicies
	}
	backends := make([]BackendSpec, o.Backends)
	for i := range backends {
		backends[i] = BackendSpec{ID: fmt.Sprintf("b%d", i), Slots: o.Slots, DecodePerTokenMs: o.DecodeMs, KVBlocks: max(o.KVBlocks, 0)}
	}
	slots := o.Slots
	if slots == 0 {
		slots = 8
	}
	const timeout = 30 * time.Second
	return Scenario{
		Name: "trace-" + strings.TrimSuffix(filepath.Base(tr.Name), filepath.Ext(tr.Name)),
		Description: fmt.Sprintf("%s (%s, %d requests over %s) at x%g, %d backends of %d slots, %d KV blocks each, decode %g ms/token",
			filepath.Base(tr.Name), tr.Format, len(tr.Requests), tr.Span.Round(time.Second), o.Speed, o.Backends, slots, max(o.KVBlocks, 0), o.DecodeMs),
		Duration:      time.Duration(float64(tr.Span)/o.Speed) + timeout,
		Routers:       o.Routers,
		Backends:      backends,
		Trace:         tr,
		TraceSpeed:    o.Speed,
		ClientTimeout: timeout,
		Policies:      o.Policies,
	}
}

// WriteTraceTable writes a trace replay's results: TTFT quantiles, the
// prompt-token cache hit rate, client errors (requests that failed) and the
// herd measure (oscillation of the per-second shares), with the trace's
// skipped lines.
func WriteTraceTable(w io.Writer, sc Scenario, results []*Result) error {
	var b strings.Builder
	tr := sc.Trace
	fmt.Fprintf(&b, "### %s, %d routers\n\n%s. Lines skipped: %d (%s)", sc.Name, max(sc.Routers, 1), sc.Description, tr.SkippedTotal(), tr.SkippedSummary())
	if tr.Defaulted > 0 {
		fmt.Fprintf(&b, "; token counts assumed for %d requests", tr.Defaulted)
	}
	b.WriteString(".\n\n")
	rows := [][]string{{"policy", "requests", "client errors", "p50 ms", "p95 ms", "p99 ms", "token hit rate", "herd (oscillation)", "imbalance"}}
	for _, r := range results {
		rows = append(rows, []string{r.Policy, strconv.Itoa(r.Requests), fmt.Sprintf("%d (%s)", r.Failed, pct(r.ErrorRate)),
			num(r.TTFTP50), num(r.TTFTP95), num(r.TTFTP99), pct(r.TokenHitRate), fmt.Sprintf("%.3f", r.Oscillation), fix(r.Imbalance)})
	}
	writeAligned(&b, rows)
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeAligned writes rows as an aligned Markdown table, the first a header.
func writeAligned(b *strings.Builder, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for i, row := range rows {
		b.WriteString("|")
		for j, c := range row {
			if j == 0 {
				fmt.Fprintf(b, " %-*s |", widths[j], c)
			} else {
				fmt.Fprintf(b, " %*s |", widths[j], c)
			}
		}
		b.WriteString("\n")
		if i == 0 {
			b.WriteString("|")
			for j := range row {
				if j == 0 {
					b.WriteString(" " + strings.Repeat("-", widths[j]) + " |")
				} else {
					b.WriteString(" " + strings.Repeat("-", widths[j]-1) + ": |")
				}
			}
			b.WriteString("\n")
		}
	}
}
