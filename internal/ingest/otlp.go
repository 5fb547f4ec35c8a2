package ingest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
	"github.com/fleetwatch/fleetwatch/internal/shed"
)

// OpenTelemetry GenAI semantic-convention attributes the OTLP adapter reads.
const (
	attrOperation     = "gen_ai.operation.name"
	attrRequestModel  = "gen_ai.request.model"
	attrResponseModel = "gen_ai.response.model"
	attrProvider      = "gen_ai.provider.name"
	attrSystem        = "gen_ai.system" // the provider's older name
	attrServerAddress = "server.address"
	attrServerPort    = "server.port"
	attrInputTokens   = "gen_ai.usage.input_tokens"
	attrOutputTokens  = "gen_ai.usage.output_tokens"
	attrErrorType     = "error.type"
	attrHTTPStatus    = "http.response.status_code"
)

// DefaultTTFTAttributes are the span attributes, in seconds, read as the
// time to first token, first present wins: the GenAI conventions'
// gen_ai.response.time_to_first_chunk, Sentry's
// gen_ai.response.time_to_first_token, OpenLIT's gen_ai.server.ttft, and
// the name of the server metric gen_ai.server.time_to_first_token where an
// instrumentation copies it onto the span.
var DefaultTTFTAttributes = []string{
	"gen_ai.response.time_to_first_chunk",
	"gen_ai.response.time_to_first_token",
	"gen_ai.server.ttft",
	"gen_ai.server.time_to_first_token",
}

// OTLPSettings say how a span becomes an event. The zero value follows the
// GenAI semantic conventions.
type OTLPSettings struct {
	// PoolAttribute names the attribute the pool comes from (span, then
	// resource attributes). If empty, gen_ai.request.model, falling back to
	// gen_ai.response.model.
	PoolAttribute string
	// BackendAttribute names the attribute the backend (the Mapping's
	// upstream key) comes from. If empty, server.address joined with
	// server.port ("host:port"), falling back to gen_ai.provider.name and
	// gen_ai.system.
	BackendAttribute string
	// TTFTAttributes are read, in seconds, as the time to first token. If
	// nil, DefaultTTFTAttributes.
	TTFTAttributes []string
	// TTFTEvents names span events whose first occurrence marks the first
	// token (its time minus the span's start). If nil, none.
	TTFTEvents []string
}

// lookup returns the attribute key of the span or, failing that, of its
// resource.
func lookup(span, resource pcommon.Map, key string) (pcommon.Value, bool) {
	if v, ok := span.Get(key); ok {
		return v, true
	}
	return resource.Get(key)
}

func lookupString(span, resource pcommon.Map, key string) string {
	v, ok := lookup(span, resource, key)
	if !ok {
		return ""
	}
	return v.AsString()
}

// numberOf reads an int, double or numeric string attribute.
func numberOf(v pcommon.Value) (float64, bool) {
	switch v.Type() {
	case pcommon.ValueTypeInt:
		return float64(v.Int()), true
	case pcommon.ValueTypeDouble:
		return v.Double(), true
	case pcommon.ValueTypeStr:
		f, err := strconv.ParseFloat(strings.TrimSpace(v.Str()), 64)
		return f, err == nil
	}
	return 0, false
}

// isGenAI reports whether a span follows the GenAI conventions.
func isGenAI(attrs pcommon.Map) bool {
	for _, k := range []string{attrOperation, attrRequestModel, attrResponseModel, attrProvider, attrSystem} {
		if _, ok := attrs.Get(k); ok {
			return true
		}
	}
	return false
}

// MapSpan turns one span into an outcome event; it returns a skip reason
// ("" when ev is filled).
//
// A failed call's retry_after_ms is the provider's stated wait
// (retryhint.Parse) from the response headers the span records
// as the HTTP semantic conventions name them, http.response.header.<key>
// (a string array, the first value read; a plain string accepted), and
// from the span's status message or exception.message, which may carry the
// provider's JSON error body. The span's end is the clock of the date and
// RFC 3339 forms.
func MapSpan(span ptrace.Span, resource pcommon.Map, s OTLPSettings, m *Mapping, ev *fleetwatch.Event) (skip string) {
	skip, _ = mapSpan(span, resource, s, m, ev)
	return skip
}

