package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
	"github.com/fleetwatch/fleetwatch/internal/shed"
)

// LiteLLM's logging payload (StandardLoggingPayload, docs/proxy/logging_spec
// in the LiteLLM repository), as its generic_api callback posts it: a JSON
// array of payloads (log_format json_array, the default), NDJSON (ndjson)
// or one object (single). Only the fields fleetwatch uses are read; every
// number may also come as null.
type litellmPayload struct {
	Status              *string      `json:"status"` // "success" or "failure"
	Model               *string      `json:"model"`
	ModelID             *string      `json:"model_id"`
	ModelGroup          *string      `json:"model_group"`
	APIBase             *string      `json:"api_base"`
	StartTime           *litellmTime `json:"startTime"`
	EndTime             *litellmTime `json:"endTime"`
	CompletionStartTime *litellmTime `json:"completionStartTime"` // first chunk (streaming), else the end
	ResponseTime        *float64     `json:"response_time"`       // seconds
	PromptTokens        *float64     `json:"prompt_tokens"`
	CompletionTokens    *float64     `json:"completion_tokens"`
	CacheHit            *bool        `json:"cache_hit"` // answered from LiteLLM's own cache: no backend
	ErrorStr            *string      `json:"error_str"`
	ErrorInformation    *struct {
		ErrorCode    json.RawMessage `json:"error_code"` // "429", 429 or null
		ErrorClass   *string         `json:"error_class"`
		ErrorMessage *string         `json:"error_message"` // the provider's error, its JSON body often embedded
	} `json:"error_information"`
	// The provider's response headers, where a LiteLLM version logs them:
	// decoded only for a 429 or 5xx (see litellmHeaders).
	ResponseHeaders json.RawMessage `json:"response_headers"`
	HiddenParams    *struct {
		APIBase           *string         `json:"api_base"`
		ModelID           *string         `json:"model_id"`
		AdditionalHeaders json.RawMessage `json:"additional_headers"`
		ResponseHeaders   json.RawMessage `json:"response_headers"`
	} `json:"hidden_params"`
}

// litellmTime is a point in time as LiteLLM's payloads carry it, in unix
// seconds: a JSON number (the StandardLoggingPayload's float), or a string
// as LiteLLM's generic API logging example shows and as a Python datetime
// prints: epoch seconds ("1764741600.25"), RFC 3339 with or without a zone
// ("2024-01-01T12:00:00.123456", "...Z", "...+01:00"), or Python's str()
// form with a space for the T ("2024-01-01 12:00:00.123456+00:00"). A
// time without a zone is UTC. An empty string is absent (NaN).
type litellmTime float64

// litellmTimeLayouts are tried in order after a space separator became T;
// a fractional second is accepted after the seconds by each.
var litellmTimeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05"}

func (t *litellmTime) UnmarshalJSON(data []byte) error {
	if len(data) == 0 || data[0] != '"' {
		var f float64
		if err := json.Unmarshal(data, &f); err != nil {
			return err
		}
		*t = litellmTime(f)
		return nil
	}
	var str string
	if err := json.Unmarshal(data, &str); err != nil {
		return err
	}
	str = strings.TrimSpace(str)
	if str == "" {
		*t = litellmTime(math.NaN())
		return nil
	}
	if f, err := strconv.ParseFloat(str, 64); err == nil {
		*t = litellmTime(f)
		return nil
	}
	if len(str) > 10 && str[10] == ' ' {
		str = str[:10] + "T" + str[11:]
	}
	for _, layout := range litellmTimeLayouts {
		if tm, err := time.Parse(layout, str); err == nil { // no zone: UTC
			*t = litellmTime(float64(tm.UnixMicro()) / 1e6)
			return nil
		}
	}
	return fmt.Errorf("time %q: want unix seconds, RFC 3339 or Python's datetime form", str)
}

// seconds is t as the *float64 the mapping reads (nil when absent).
func (t *litellmTime) seconds() *float64 {
	if t == nil {
		return nil
	}
	f := float64(*t)
	return &f
}

// LiteLLM field names a pool or backend may come from.
const (
	LiteLLMModelGroup = "model_group"
	LiteLLMModel      = "model"
	LiteLLMModelID    = "model_id"
	LiteLLMAPIBase    = "api_base"
)

// LiteLLMFields lists the fields LiteLLMSettings may name.
var LiteLLMFields = []string{LiteLLMModelGroup, LiteLLMModel, LiteLLMModelID, LiteLLMAPIBase}

// LiteLLMSettings say how a LiteLLM payload becomes an event. The zero
// value works.
type LiteLLMSettings struct {
	// PoolField names the payload field the pool comes from (one of
	// LiteLLMFields). If empty, model_group, falling back to model.
	PoolField string
	// BackendField names the field the backend (the Mapping's upstream
	// key) comes from. If empty, api_base, falling back to model_id.
	BackendField string
}

