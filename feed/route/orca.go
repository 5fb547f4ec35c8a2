package route

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/fleetwatch/fleetwatch"
)

// ORCA load reports (docs/DECISIONS.md "Backend load"). A router that sends
// "endpoint-load-metrics-format: TEXT" (or JSON) on a request gets, from a
// vLLM server, an "endpoint-load-metrics" response header with the
// server's load as ORCA named metrics, for example
//
//	endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0
//	endpoint-load-metrics: JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3.0}}
//
// (vLLM's vllm/entrypoints/openai/orca_metrics.py, which maps its gauges
// vllm:kv_cache_usage_perc and vllm:num_requests_waiting to those names and
// adds the header to non-streaming chat and completion answers only). The
// router copies what the header says into the attempt's outcome event
// (running, waiting, kv_cache_usage), which carries it to the analyzer and
// so to every router's snapshot. A header the router cannot read is
// counted and ignored: it never fails or delays the request.

// Pool.ORCA values.
const (
	// ORCAText asks for ORCA reports in the TEXT format (the default).
	ORCAText = "text"
	// ORCAJSON asks for ORCA reports in the JSON format.
	ORCAJSON = "json"
	// ORCAOff asks for none and ignores any the backend sends.
	ORCAOff = "off"
)

const (
	// orcaRequestHeader asks the backend for a load report in a format.
	orcaRequestHeader = "Endpoint-Load-Metrics-Format"
	// orcaResponseHeader carries the backend's load report.
	orcaResponseHeader = "Endpoint-Load-Metrics"
	// maxORCAHeader is the longest header value parsed; a longer one is
	// invalid (vLLM's is under 100 bytes).
	maxORCAHeader = 4096
	// maxORCACount bounds running and waiting: a larger count is invalid.
	maxORCACount = 1 << 30
)

// orcaFormat returns the request header value for a Pool.ORCA setting,
// "" for off; ok is false for an unknown setting.
func orcaFormat(setting string) (value string, ok bool) {
	switch setting {
	case "", ORCAText:
		return "TEXT", true // vLLM compares lowercased; Envoy and Triton write it in capitals
	case ORCAJSON:
		return "JSON", true
	case ORCAOff:
		return "", true
	}
	return "", false
}

// orcaReport is what a load report says; a field is set when the report
// carried it with a valid value.
type orcaReport struct {
	running, waiting       int64
	hasRunning, hasWaiting bool
	kv                     float64
	hasKV                  bool
}

// empty reports whether r carries none of the fields the router uses.
func (r *orcaReport) empty() bool { return !r.hasRunning && !r.hasWaiting && !r.hasKV }

// parseORCA reads an endpoint-load-metrics value, TEXT or JSON, with or
// without its format word. It reports false for a value it cannot read at
// all (an unknown format such as BIN, malformed JSON, no key=value pair);
// a pair with an unknown name is skipped, and a known one with a value out
// of range is left out, so one bad metric does not hide the others.
func parseORCA(v string) (orcaReport, bool) {
	var r orcaReport
	if len(v) > maxORCAHeader {
		return r, false
	}
	v = strings.TrimSpace(v)
	format, rest, _ := strings.Cut(v, " ")
	switch {
	case strings.EqualFold(format, "TEXT"):
		v = rest
	case strings.EqualFold(format, "JSON"):
		return parseORCAJSON(strings.TrimSpace(rest))
	case strings.HasPrefix(v, "{"):
		return parseORCAJSON(v)
	case !strings.Contains(format, "="):
		return r, false // BIN (a serialized proto) or something else
	}
	pairs := 0
	for item := range strings.SplitSeq(v, ",") {
		name, value, found := strings.Cut(strings.TrimSpace(item), "=")
		if !found {
			continue
		}
		pairs++
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		r.set(strings.TrimSpace(name), f)
	}
	return r, pairs > 0
}

// parseORCAJSON reads the JSON format: an OrcaLoadReport object, whose
// named_metrics map holds the metrics vLLM reports.
func parseORCAJSON(v string) (orcaReport, bool) {
	var r orcaReport
	var doc struct {
		NamedMetrics map[string]json.RawMessage `json:"named_metrics"`
	}
	if err := json.Unmarshal([]byte(v), &doc); err != nil {
		return r, false
	}
	for name, raw := range doc.NamedMetrics {
		var f float64
		if json.Unmarshal(raw, &f) == nil {
			r.set("named_metrics."+name, f)
		}
	}
	return r, true
}

// set records metric name (as the TEXT format writes it, with its
// "named_metrics." prefix) with value f when the router knows the name and
// the value is in range.
func (r *orcaReport) set(name string, f float64) {
	metric, named := strings.CutPrefix(name, "named_metrics.")
	if !named || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return // the ORCA top-level fields (cpu_utilization, rps, ...) say nothing about queues
	}
	switch metric {
	case "num_requests_running":
		if f <= maxORCACount {
			r.running, r.hasRunning = int64(math.Round(f)), true
		}
	case "num_requests_waiting":
		if f <= maxORCACount {
			r.waiting, r.hasWaiting = int64(math.Round(f)), true
		}
	case "kv_cache_usage_perc", "gpu_cache_usage_perc", "kv_cache_utilization":
		if kv, ok := kvFraction(f); ok {
			r.kv, r.hasKV = kv, true
		}
	}
}

// kvFraction reads a KV-cache usage value as a fraction in [0, 1]. vLLM's
// kv_cache_usage_perc (and the older gpu_cache_usage_perc) is a fraction
// despite its name ("1 means 100 percent usage", vllm/v1/metrics/loggers.py),
// and so is SGLang's token_usage; a value in (1, 100] can only be a percent
// from another server and is divided by 100. Anything else is invalid.
func kvFraction(f float64) (float64, bool) {
	switch {
	case f >= 0 && f <= 1:
		return f, true
	case f > 1 && f <= 100:
		return f / 100, true
	}
	return 0, false // NaN, negative, beyond 100
}

// applyORCA copies the load report in h, if any, into ev and reports
// whether there was a header and whether it could be read.
func applyORCA(h http.Header, ev *fleetwatch.Event) (present, valid bool) {
	v := h.Get(orcaResponseHeader)
	if v == "" {
		return false, false
	}
	r, ok := parseORCA(v)
	if !ok || r.empty() {
		return true, false
	}
	if r.hasRunning {
		ev.Running, ev.HasRunning = r.running, true
	}
	if r.hasWaiting {
		ev.Waiting, ev.HasWaiting = r.waiting, true
	}
	if r.hasKV {
		ev.KVCacheUsage, ev.HasKVCache = r.kv, true
	}
	return true, true
}

// loadReport copies the backend's load report in h, if any, into ev and
// counts it.
func (rt *Router) loadReport(pool string, h http.Header, ev *fleetwatch.Event) {
	if present, valid := applyORCA(h, ev); present {
		rt.metrics.loadReport(pool, valid).Inc()
	}
}