// mapSpan is MapSpan, also returning the retry hint sources that were
// malformed.
func mapSpan(span ptrace.Span, resource pcommon.Map, s OTLPSettings, m *Mapping, ev *fleetwatch.Event) (skip string, malformed []string) {
	*ev = fleetwatch.Event{}
	attrs := span.Attributes()
	if !isGenAI(attrs) {
		return SkipNotLLM, nil
	}
	pool := ""
	if s.PoolAttribute != "" {
		pool = lookupString(attrs, resource, s.PoolAttribute)
	} else if pool = lookupString(attrs, resource, attrRequestModel); pool == "" {
		pool = lookupString(attrs, resource, attrResponseModel)
	}
	upstream := ""
	if s.BackendAttribute != "" {
		upstream = lookupString(attrs, resource, s.BackendAttribute)
	} else if upstream = lookupString(attrs, resource, attrServerAddress); upstream != "" {
		if port := lookupString(attrs, resource, attrServerPort); port != "" {
			upstream += ":" + port
		}
	} else if upstream = lookupString(attrs, resource, attrProvider); upstream == "" {
		upstream = lookupString(attrs, resource, attrSystem)
	}
	if upstream == "" {
		return SkipNoUpstream, nil
	}
	var skipped string
	if ev.Pool, ev.Backend, skipped = m.Resolve(upstream, pool, ""); skipped != "" {
		return skipped, nil
	}
	ev.HasStatus = true
	ev.Status = spanStatus(span, attrs)
	ev.Outcome = fleetwatch.OutcomeFromStatus(ev.Status)
	start, end := span.StartTimestamp(), span.EndTimestamp()
	if end != 0 {
		ev.TS = end.AsTime().UTC()
	}
	if start != 0 && end >= start {
		ev.DurationMs, ev.HasDuration = float64(end-start)/1e6, true
	}
	if ev.Outcome == fleetwatch.OutcomeOK {
		if ttft, ok := spanTTFT(span, s); ok {
			ev.TTFTMs, ev.HasTTFT = ttft, true
			if ev.HasDuration && ev.TTFTMs > ev.DurationMs {
				ev.TTFTMs = ev.DurationMs
			}
		}
	}
	if v, ok := attrs.Get(attrInputTokens); ok {
		if n, ok := numberOf(v); ok {
			ev.InputTokens = tokenCount(n)
		}
	}
	if v, ok := attrs.Get(attrOutputTokens); ok {
		if n, ok := numberOf(v); ok {
			ev.OutputTokens = tokenCount(n)
		}
	}
	if ev.Status == 429 || ev.Status >= 500 {
		header := func(name string) string { return spanHeader(attrs, name) }
		hint := retryhint.Parse(ev.Status, header, func() []byte { return spanErrorText(span) }, ev.TS)
		ev.RetryAfterMs, ev.QuotaResetMs, malformed = hint.Ms, hint.QuotaMs, hint.Malformed
		ev.Shed = shed.Reason(ev.Status, header)
	}
	return "", malformed
}

// attrResponseHeader prefixes a response header's attribute (HTTP
// semantic conventions: the lower-case header name).
const attrResponseHeader = "http.response.header."

// spanHeader reads a response header recorded on the span.
func spanHeader(attrs pcommon.Map, name string) string {
	v, ok := attrs.Get(attrResponseHeader + name)
	if !ok {
		return ""
	}
	if v.Type() == pcommon.ValueTypeSlice {
		if v.Slice().Len() == 0 {
			return ""
		}
		v = v.Slice().At(0)
	}
	return v.AsString()
}