// errNoEvent marks a payload that carries no outcome: a cache hit, or one
// whose status is neither success nor failure.
var errNoEvent = errors.New("ingest: no outcome in payload")

func (p *litellmPayload) field(name string) string {
	str := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	switch name {
	case LiteLLMModelGroup:
		return str(p.ModelGroup)
	case LiteLLMModel:
		return str(p.Model)
	case LiteLLMModelID:
		if v := str(p.ModelID); v != "" || p.HiddenParams == nil {
			return v
		}
		return str(p.HiddenParams.ModelID)
	case LiteLLMAPIBase:
		if v := str(p.APIBase); v != "" || p.HiddenParams == nil {
			return v
		}
		return str(p.HiddenParams.APIBase)
	}
	return ""
}

// MapLiteLLM turns one LiteLLM logging payload into an outcome event. It
// returns a skip reason ("" when ev is filled) or a parse error.
//
// A failed call's retry_after_ms is the provider's stated wait
// (retryhint.Parse) from the response headers the payload
// carries (response_headers, hidden_params.response_headers or
// hidden_params.additional_headers, whose keys LiteLLM may write with
// underscores or an "llm_provider-" prefix) and from the error message
// (error_information.error_message, else error_str), which embeds the
// provider's JSON error body. The end time is the clock of the
// date and RFC 3339 forms.
func MapLiteLLM(data []byte, s LiteLLMSettings, m *Mapping, ev *fleetwatch.Event) (skip string, err error) {
	skip, _, err = mapLiteLLM(data, s, m, ev)
	return skip, err
}

// mapLiteLLM is MapLiteLLM, also returning the retry hint sources that
// were malformed.
func mapLiteLLM(data []byte, s LiteLLMSettings, m *Mapping, ev *fleetwatch.Event) (skip string, malformed []string, err error) {
	var p litellmPayload
	if err := json.Unmarshal(data, &p); err != nil {
		return "", nil, err
	}
	*ev = fleetwatch.Event{}
	switch {
	case p.CacheHit != nil && *p.CacheHit:
		return SkipNoUpstream, nil, nil // LiteLLM answered from its cache
	case p.Status == nil || (*p.Status != "success" && *p.Status != "failure"):
		return SkipEventType, nil, nil
	}
	pool := ""
	if s.PoolField != "" {
		pool = p.field(s.PoolField)
	} else if pool = p.field(LiteLLMModelGroup); pool == "" {
		pool = p.field(LiteLLMModel)
	}
	upstream := ""
	if s.BackendField != "" {
		upstream = p.field(s.BackendField)
	} else if upstream = p.field(LiteLLMAPIBase); upstream == "" {
		upstream = p.field(LiteLLMModelID)
	}
	if upstream == "" {
		return SkipNoUpstream, nil, nil
	}
	var skipped string
	if ev.Pool, ev.Backend, skipped = m.Resolve(upstream, pool, ""); skipped != "" {
		return skipped, nil, nil
	}
	ev.HasStatus = true
	if *p.Status == "success" {
		ev.Status = 200
	} else {
		ev.Status = litellmErrorStatus(&p)
	}
	ev.Outcome = fleetwatch.OutcomeFromStatus(ev.Status)
	if t, ok := unixSeconds(p.EndTime.seconds()); ok {
		ev.TS = t
	}
	start, hasStart := finite(p.StartTime.seconds())
	if end, ok := finite(p.EndTime.seconds()); ok && hasStart && end >= start {
		ev.DurationMs, ev.HasDuration = msOf(end-start), true
	} else if rt, ok := finite(p.ResponseTime); ok && rt >= 0 {
		ev.DurationMs, ev.HasDuration = msOf(rt), true
	}
	if first, ok := finite(p.CompletionStartTime.seconds()); ok && hasStart && first >= start && ev.Outcome == fleetwatch.OutcomeOK {
		ev.TTFTMs, ev.HasTTFT = msOf(first-start), true
		if ev.HasDuration && ev.TTFTMs > ev.DurationMs {
			ev.TTFTMs = ev.DurationMs
		}
	}
	if p.PromptTokens != nil {
		ev.InputTokens = tokenCount(*p.PromptTokens)
	}
	if p.CompletionTokens != nil {
		ev.OutputTokens = tokenCount(*p.CompletionTokens)
	}
	if ev.Status == 429 || ev.Status >= 500 {
		header := litellmHeaders(&p)
		hint := retryhint.Parse(ev.Status, header, func() []byte { return litellmErrorBody(&p) }, ev.TS)
		ev.RetryAfterMs, ev.QuotaResetMs, malformed = hint.Ms, hint.QuotaMs, hint.Malformed
		ev.Shed = shed.Reason(ev.Status, header)
	}
	return "", malformed, nil
}

