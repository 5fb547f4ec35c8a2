package sim

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
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
	// Fleet, when set, is the fleet instead of Backends and Slots: groups
	// of identical backends, which may differ from group to group.
	Fleet []FleetGroup
	// DecodeMs is the decode time per output token; 0 is 5, the cost the
	// traces' README assumes.
	DecodeMs float64
	Policies []string // empty: TracePolicies
}

// FleetGroup is Count identical backends of a replay's fleet.
type FleetGroup struct {
	Count int
	Slots int // per backend; 0 is 8
	// Times multiplies every prefill and decode time (2: a backend half as
	// fast, such as an older GPU); 0 is 1.
	Times float64
	// KVBlocks is the KV prefix cache per backend: 0 takes
	// TraceOptions.KVBlocks, < 0 is none.
	KVBlocks int
}

// MaxFleetBackends bounds a replay's fleet.
const MaxFleetBackends = 4096

// ParseFleet reads a fleet spec: comma-separated groups
// COUNTxSLOTS[@TIMES][:KVBLOCKS], such as "2x8,2x8@2" (two backends of 8
// slots and two more that take twice the time) or "3x16:1600,1x8@1.5:0"
// (KV blocks per backend; 0 is no prefix cache). An error names the group.
func ParseFleet(spec string) ([]FleetGroup, error) {
	var groups []FleetGroup
	total := 0
	for i, g := range strings.Split(spec, ",") {
		fg, err := parseFleetGroup(strings.TrimSpace(g))
		if err != nil {
			return nil, fmt.Errorf("fleet %q: group %d %q: %w", spec, i+1, g, err)
		}
		if total += fg.Count; total > MaxFleetBackends {
			return nil, fmt.Errorf("fleet %q: more than %d backends", spec, MaxFleetBackends)
		}
		groups = append(groups, fg)
	}
	return groups, nil
}

func parseFleetGroup(g string) (FleetGroup, error) {
	const want = "want COUNTxSLOTS[@TIMES][:KVBLOCKS], such as 2x8@1.5:800"
	var fg FleetGroup
	rest, kv, hasKV := strings.Cut(g, ":")
	rest, times, hasTimes := strings.Cut(rest, "@")
	count, slots, ok := strings.Cut(rest, "x")
	if !ok {
		return fg, fmt.Errorf("no x between count and slots: %s", want)
	}
	var err error
	if fg.Count, err = strconv.Atoi(count); err != nil || fg.Count < 1 {
		return fg, fmt.Errorf("count %q is not a whole number >= 1: %s", count, want)
	}
	if fg.Slots, err = strconv.Atoi(slots); err != nil || fg.Slots < 1 {
		return fg, fmt.Errorf("slots %q is not a whole number >= 1: %s", slots, want)
	}
	fg.Times = 1
	if hasTimes {
		if fg.Times, err = strconv.ParseFloat(times, 64); err != nil || !(fg.Times > 0) || math.IsInf(fg.Times, 0) {
			return fg, fmt.Errorf("times %q is not a number > 0: %s", times, want)
		}
	}
	if hasKV {
		if fg.KVBlocks, err = strconv.Atoi(kv); err != nil || fg.KVBlocks < 0 {
			return fg, fmt.Errorf("KV blocks %q is not a whole number >= 0: %s", kv, want)
		}
		if fg.KVBlocks == 0 {
			fg.KVBlocks = -1
		}
	}
	return fg, nil
}

// TraceScenario is the scenario replaying tr through a fleet (by default
// of identical backends): it runs for the trace's span at the speed-up
// plus the client timeout, so that the last requests finish.
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
	fleet := slices.Clone(o.Fleet)
	if len(fleet) == 0 {
		fleet = []FleetGroup{{Count: o.Backends, Slots: o.Slots}}
	}
	var backends []BackendSpec
	for i, g := range fleet {
		g = g.withDefaults(o.KVBlocks)
		fleet[i] = g
		for range g.Count {
			backends = append(backends, BackendSpec{ID: fmt.Sprintf("b%d", len(backends)), Slots: g.Slots,
				DecodePerTokenMs: o.DecodeMs, KVBlocks: max(g.KVBlocks, 0), Speed: g.Times})
		}
	}
	const timeout = 30 * time.Second
	return Scenario{
		Name: "trace-" + strings.TrimSuffix(filepath.Base(tr.Name), filepath.Ext(tr.Name)),
		Description: fmt.Sprintf("%s (%s, %d requests over %s) at x%g, %s, decode %g ms/token",
			filepath.Base(tr.Name), tr.Format, len(tr.Requests), tr.Span.Round(time.Second), o.Speed, fleetDescription(fleet), o.DecodeMs),
		Duration:      time.Duration(float64(tr.Span)/o.Speed) + timeout,
		Routers:       o.Routers,
		Backends:      backends,
		Trace:         tr,
		TraceSpeed:    o.Speed,
		ClientTimeout: timeout,
		Policies:      o.Policies,
	}
}

// withDefaults fills g's zero fields, its KV blocks from kv (the
// replay's, < 0 none).
func (g FleetGroup) withDefaults(kv int) FleetGroup {
	if g.Slots <= 0 {
		g.Slots = 8
	}
	if g.Times <= 0 {
		g.Times = 1
	}
	if g.KVBlocks == 0 {
		g.KVBlocks = kv
	}
	return g
}

// fleetDescription says what the fleet (its groups with their defaults) is:
// "4 backends of 8 slots, 800 KV blocks each" for one group at full speed,
// else each group in turn.
func fleetDescription(fleet []FleetGroup) string {
	if g := fleet[0]; len(fleet) == 1 && g.Times == 1 {
		return fmt.Sprintf("%d backends of %d slots, %d KV blocks each", g.Count, g.Slots, max(g.KVBlocks, 0))
	}
	var parts []string
	total := 0
	for _, g := range fleet {
		total += g.Count
		d := fmt.Sprintf("%d of %d slots", g.Count, g.Slots)
		if g.Times != 1 {
			d += fmt.Sprintf(" at %gx the time", g.Times)
		}
		parts = append(parts, d+fmt.Sprintf(" with %d KV blocks", max(g.KVBlocks, 0)))
	}
	return fmt.Sprintf("%d backends (%s)", total, strings.Join(parts, "; "))
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