// spanErrorText is where a span may carry the provider's error body: its
// status message, else the first exception event's exception.message.
func spanErrorText(span ptrace.Span) []byte {
	if msg := span.Status().Message(); msg != "" {
		return []byte(msg)
	}
	events := span.Events()
	for i := 0; i < events.Len(); i++ {
		if e := events.At(i); e.Name() == "exception" {
			if v, ok := e.Attributes().Get("exception.message"); ok {
				return []byte(v.AsString())
			}
		}
	}
	return nil
}

// spanStatus derives an HTTP status: http.response.status_code when
// present; else, for a span with status Error or an error.type, the
// error.type when it is a status code, 429 for a rate-limit error, 0
// (timeout) for a timeout, else 500; else 200.
func spanStatus(span ptrace.Span, attrs pcommon.Map) int {
	if v, ok := attrs.Get(attrHTTPStatus); ok {
		if n, ok := numberOf(v); ok && n >= 100 && n <= 599 {
			return int(n)
		}
	}
	errType := ""
	if v, ok := attrs.Get(attrErrorType); ok {
		errType = v.AsString()
	}
	if span.Status().Code() != ptrace.StatusCodeError && errType == "" {
		return 200
	}
	if n, err := strconv.Atoi(strings.TrimSpace(errType)); err == nil && n >= 100 && n <= 599 {
		return n
	}
	lower := strings.ToLower(errType + " " + span.Status().Message())
	switch {
	case strings.Contains(lower, "ratelimit") || strings.Contains(lower, "rate_limit") || strings.Contains(lower, "429"):
		return 429
	case strings.Contains(lower, "timeout") || strings.Contains(lower, "deadline"):
		return 0
	}
	return 500
}

// spanTTFT reads the time to first token, in ms.
func spanTTFT(span ptrace.Span, s OTLPSettings) (float64, bool) {
	names := s.TTFTAttributes
	if names == nil {
		names = DefaultTTFTAttributes
	}
	for _, k := range names {
		if v, ok := span.Attributes().Get(k); ok {
			if sec, ok := numberOf(v); ok && sec >= 0 {
				return msOf(sec), true
			}
		}
	}
	if len(s.TTFTEvents) == 0 {
		return 0, false
	}
	events := span.Events()
	for i := 0; i < events.Len(); i++ {
		e := events.At(i)
		for _, name := range s.TTFTEvents {
			if e.Name() == name && e.Timestamp() >= span.StartTimestamp() && span.StartTimestamp() != 0 {
				return float64(e.Timestamp()-span.StartTimestamp()) / 1e6, true
			}
		}
	}
	return 0, false
}

// OTLP/HTTP content types.
const (
	contentProto = "application/x-protobuf"
	contentJSON  = "application/json"
)