// litellmHeaders returns the header lookup of a payload's logged response
// headers: response_headers, hidden_params.response_headers and
// hidden_params.additional_headers merged (the first naming a header
// wins), keys folded to lower case, "_" to "-" and "llm_provider-" dropped;
// values strings or numbers.
func litellmHeaders(p *litellmPayload) func(string) string {
	raws := []json.RawMessage{p.ResponseHeaders}
	if p.HiddenParams != nil {
		raws = append(raws, p.HiddenParams.ResponseHeaders, p.HiddenParams.AdditionalHeaders)
	}
	headers := map[string]string{}
	for _, raw := range raws {
		var m map[string]json.RawMessage
		if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
			continue
		}
		for k, v := range m {
			k = strings.ReplaceAll(strings.ToLower(k), "_", "-")
			k = strings.TrimPrefix(k, "llm-provider-")
			var str string
			if json.Unmarshal(v, &str) != nil {
				if v = bytes.TrimSpace(v); len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
					continue // null, an object: not a header value
				}
				str = string(v)
			}
			if _, dup := headers[k]; !dup {
				headers[k] = str
			}
		}
	}
	return func(name string) string { return headers[name] }
}

// litellmErrorBody is the provider's error as the payload logs it.
func litellmErrorBody(p *litellmPayload) []byte {
	if ei := p.ErrorInformation; ei != nil && ei.ErrorMessage != nil && *ei.ErrorMessage != "" {
		return []byte(*ei.ErrorMessage)
	}
	if p.ErrorStr != nil {
		return []byte(*p.ErrorStr)
	}
	return nil
}

// litellmErrorStatus is the HTTP status of a failed call: error_code when
// it is one ("429", 503), 0 (timeout) for LiteLLM's Timeout errors, else
// 500.
func litellmErrorStatus(p *litellmPayload) int {
	if ei := p.ErrorInformation; ei != nil {
		code := strings.Trim(string(bytes.TrimSpace(ei.ErrorCode)), `"`)
		if n, err := strconv.Atoi(code); err == nil && n >= 100 && n <= 599 {
			return n
		}
		if ei.ErrorClass != nil && strings.Contains(strings.ToLower(*ei.ErrorClass), "timeout") {
			return 0
		}
	}
	if p.ErrorStr != nil && strings.Contains(strings.ToLower(*p.ErrorStr), "timeout") {
		return 0
	}
	return 500
}

func finite(v *float64) (float64, bool) {
	if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
		return 0, false
	}
	return *v, true
}

// unixSeconds converts a float of unix seconds; false for absent,
// non-finite or non-positive values.
func unixSeconds(v *float64) (time.Time, bool) {
	f, ok := finite(v)
	if !ok || f <= 0 || f > 1e11 {
		return time.Time{}, false
	}
	return time.UnixMicro(int64(math.Round(f * 1e6))).UTC(), true
}

// tokenCount converts an adapter's token count to the event's: a count
// that is negative, not finite or beyond int64 becomes -1, which the
// event's validation rejects as out_of_range as it does on every other
// path (never dropped silently).
func tokenCount(n float64) int64 {
	if math.IsNaN(n) || n < 0 || n >= math.MaxInt64 {
		return -1
	}
	return int64(n)
}

// msOf converts seconds to milliseconds, rounded to the microsecond.
func msOf(seconds float64) float64 { return math.Round(seconds*1e6) / 1e3 }

// splitJSONPayloads calls fn with every JSON value of body: the elements
// of a top-level array, else each line of NDJSON (or the one object, which
// may span lines), with their line numbers. A top-level array that does
// not parse is reported as one bad value.
func splitJSONPayloads(body []byte, fn func(value []byte, line int)) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return
	}
	lead := len(body) - len(bytes.TrimLeft(body, " \t\r\n"))
	baseLine := 1 + bytes.Count(body[:lead], []byte{'\n'})
	if trimmed[0] == '[' {
		var elems []json.RawMessage
		if err := json.Unmarshal(trimmed, &elems); err != nil {
			fn(trimmed, baseLine)
			return
		}
		for _, e := range elems {
			fn(e, baseLine)
		}
		return
	}
	if json.Valid(trimmed) {
		fn(trimmed, baseLine)
		return
	}
	line := 0
	for len(body) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			l, body = body[:i], body[i+1:]
		} else {
			l, body = body, nil
		}
		if l = bytes.TrimSpace(l); len(l) > 0 {
			fn(l, line)
		}
	}
}
