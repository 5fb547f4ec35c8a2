package ingest

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
)

// DefaultMaxBody bounds an HTTP ingest body (after gzip decompression).
const DefaultMaxBody = 4 << 20

// MaxListedRejects bounds the rejects a response lists; the counts are
// always complete.
const MaxListedRejects = 100

// HTTPSettings configure the HTTP adapters. Emitter is required.
type HTTPSettings struct {
	Emitter *Emitter
	// Mapping maps upstreams to pools and backends. If nil, every
	// upstream maps to itself.
	Mapping *Mapping
	// MaxBody bounds a request body, after decompression; beyond it the
	// answer is 413. If zero, DefaultMaxBody.
	MaxBody int64
	// LiteLLM and OTLP configure those adapters' mappings.
	LiteLLM LiteLLMSettings
	OTLP    OTLPSettings
	// Metrics receives the adapters' series. If nil, a private set.
	Metrics *metrics.Set
}

// HTTP serves the HTTP adapters: POST /v1/outcomes, /v1/ingest/litellm and
// /v1/traces. Authentication is the caller's (serve wraps its whole mux).
type HTTP struct {
	s        HTTPSettings
	outcomes *Metrics
	litellm  *Metrics
	otlp     *Metrics
}

// NewHTTP returns the HTTP adapters, their metrics registered.
func NewHTTP(s HTTPSettings) *HTTP {
	if s.MaxBody <= 0 {
		s.MaxBody = DefaultMaxBody
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	return &HTTP{
		s:        s,
		outcomes: NewMetrics(s.Metrics, AdapterOutcomes),
		litellm:  NewMetrics(s.Metrics, AdapterLiteLLM),
		otlp:     NewMetrics(s.Metrics, AdapterOTLP),
	}
}

// Register adds the adapters' routes to mux.
func (h *HTTP) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/outcomes", h.serveOutcomes)
	mux.HandleFunc("POST /v1/ingest/litellm", h.serveLiteLLM)
	mux.HandleFunc("POST /v1/traces", h.serveTraces)
}

// Metrics returns the series of adapter (AdapterOutcomes, AdapterLiteLLM
// or AdapterOTLP).
func (h *HTTP) Metrics(adapter string) *Metrics {
	switch adapter {
	case AdapterOutcomes:
		return h.outcomes
	case AdapterLiteLLM:
		return h.litellm
	case AdapterOTLP:
		return h.otlp
	}
	return nil
}

// Response is the JSON body of POST /v1/outcomes and /v1/ingest/litellm.
type Response struct {
	Accepted int        `json:"accepted"`
	Rejected int        `json:"rejected"`
	Skipped  *int       `json:"skipped,omitempty"` // LiteLLM's answer only, zero included
	Rejects  []Rejected `json:"rejects,omitempty"` // at most MaxListedRejects
	Error    string     `json:"error,omitempty"`
}

var errTooLarge = errors.New("body too large")

// readBody reads r's body, gunzipping it when Content-Encoding says gzip,
// up to max bytes after decompression.
func readBody(r *http.Request, max int64) ([]byte, error) {
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(io.LimitReader(r.Body, max+1))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		body = zr
	default:
		return nil, fmt.Errorf("unsupported Content-Encoding %q", enc)
	}
	data, err := io.ReadAll(io.LimitReader(body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, errTooLarge
	}
	return data, nil
}

// read reads the body or answers the error (413 beyond the limit, 400 for
// a body that cannot be read) and returns nil.
func (h *HTTP) read(w http.ResponseWriter, r *http.Request, m *Metrics) []byte {
	m.Requests.Inc()
	data, err := readBody(r, h.s.MaxBody)
	switch {
	case errors.Is(err, errTooLarge):
		m.TooLarge.Inc()
		writeJSON(w, http.StatusRequestEntityTooLarge, Response{Error: fmt.Sprintf("body larger than %d bytes", h.s.MaxBody)})
		return nil
	case err != nil:
		m.ParseErrors.Inc()
		writeJSON(w, http.StatusBadRequest, Response{Error: err.Error()})
		return nil
	}
	return data
}

// finish emits b and answers: 200 when something was accepted or nothing
// was sent, 400 when every event was rejected, 503 when publishing failed.
// skipped is nil for an adapter that skips nothing (its answer has no
// skipped field).
func (h *HTTP) finish(w http.ResponseWriter, b *Batch, skipped *int) {
	res := Response{Accepted: b.Accepted, Rejected: len(b.Rejects), Skipped: skipped, Rejects: b.Rejects}
	if len(res.Rejects) > MaxListedRejects {
		res.Rejects = res.Rejects[:MaxListedRejects]
	}
	if _, err := b.Emit(); err != nil {
		res.Error = err.Error()
		writeJSON(w, http.StatusServiceUnavailable, res)
		return
	}
	code := http.StatusOK
	if res.Accepted == 0 && res.Rejected > 0 {
		code = http.StatusBadRequest
	}
	writeJSON(w, code, res)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// serveOutcomes takes PROTOCOL.md outcome events, one object or NDJSON,
// and publishes the valid ones on fw.outcomes.<pool>.
func (h *HTTP) serveOutcomes(w http.ResponseWriter, r *http.Request) {
	data := h.read(w, r, h.outcomes)
	if data == nil {
		return
	}
	b := h.s.Emitter.NewBatch(h.outcomes)
	b.AddRaw(data, 1)
	h.finish(w, b, nil)
}

// serveLiteLLM takes LiteLLM generic_api callback payloads.
func (h *HTTP) serveLiteLLM(w http.ResponseWriter, r *http.Request) {
	data := h.read(w, r, h.litellm)
	if data == nil {
		return
	}
	b := h.s.Emitter.NewBatch(h.litellm)
	skipped := 0
	var ev fleetwatch.Event
	splitJSONPayloads(data, func(value []byte, line int) {
		skip, malformed, err := mapLiteLLM(value, h.s.LiteLLM, h.s.Mapping, &ev)
		h.litellm.RetryHintMalformed(malformed)
		switch {
		case err != nil:
			h.litellm.ParseErrors.Inc()
			h.litellm.Reject(fleetwatch.ReasonBadJSON)
			b.Rejects = append(b.Rejects, Rejected{Index: b.n, Line: line, Reason: fleetwatch.ReasonBadJSON, Error: "not a LiteLLM logging payload: " + shortErr(err)})
			b.n++
		case skip != "":
			h.litellm.Skip(skip)
			skipped++
			b.n++
		default:
			b.Add(&ev, line)
		}
	})
	h.finish(w, b, &skipped)
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
