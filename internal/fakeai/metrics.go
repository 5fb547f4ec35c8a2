package fakeai

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// This file is the fake's load reporting, the way vLLM reports it: the
// Prometheus gauges on GET /metrics and the ORCA header on non-streaming
// answers (docs/DECISIONS.md "Backend load").
//
// Running is the generation and embedding requests in progress that hold a
// concurrency slot; waiting, those queued for one (Behavior.MaxConcurrent);
// the KV cache is modelled as KVCacheRequests requests' worth, so its usage
// is min(1, running / KVCacheRequests).

// metricFamilies write the families of GET /metrics, in order. A file that
// adds a family appends its writer in an init function, so that each
// concern keeps its own file.
var metricFamilies = []func(s *Server, w io.Writer){writeLoadFamilies}

// serveMetrics answers GET /metrics in the Prometheus text format.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if id, _ := s.servedIdentity(); id.NoMetrics {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	for _, f := range metricFamilies {
		f(s, w)
	}
}

// load returns the requests running and waiting and the KV-cache usage.
func (s *Server) load() (running, waiting int64, kv float64) {
	waiting = s.waiting.Load()
	running = max(0, s.inFlight.Load()-waiting)
	kv = min(1, float64(running)/float64(s.kvRequests))
	return running, waiting, kv
}

// writeLoadFamilies writes vLLM's scheduler and cache gauges, labelled as
// vLLM labels them (one engine).
func writeLoadFamilies(s *Server, w io.Writer) {
	running, waiting, kv := s.load()
	labels := fmt.Sprintf(`{engine="0",model_name=%s}`, strconv.Quote(s.Behavior().model()))
	for _, g := range []struct {
		name, help string
		v          float64
	}{
		{"vllm:num_requests_running", "Number of requests in model execution batches.", float64(running)},
		{"vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(waiting)},
		{"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s%s %s\n", g.name, g.help, g.name, g.name, labels, pyFloat(g.v))
	}
}

// orcaHeader adds vLLM's ORCA load report to a non-streaming answer when
// the request asked for one (endpoint-load-metrics-format: TEXT or JSON,
// any case), in vLLM's exact format: its two named metrics in the order
// vLLM registers them, values printed as Python prints floats.
func (s *Server) orcaHeader(w http.ResponseWriter, r *http.Request) {
	format := strings.ToLower(r.Header.Get("Endpoint-Load-Metrics-Format"))
	if format != "text" && format != "json" {
		return
	}
	_, waiting, kv := s.load()
	var v string
	if format == "text" {
		v = fmt.Sprintf("TEXT named_metrics.num_requests_waiting=%s, named_metrics.kv_cache_usage_perc=%s",
			pyFloat(float64(waiting)), pyFloat(kv))
	} else {
		v = fmt.Sprintf(`JSON {"named_metrics": {"num_requests_waiting": %s, "kv_cache_usage_perc": %s}}`,
			pyFloat(float64(waiting)), pyFloat(kv))
	}
	w.Header().Set("Endpoint-Load-Metrics", v)
}

// pyFloat prints a finite v as Python's str(float) does: the shortest
// repr, positional from 1e-4 to 1e16 with ".0" on whole numbers,
// scientific outside.
func pyFloat(v float64) string {
	if a := math.Abs(v); a != 0 && (a < 1e-4 || a >= 1e16) {
		return strconv.FormatFloat(v, 'g', -1, 64) // "1e-05", "1e+16", as Python
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