// serveTraces is the OTLP/HTTP traces receiver (opentelemetry-proto's
// otlp.md "OTLP/HTTP"): a binary protobuf or JSON
// ExportTraceServiceRequest, optionally gzip-compressed; the answer is an
// ExportTraceServiceResponse in the request's encoding, with
// partial_success counting the GenAI spans that made no event (rejected,
// or skipped for no_pool, no_upstream or unmapped); a bad
// request gets 400 with a google.rpc.Status.
func (h *HTTP) serveTraces(w http.ResponseWriter, r *http.Request) {
	ct := strings.ToLower(strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]))
	if ct != contentProto && ct != contentJSON {
		h.otlp.Requests.Inc()
		h.otlp.ParseErrors.Inc()
		writeOTLPStatus(w, contentJSON, http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Type %q: want %s or %s", ct, contentProto, contentJSON))
		return
	}
	h.otlp.Requests.Inc()
	data, err := readBody(r, h.s.MaxBody)
	switch {
	case errors.Is(err, errTooLarge):
		h.otlp.TooLarge.Inc()
		writeOTLPStatus(w, ct, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", h.s.MaxBody))
		return
	case err != nil:
		h.otlp.ParseErrors.Inc()
		writeOTLPStatus(w, ct, http.StatusBadRequest, err.Error())
		return
	}
	req := ptraceotlp.NewExportRequest()
	if ct == contentProto {
		err = req.UnmarshalProto(data)
	} else {
		err = req.UnmarshalJSON(data)
	}
	if err != nil {
		h.otlp.ParseErrors.Inc()
		writeOTLPStatus(w, ct, http.StatusBadRequest, "cannot decode the ExportTraceServiceRequest: "+shortErr(err))
		return
	}
	b := h.s.Emitter.NewBatch(h.otlp)
	var ev fleetwatch.Event
	skipped := map[string]int{} // GenAI spans that made no event, by reason
	rss := req.Traces().ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		resource := rs.Resource().Attributes()
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			spans := sss.At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				skip, malformed := mapSpan(spans.At(k), resource, h.s.OTLP, h.s.Mapping, &ev)
				h.otlp.RetryHintMalformed(malformed)
				if skip != "" {
					h.otlp.Skip(skip)
					if skip != SkipNotLLM {
						skipped[skip]++
					}
					continue
				}
				b.Add(&ev, 0)
			}
		}
	}
	invalid := len(b.Rejects)
	var first string
	if invalid > 0 {
		first = b.Rejects[0].Error
	}
	if _, err := b.Emit(); err != nil {
		// Retryable: the exporter sends the batch again.
		w.Header().Set("Retry-After", "1")
		writeOTLPStatus(w, ct, http.StatusServiceUnavailable, err.Error())
		return
	}
	resp := ptraceotlp.NewExportResponse()
	if msg, n := notAccepted(invalid, first, skipped); n > 0 {
		ps := resp.PartialSuccess()
		ps.SetRejectedSpans(int64(n))
		ps.SetErrorMessage(msg)
	}
	var body []byte
	if ct == contentProto {
		body, err = resp.MarshalProto()
	} else {
		body, err = resp.MarshalJSON()
	}
	if err != nil {
		writeOTLPStatus(w, ct, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// notAccepted describes the GenAI spans that made no event: invalid ones
// (first is the first one's error) and those skipped, by reason. A span
// without gen_ai attributes is not counted: it was never addressed to
// fleetwatch, and a whole application's traces may be sent here.
func notAccepted(invalid int, first string, skipped map[string]int) (string, int) {
	n := invalid
	var parts []string
	if invalid > 0 {
		parts = append(parts, fmt.Sprintf("%d did not make valid outcome events (first: %s)", invalid, first))
	}
	for _, reason := range SkipReasons {
		if c := skipped[reason]; c > 0 {
			n += c
			parts = append(parts, fmt.Sprintf("%d skipped: %s", c, reason))
		}
	}
	if n == 0 {
		return "", 0
	}
	return fmt.Sprintf("%d GenAI spans not accepted: %s", n, strings.Join(parts, "; ")), n
}

// grpcCode maps an HTTP status to the google.rpc.Code of the Status body.
func grpcCode(httpStatus int) int32 {
	switch httpStatus {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType:
		return 3 // INVALID_ARGUMENT
	case http.StatusRequestEntityTooLarge:
		return 8 // RESOURCE_EXHAUSTED
	case http.StatusServiceUnavailable:
		return 14 // UNAVAILABLE
	}
	return 13 // INTERNAL
}

// writeOTLPStatus answers an OTLP/HTTP failure with a google.rpc.Status in
// the request's encoding.
func writeOTLPStatus(w http.ResponseWriter, ct string, code int, msg string) {
	st := &spb.Status{Code: grpcCode(code), Message: msg}
	if ct == contentProto {
		body, _ := proto.Marshal(st)
		w.Header().Set("Content-Type", contentProto)
		w.WriteHeader(code)
		w.Write(body)
		return
	}
	writeJSON(w, code, map[string]any{"code": st.Code, "message": st.Message})
}
