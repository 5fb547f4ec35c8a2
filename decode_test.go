package fleetwatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

// protocolExample is the outcome event of PROTOCOL.md, verbatim.
const protocolExample = `{
  "v": 1,
  "pool": "llama-3.1-70b",
  "backend": "vllm-a",
  "ts": "2026-12-02T07:50:00.123Z",
  "status": 200,
  "outcome": "ok",
  "ttft_ms": 183.2,
  "duration_ms": 2300.5,
  "input_tokens": 1200,
  "output_tokens": 350,
  "cold": false,
  "retry_after_ms": 0,
  "prefix": "9f2c1a",
  "cache_hit": true,
  "fingerprint": "fp_44709d6fcb",
  "source": "edge-3"
}`

// protocolExampleEvent is what protocolExample decodes to.
func protocolExampleEvent() Event {
	return Event{
		Pool: "llama-3.1-70b", Backend: "vllm-a",
		TS:     time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC),
		Status: 200, HasStatus: true, Outcome: OutcomeOK,
		TTFTMs: 183.2, HasTTFT: true, DurationMs: 2300.5, HasDuration: true,
		InputTokens: 1200, OutputTokens: 350,
		Prefix: "9f2c1a", CacheHit: true, Fingerprint: "fp_44709d6fcb", Source: "edge-3",
	}
}

func TestDecodeProtocolExample(t *testing.T) {
	var d Decoder
	var got Event
	if err := d.Decode([]byte(protocolExample), &got); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if diff := cmp.Diff(protocolExampleEvent(), got); diff != "" {
		t.Errorf("Decode (-want +got):\n%s", diff)
	}
	crossCheck(t, []byte(protocolExample), &got)
}

// ev builds an event object from a base of pool "p" and backend "b" and
// the given JSON members, which come after the base ones.
func ev(members ...string) string {
	return `{"pool":"p","backend":"b"` + prefixComma(strings.Join(members, ",")) + `}`
}

func prefixComma(s string) string {
	if s == "" {
		return ""
	}
	return "," + s
}

// base is the event ev() decodes to, with outcome derived from no status.
func base() Event { return Event{Pool: "p", Backend: "b", Outcome: OutcomeTimeout} }

func with(f func(*Event)) Event {
	e := base()
	f(&e)
	return e
}

func TestDecodeValid(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name string
		in   string
		want Event
	}{
		{"minimal", ev(), base()},
		{"surrounding whitespace", " \t\r\n" + ev() + "\n\n ", base()},
		{"v 1", ev(`"v":1`), base()},
		{"v 1.0", ev(`"v":1.0`), base()},
		{"v null", ev(`"v":null`), base()},
		{"members in any order", `{"backend":"b","status":200,"pool":"p"}`,
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 200, true, OutcomeOK })},
		{"pool with slash and dots", `{"pool":"meta-llama/Llama-3.1-70B-Instruct","backend":"b"}`,
			with(func(e *Event) { e.Pool = "meta-llama/Llama-3.1-70B-Instruct" })},
		{"pool with escape", `{"pool":"\u0070","backend":"b"}`, base()},
		{"pool 256 bytes", `{"pool":"` + long(256) + `","backend":"b"}`,
			with(func(e *Event) { e.Pool = long(256) })},
		{"backend url", `{"pool":"p","backend":"http://10.0.0.7:8000/v1"}`,
			with(func(e *Event) { e.Backend = "http://10.0.0.7:8000/v1" })},
		{"backend with space and unicode", `{"pool":"p","backend":"gpu box é"}`,
			with(func(e *Event) { e.Backend = "gpu box é" })},
		{"backend 256 bytes", `{"pool":"p","backend":"` + long(256) + `"}`,
			with(func(e *Event) { e.Backend = long(256) })},
		{"backend escaped quote", `{"pool":"p","backend":"a\"b\\c\/d"}`,
			with(func(e *Event) { e.Backend = `a"b\c/d` })},
		{"backend surrogate pair", `{"pool":"p","backend":"x\ud83d\ude00y"}`,
			with(func(e *Event) { e.Backend = "x😀y" })},
		{"backend BMP escape", `{"pool":"p","backend":"caf\u00E9"}`,
			with(func(e *Event) { e.Backend = "café" })},
		{"source lone surrogate", ev(`"source":"a\ud800b"`),
			with(func(e *Event) { e.Source = "a\uFFFDb" })},
		{"source high surrogate then BMP escape", ev(`"source":"\ud800\u0041"`),
			with(func(e *Event) { e.Source = "\uFFFDA" })},
		{"source with escaped newline", ev(`"source":"a\nb\t"`),
			with(func(e *Event) { e.Source = "a\nb\t" })},

		{"ts ms Z", ev(`"ts":"2026-12-02T07:50:00.123Z"`),
			with(func(e *Event) { e.TS = time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC) })},
		{"ts no fraction", ev(`"ts":"2026-12-02T07:50:00Z"`),
			with(func(e *Event) { e.TS = time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC) })},
		{"ts one fraction digit", ev(`"ts":"2026-12-02T07:50:00.5Z"`),
			with(func(e *Event) { e.TS = time.Date(2026, 12, 2, 7, 50, 0, 500e6, time.UTC) })},
		{"ts nanoseconds truncated to ms", ev(`"ts":"2026-12-02T07:50:00.123999999Z"`),
			with(func(e *Event) { e.TS = time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC) })},
		{"ts offset converted to UTC", ev(`"ts":"2026-12-02T09:50:00.123+02:00"`),
			with(func(e *Event) { e.TS = time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC) })},
		{"ts negative offset across midnight", ev(`"ts":"2026-12-31T23:30:00-01:00"`),
			with(func(e *Event) { e.TS = time.Date(2027, 1, 1, 0, 30, 0, 0, time.UTC) })},
		{"ts leap day", ev(`"ts":"2028-02-29T00:00:00Z"`),
			with(func(e *Event) { e.TS = time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC) })},
		{"ts null", ev(`"ts":null`), base()},

		{"status 200 derives ok", ev(`"status":200`),
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 200, true, OutcomeOK })},
		{"status 0", ev(`"status":0`),
			with(func(e *Event) { e.HasStatus, e.Outcome = true, OutcomeTimeout })},
		{"status 999", ev(`"status":999`),
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 999, true, OutcomeError })},
		{"status -0", ev(`"status":-0`),
			with(func(e *Event) { e.HasStatus, e.Outcome = true, OutcomeTimeout })},
		{"status 429 derives throttled", ev(`"status":429`),
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 429, true, OutcomeThrottled })},
		{"status null", ev(`"status":null`), base()},
		{"outcome overrides status", ev(`"status":200`, `"outcome":"error"`),
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 200, true, OutcomeError })},
		{"outcome without status", ev(`"outcome":"canceled"`),
			with(func(e *Event) { e.Outcome = OutcomeCanceled })},
		{"stalled extension", ev(`"status":0`, `"outcome":"stalled"`),
			with(func(e *Event) { e.HasStatus, e.Outcome = true, OutcomeStalled })},
		{"outcome null derives", ev(`"outcome":null`, `"status":503`),
			with(func(e *Event) { e.Status, e.HasStatus, e.Outcome = 503, true, OutcomeError })},

		{"ttft 0", ev(`"ttft_ms":0`), with(func(e *Event) { e.HasTTFT = true })},
		{"ttft max", ev(`"ttft_ms":3600000`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 3_600_000, true })},
		{"ttft max exponent", ev(`"ttft_ms":3.6e6`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 3_600_000, true })},
		{"ttft fraction", ev(`"ttft_ms":0.125`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 0.125, true })},
		{"ttft long fraction", ev(`"ttft_ms":183.20000000000000284`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 183.2, true })},
		{"ttft tiny", ev(`"ttft_ms":1E-7`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 1e-7, true })},
		{"ttft underflow is 0", ev(`"ttft_ms":1e-400`), with(func(e *Event) { e.HasTTFT = true })},
		{"ttft null", ev(`"ttft_ms":null`), base()},
		{"duration", ev(`"duration_ms":2300.5`), with(func(e *Event) { e.DurationMs, e.HasDuration = 2300.5, true })},
		{"tokens", ev(`"input_tokens":1200`, `"output_tokens":350`),
			with(func(e *Event) { e.InputTokens, e.OutputTokens = 1200, 350 })},
		{"tokens max int64", ev(`"input_tokens":9223372036854775807`),
			with(func(e *Event) { e.InputTokens = math.MaxInt64 })},
		{"tokens null", ev(`"input_tokens":null`, `"output_tokens":null`), base()},
		{"cold and cache_hit true", ev(`"cold":true`, `"cache_hit":true`),
			with(func(e *Event) { e.Cold, e.CacheHit = true, true })},
		{"cold and cache_hit false", ev(`"cold":false`, `"cache_hit":false`), base()},
		{"cold null", ev(`"cold":null`), base()},
		{"retry_after_ms", ev(`"retry_after_ms":1500.5`), with(func(e *Event) { e.RetryAfterMs = 1500.5 })},
		{"prefix 128 bytes", ev(`"prefix":"` + long(128) + `"`), with(func(e *Event) { e.Prefix = long(128) })},
		{"fingerprint 256 bytes", ev(`"fingerprint":"` + long(256) + `"`), with(func(e *Event) { e.Fingerprint = long(256) })},
		{"source 256 bytes", ev(`"source":"` + long(256) + `"`), with(func(e *Event) { e.Source = long(256) })},
		{"load", ev(`"running":12`, `"waiting":3`, `"kv_cache_usage":0.42`),
			with(func(e *Event) {
				e.Running, e.HasRunning, e.Waiting, e.HasWaiting = 12, true, 3, true
				e.KVCacheUsage, e.HasKVCache = 0.42, true
			})},
		{"load zero is present", ev(`"running":0`, `"waiting":0`, `"kv_cache_usage":0`),
			with(func(e *Event) { e.HasRunning, e.HasWaiting, e.HasKVCache = true, true, true })},
		{"kv_cache_usage 1", ev(`"kv_cache_usage":1`), with(func(e *Event) { e.KVCacheUsage, e.HasKVCache = 1, true })},
		{"load null", ev(`"running":null`, `"waiting":null`, `"kv_cache_usage":null`), base()},
		{"checked in passing", ev(`"stream_error":"error_event"`, `"model_mismatch":"gpt-4o-mini"`, `"tool_call_broken":true`, `"fake_stream":true`),
			with(func(e *Event) {
				e.StreamError, e.ModelMismatch, e.ToolCallBroken, e.FakeStream = StreamErrorEvent, "gpt-4o-mini", true, true
			})},
		{"stream_error of a newer proxy", ev(`"stream_error":"truncated_json"`), with(func(e *Event) { e.StreamError = "truncated_json" })},
		{"checked in passing null", ev(`"stream_error":null`, `"model_mismatch":null`, `"tool_call_broken":null`, `"fake_stream":null`), base()},
		{"model_mismatch 256 bytes", ev(`"model_mismatch":"` + long(256) + `"`), with(func(e *Event) { e.ModelMismatch = long(256) })},
		{"quota and shed", ev(`"quota_reset_ms":274579000`, `"shed":"queue_full"`),
			with(func(e *Event) { e.QuotaResetMs, e.Shed = 274579000, "queue_full" })},
		{"quota_reset_ms 30 days", ev(`"quota_reset_ms":2592000000`), with(func(e *Event) { e.QuotaResetMs = MaxQuotaResetMs })},
		{"quota and shed null", ev(`"quota_reset_ms":null`, `"shed":null`), base()},

		{"unknown fields skipped", `{"x":{"a":[1,-2.5e+3,{"b":null}],"c":"\"}\u1234"},"pool":"p","y":[[],{}],"backend":"b","z":true,"w":"s"}`, base()},
		{"unknown field case differs", ev(`"Pool":7`, `"TTFT_MS":"x"`), base()},
		{"empty object members spaced", "{ \"pool\" : \"p\" ,\n\t\"backend\"\r\n:\"b\" }", base()},
		{"duplicate key last wins", ev(`"ttft_ms":-1`, `"ttft_ms":5`), with(func(e *Event) { e.TTFTMs, e.HasTTFT = 5, true })},
		{"duplicate key null last wins", ev(`"ttft_ms":5`, `"ttft_ms":null`), base()},
		{"duplicate pool", `{"pool":"..","pool":"q","backend":"b"}`, with(func(e *Event) { e.Pool = "q" })},
		{"key with escape", `{"p\u006fol":"p","backend":"b"}`, base()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var got Event
			if err := d.Decode([]byte(tt.in), &got); err != nil {
				t.Fatalf("Decode(%s): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decode(%s) (-want +got):\n%s", tt.in, diff)
			}
			crossCheck(t, []byte(tt.in), &got)
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name  string
		in    string
		err   error
		field string
	}{
		{"v 2", ev(`"v":2`), ErrBadVersion, "v"},
		{"v 0", ev(`"v":0`), ErrBadVersion, "v"},
		{"v -1", ev(`"v":-1`), ErrBadVersion, "v"},
		{"v huge", ev(`"v":1e999`), ErrBadVersion, "v"},
		{"v string", ev(`"v":"1"`), ErrWrongType, "v"},

		{"pool missing", `{"backend":"b"}`, ErrMissingField, "pool"},
		{"pool null", `{"pool":null,"backend":"b"}`, ErrMissingField, "pool"},
		{"pool null after value", `{"pool":"p","backend":"b","pool":null}`, ErrMissingField, "pool"},
		{"pool empty", `{"pool":"","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool leading dot", `{"pool":".a","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool trailing dot", `{"pool":"a.","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool double dot", `{"pool":"a..b","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool space", `{"pool":"a b","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool 257 bytes", `{"pool":"` + long(257) + `","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool non-ASCII", `{"pool":"é","backend":"b"}`, ErrInvalidPool, "pool"},
		{"pool number", `{"pool":7,"backend":"b"}`, ErrWrongType, "pool"},
		{"pool object", `{"pool":{"a":1},"backend":"b"}`, ErrWrongType, "pool"},

		{"backend missing", `{"pool":"p"}`, ErrMissingField, "backend"},
		{"backend null", `{"pool":"p","backend":null}`, ErrMissingField, "backend"},
		{"backend empty", `{"pool":"p","backend":""}`, ErrInvalidBackend, "backend"},
		{"backend 257 bytes", `{"pool":"p","backend":"` + long(257) + `"}`, ErrInvalidBackend, "backend"},
		{"backend 300 bytes", `{"pool":"p","backend":"` + long(300) + `"}`, ErrInvalidBackend, "backend"},
		{"backend escaped newline", `{"pool":"p","backend":"a\nb"}`, ErrInvalidBackend, "backend"},
		{"backend escaped NUL", `{"pool":"p","backend":"\u0000"}`, ErrInvalidBackend, "backend"},
		{"backend DEL", "{\"pool\":\"p\",\"backend\":\"a\x7f\"}", ErrInvalidBackend, "backend"},
		{"backend invalid UTF-8", "{\"pool\":\"p\",\"backend\":\"a\xff\"}", ErrInvalidBackend, "backend"},
		{"backend bool", `{"pool":"p","backend":true}`, ErrWrongType, "backend"},
		{"backend array", `{"pool":"p","backend":["a"]}`, ErrWrongType, "backend"},

		{"ts not a time", ev(`"ts":"yesterday"`), ErrBadValue, "ts"},
		{"ts empty", ev(`"ts":""`), ErrBadValue, "ts"},
		{"ts Feb 30", ev(`"ts":"2026-02-30T00:00:00Z"`), ErrBadValue, "ts"},
		{"ts Feb 29 non-leap", ev(`"ts":"2026-02-29T00:00:00Z"`), ErrBadValue, "ts"},
		{"ts hour 24", ev(`"ts":"2026-02-01T24:00:00Z"`), ErrBadValue, "ts"},
		{"ts month 13", ev(`"ts":"2026-13-01T00:00:00Z"`), ErrBadValue, "ts"},
		{"ts no zone", ev(`"ts":"2026-02-01T00:00:00"`), ErrBadValue, "ts"},
		{"ts empty fraction", ev(`"ts":"2026-02-01T00:00:00.Z"`), ErrBadValue, "ts"},
		{"ts date only", ev(`"ts":"2026-02-01"`), ErrBadValue, "ts"},
		{"ts before year 0 in UTC", ev(`"ts":"0000-01-01T00:00:00+01:00"`), ErrBadValue, "ts"},
		{"ts after year 9999 in UTC", ev(`"ts":"9999-12-31T23:30:00-01:00"`), ErrBadValue, "ts"},
		{"ts number", ev(`"ts":1733125800`), ErrWrongType, "ts"},

		{"status 1000", ev(`"status":1000`), ErrOutOfRange, "status"},
		{"status -1", ev(`"status":-1`), ErrOutOfRange, "status"},
		{"status overflow", ev(`"status":99999999999999999999`), ErrOutOfRange, "status"},
		{"status fraction", ev(`"status":200.5`), ErrWrongType, "status"},
		{"status 200.0", ev(`"status":200.0`), ErrWrongType, "status"},
		{"status exponent", ev(`"status":2e2`), ErrWrongType, "status"},
		{"status string", ev(`"status":"200"`), ErrWrongType, "status"},
		{"status bool", ev(`"status":true`), ErrWrongType, "status"},

		{"outcome unknown", ev(`"outcome":"success"`), ErrBadValue, "outcome"},
		{"outcome upper case", ev(`"outcome":"OK"`), ErrBadValue, "outcome"},
		{"outcome empty", ev(`"outcome":""`), ErrBadValue, "outcome"},
		{"outcome number", ev(`"outcome":1`), ErrWrongType, "outcome"},

		{"ttft negative", ev(`"ttft_ms":-1`), ErrOutOfRange, "ttft_ms"},
		{"ttft negative tiny", ev(`"ttft_ms":-0.001`), ErrOutOfRange, "ttft_ms"},
		{"ttft above an hour", ev(`"ttft_ms":3600000.001`), ErrOutOfRange, "ttft_ms"},
		{"ttft 1e309", ev(`"ttft_ms":1e309`), ErrOutOfRange, "ttft_ms"},
		{"ttft -1e309", ev(`"ttft_ms":-1e309`), ErrOutOfRange, "ttft_ms"},
		{"ttft string", ev(`"ttft_ms":"183.2"`), ErrWrongType, "ttft_ms"},
		{"ttft NaN string", ev(`"ttft_ms":"NaN"`), ErrWrongType, "ttft_ms"},
		{"ttft bool", ev(`"ttft_ms":false`), ErrWrongType, "ttft_ms"},
		{"duration negative", ev(`"duration_ms":-5`), ErrOutOfRange, "duration_ms"},
		{"duration 1e309", ev(`"duration_ms":1e309`), ErrOutOfRange, "duration_ms"},
		{"duration string", ev(`"duration_ms":"5"`), ErrWrongType, "duration_ms"},

		{"input_tokens negative", ev(`"input_tokens":-1`), ErrOutOfRange, "input_tokens"},
		{"input_tokens fraction", ev(`"input_tokens":1.5`), ErrWrongType, "input_tokens"},
		{"input_tokens exponent", ev(`"input_tokens":1e3`), ErrWrongType, "input_tokens"},
		{"input_tokens overflow", ev(`"input_tokens":9223372036854775808`), ErrOutOfRange, "input_tokens"},
		{"input_tokens string", ev(`"input_tokens":"5"`), ErrWrongType, "input_tokens"},
		{"output_tokens negative", ev(`"output_tokens":-350`), ErrOutOfRange, "output_tokens"},
		{"output_tokens fraction", ev(`"output_tokens":0.5`), ErrWrongType, "output_tokens"},
		{"running negative", ev(`"running":-1`), ErrOutOfRange, "running"},
		{"running fraction", ev(`"running":2.5`), ErrWrongType, "running"},
		{"waiting negative", ev(`"waiting":-3`), ErrOutOfRange, "waiting"},
		{"waiting string", ev(`"waiting":"3"`), ErrWrongType, "waiting"},
		{"kv_cache_usage above 1", ev(`"kv_cache_usage":1.01`), ErrOutOfRange, "kv_cache_usage"},
		{"kv_cache_usage negative", ev(`"kv_cache_usage":-0.1`), ErrOutOfRange, "kv_cache_usage"},
		{"kv_cache_usage percent", ev(`"kv_cache_usage":"42%"`), ErrWrongType, "kv_cache_usage"},

		{"cold number", ev(`"cold":1`), ErrWrongType, "cold"},
		{"cold string", ev(`"cold":"true"`), ErrWrongType, "cold"},
		{"cache_hit number", ev(`"cache_hit":0`), ErrWrongType, "cache_hit"},

		{"retry_after_ms negative", ev(`"retry_after_ms":-1`), ErrOutOfRange, "retry_after_ms"},
		{"retry_after_ms too big", ev(`"retry_after_ms":3600001`), ErrOutOfRange, "retry_after_ms"},
		{"retry_after_ms 1e309", ev(`"retry_after_ms":1e309`), ErrOutOfRange, "retry_after_ms"},
		{"retry_after_ms string", ev(`"retry_after_ms":"5"`), ErrWrongType, "retry_after_ms"},

		{"prefix 129 bytes", ev(`"prefix":"` + long(129) + `"`), ErrTooLong, "prefix"},
		{"prefix invalid UTF-8", ev("\"prefix\":\"\xc3\""), ErrBadValue, "prefix"},
		{"prefix number", ev(`"prefix":5`), ErrWrongType, "prefix"},
		{"fingerprint 257 bytes", ev(`"fingerprint":"` + long(257) + `"`), ErrTooLong, "fingerprint"},
		{"fingerprint invalid UTF-8", ev("\"fingerprint\":\"\xed\xa0\x80\""), ErrBadValue, "fingerprint"},
		{"fingerprint array", ev(`"fingerprint":[]`), ErrWrongType, "fingerprint"},
		{"source 257 bytes", ev(`"source":"` + long(257) + `"`), ErrTooLong, "source"},
		{"source escaped 257 bytes", ev(`"source":"` + strings.Repeat(`\u0078`, 257) + `"`), ErrTooLong, "source"},
		{"source invalid UTF-8", ev("\"source\":\"\x80\""), ErrBadValue, "source"},
		{"source object", ev(`"source":{}`), ErrWrongType, "source"},
		{"stream_error 65 bytes", ev(`"stream_error":"` + long(65) + `"`), ErrTooLong, "stream_error"},
		{"stream_error bool", ev(`"stream_error":true`), ErrWrongType, "stream_error"},
		{"quota_reset_ms over 30 days", ev(`"quota_reset_ms":2592000001`), ErrOutOfRange, "quota_reset_ms"},
		{"quota_reset_ms negative", ev(`"quota_reset_ms":-1`), ErrOutOfRange, "quota_reset_ms"},
		{"quota_reset_ms string", ev(`"quota_reset_ms":"3d"`), ErrWrongType, "quota_reset_ms"},
		{"retry_after_ms over an hour", ev(`"retry_after_ms":3600001`), ErrOutOfRange, "retry_after_ms"},
		{"shed 65 bytes", ev(`"shed":"` + long(65) + `"`), ErrTooLong, "shed"},
		{"shed number", ev(`"shed":1`), ErrWrongType, "shed"},
		{"model_mismatch 257 bytes", ev(`"model_mismatch":"` + long(257) + `"`), ErrTooLong, "model_mismatch"},
		{"tool_call_broken string", ev(`"tool_call_broken":"yes"`), ErrWrongType, "tool_call_broken"},
		{"fake_stream number", ev(`"fake_stream":1`), ErrWrongType, "fake_stream"},

		{"duplicate key last bad", ev(`"ttft_ms":5`, `"ttft_ms":-1`), ErrOutOfRange, "ttft_ms"},
		{"first field error by offset", ev(`"status":"x"`, `"ttft_ms":-1`), ErrWrongType, "status"},
		{"field error before missing", `{"ttft_ms":-1}`, ErrOutOfRange, "ttft_ms"},

		// Syntax: anything that is not exactly one JSON object.
		{"empty", ``, ErrBadJSON, ""},
		{"blank", " \n\t", ErrBadJSON, ""},
		{"null", `null`, ErrBadJSON, ""},
		{"array", `[` + ev() + `]`, ErrBadJSON, ""},
		{"number", `1`, ErrBadJSON, ""},
		{"string", `"pool"`, ErrBadJSON, ""},
		{"unterminated object", `{"pool":"p","backend":"b"`, ErrBadJSON, ""},
		{"unterminated string", `{"pool":"p`, ErrBadJSON, ""},
		{"trailing comma", `{"pool":"p","backend":"b",}`, ErrBadJSON, ""},
		{"missing colon", `{"pool" "p","backend":"b"}`, ErrBadJSON, ""},
		{"missing comma", `{"pool":"p" "backend":"b"}`, ErrBadJSON, ""},
		{"single quotes", `{'pool':'p'}`, ErrBadJSON, ""},
		{"bare key", `{pool:"p"}`, ErrBadJSON, ""},
		{"trailing garbage", ev() + ` x`, ErrBadJSON, ""},
		{"trailing garbage after field error", ev(`"ttft_ms":-1`) + `}`, ErrBadJSON, ""},
		{"two objects", ev() + ev(), ErrBadJSON, ""},
		{"two lines", ev() + "\n" + ev(), ErrBadJSON, ""},
		{"raw newline in string", "{\"pool\":\"a\nb\",\"backend\":\"b\"}", ErrBadJSON, ""},
		{"raw tab in string", "{\"pool\":\"p\",\"backend\":\"b\",\"x\":\"\t\"}", ErrBadJSON, ""},
		{"bad escape", ev(`"source":"\x"`), ErrBadJSON, ""},
		{"short unicode escape", ev(`"source":"\u12"`), ErrBadJSON, ""},
		{"bad unicode escape", ev(`"source":"\u12g4"`), ErrBadJSON, ""},
		{"bad escape in unknown", ev(`"x":"\q"`), ErrBadJSON, ""},
		{"leading zero", ev(`"status":0200`), ErrBadJSON, ""},
		{"trailing dot", ev(`"ttft_ms":1.`), ErrBadJSON, ""},
		{"leading dot", ev(`"ttft_ms":.5`), ErrBadJSON, ""},
		{"lone minus", ev(`"ttft_ms":-`), ErrBadJSON, ""},
		{"plus sign", ev(`"ttft_ms":+1`), ErrBadJSON, ""},
		{"empty exponent", ev(`"ttft_ms":1e`), ErrBadJSON, ""},
		{"NaN literal", ev(`"ttft_ms":NaN`), ErrBadJSON, ""},
		{"Infinity literal", ev(`"ttft_ms":Infinity`), ErrBadJSON, ""},
		{"hex number", ev(`"status":0x10`), ErrBadJSON, ""},
		{"truncated true", ev(`"cold":tru`), ErrBadJSON, ""},
		{"truncated null", ev(`"ttft_ms":nul`), ErrBadJSON, ""},
		{"capital True", ev(`"cold":True`), ErrBadJSON, ""},
		{"unknown bad nested", ev(`"x":{"a":[1,2}}`), ErrBadJSON, ""},
		{"unknown bad nested key", ev(`"x":{1:2}`), ErrBadJSON, ""},
		{"wrong type with bad JSON", ev(`"ttft_ms":[1,]`), ErrBadJSON, ""},
		{"byte order mark", "\ufeff" + ev(), ErrBadJSON, ""},
		{"comment", ev() + ` // ok`, ErrBadJSON, ""},
		{"deep nesting", ev(`"x":` + strings.Repeat("[", maxNesting+1) + strings.Repeat("]", maxNesting+1)), ErrBadJSON, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var got Event
			err := d.Decode([]byte(tt.in), &got)
			if !errors.Is(err, tt.err) {
				t.Fatalf("Decode(%.80s) = %v, want %v", tt.in, err, tt.err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(%.80s) = %T, want *DecodeError", tt.in, err)
			}
			if de.Field != tt.field {
				t.Errorf("Decode(%.80s).Field = %q, want %q", tt.in, de.Field, tt.field)
			}
			if n := sentinelsIn(err); n != 1 {
				t.Errorf("Decode(%.80s) wraps %d sentinels, want 1", tt.in, n)
			}
			if de.Reason() == "" {
				t.Errorf("Decode(%.80s) has no Reason", tt.in)
			}
			if de.Offset < 0 || de.Offset > len(tt.in) {
				t.Errorf("Decode(%.80s).Offset = %d, outside the input", tt.in, de.Offset)
			}
		})
	}
}

var sentinels = []error{
	ErrBadJSON, ErrMissingField, ErrInvalidPool, ErrInvalidBackend, ErrWrongType,
	ErrOutOfRange, ErrTooLong, ErrBadValue, ErrBadVersion,
}

func sentinelsIn(err error) int {
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	return n
}

func TestDecodeErrorDetails(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want DecodeError
		text string
	}{
		{"out of range reads like the protocol", ev(`"ttft_ms":-1`),
			DecodeError{Err: ErrOutOfRange, Field: "ttft_ms", Offset: 36}, "ttft_ms out of range"},
		{"source read before the problem", ev(`"source":"edge-3"`, `"status":1000`),
			DecodeError{Err: ErrOutOfRange, Field: "status", Offset: 53, Source: "edge-3"}, "status out of range"},
		{"source read after the problem", ev(`"status":1000`, `"source":"edge-3"`),
			DecodeError{Err: ErrOutOfRange, Field: "status", Offset: 35, Source: "edge-3"}, "status out of range"},
		{"missing field", `{"backend":"b"}`,
			DecodeError{Err: ErrMissingField, Field: "pool"}, "missing field pool"},
		{"invalid pool", `{"pool":"a..b","backend":"b"}`,
			DecodeError{Err: ErrInvalidPool, Field: "pool", Offset: 8}, "invalid pool id"},
		{"too long", ev(`"prefix":"` + strings.Repeat("a", 129) + `"`),
			DecodeError{Err: ErrTooLong, Field: "prefix", Offset: 35}, "prefix too long"},
		{"syntax error offset", `{"pool":x}`,
			DecodeError{Err: ErrBadJSON, Offset: 8}, "bad json at offset 8"},
		{"trailing garbage offset", `{"pool":"p","backend":"b"} }`,
			DecodeError{Err: ErrBadJSON, Offset: 27}, "bad json at offset 27"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var got Event
			err := d.Decode([]byte(tt.in), &got)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(%s) = %v, want a *DecodeError", tt.in, err)
			}
			if tt.want.Offset != strings.LastIndexAny(tt.in[:tt.want.Offset+1], `:{} `)+1 && tt.want.Field != "" && tt.want.Err != ErrMissingField {
				t.Fatalf("test case: offset %d is not at a value", tt.want.Offset)
			}
			if diff := cmp.Diff(tt.want, *de, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
				t.Errorf("Decode(%s) error (-want +got):\n%s", tt.in, diff)
			}
			if got := de.Error(); got != tt.text {
				t.Errorf("Error() = %q, want %q", got, tt.text)
			}
		})
	}
}

func TestDecoderReuse(t *testing.T) {
	// A Decoder must not carry state from one event to the next, and the
	// interned ids must be the same strings across events.
	var d Decoder
	var first, second Event
	if err := d.Decode([]byte(protocolExample), &first); err != nil {
		t.Fatal(err)
	}
	if err := d.Decode([]byte(ev(`"ttft_ms":-1`)), &second); err == nil {
		t.Fatal("Decode of a bad event succeeded")
	}
	second = protocolExampleEvent() // Decode overwrites all of ev
	if err := d.Decode([]byte(`{"pool":"llama-3.1-70b","backend":"vllm-a"}`), &second); err != nil {
		t.Fatal(err)
	}
	want := Event{Pool: "llama-3.1-70b", Backend: "vllm-a", Outcome: OutcomeTimeout}
	if diff := cmp.Diff(want, second); diff != "" {
		t.Errorf("second Decode (-want +got):\n%s", diff)
	}
	if unsafeStringData(first.Pool) != unsafeStringData(second.Pool) {
		t.Errorf("pool id was not interned")
	}
}

func TestDecodeInternTableBounded(t *testing.T) {
	var d Decoder
	var e Event
	for i := range maxInterned + 10 {
		in := fmt.Sprintf(`{"pool":"p","backend":"b-%d"}`, i)
		if err := d.Decode([]byte(in), &e); err != nil {
			t.Fatal(err)
		}
		if want := "b-" + strconv.Itoa(i); e.Backend != want {
			t.Fatalf("Backend = %q, want %q", e.Backend, want)
		}
	}
	table := &d.tables[tableBackend]
	if n := len(table.m); n > maxInterned {
		t.Errorf("intern table holds %d ids, want at most %d", n, maxInterned)
	}
	if table.bytes > maxInternedBytes {
		t.Errorf("intern table holds %d bytes, want at most %d", table.bytes, maxInternedBytes)
	}
}

func TestDecodeAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	tests := []struct {
		name string
		in   string
		max  float64
	}{
		{"protocol example", compactExample, 1}, // the prefix string
		{"minimal", minimalEvent, 0},
		{"pretty protocol example", protocolExample, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var e Event
			data := []byte(tt.in)
			if err := d.Decode(data, &e); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(100, func() { _ = d.Decode(data, &e) }); n > tt.max {
				t.Errorf("Decode allocates %v times per event, want at most %v", n, tt.max)
			}
		})
	}
}

// compactExample is protocolExample as a proxy would publish it.
var compactExample = func() string {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(protocolExample)); err != nil {
		panic(err)
	}
	return b.String()
}()

const minimalEvent = `{"pool":"llama-3.1-70b","backend":"vllm-a","status":200,"ttft_ms":183.2}`

func TestParseTimeFastPathAgreesWithTimeParse(t *testing.T) {
	for _, s := range []string{
		"2026-12-02T07:50:00.123Z", "2026-12-02T07:50:00Z", "2026-12-02T07:50:00.1Z",
		"2026-12-02T07:50:00.12Z", "2026-12-02T07:50:00.1234Z", "2026-12-02T07:50:00.000000001Z",
		"2026-12-02T07:50:00.9999999999999Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z",
		"2000-02-29T12:00:00Z", "1900-02-28T12:00:00Z", "2026-04-30T23:59:59Z",
	} {
		fast, ok := parseTimeUTC([]byte(s))
		if !ok {
			t.Errorf("parseTimeUTC(%s) failed", s)
			continue
		}
		ref, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("time.Parse(%s): %v", s, err)
		}
		ref = ref.Add(-time.Duration(ref.Nanosecond() % 1e6))
		if !fast.Equal(ref) {
			t.Errorf("parseTimeUTC(%s) = %v, time.Parse says %v", s, fast, ref)
		}
	}
	for _, s := range []string{
		"2026-12-02T07:50:60Z", "2026-12-02T07:60:00Z", "2026-00-02T07:50:00Z",
		"2026-12-00T07:50:00Z", "2026-11-31T07:50:00Z", "1900-02-29T12:00:00Z", "2026-12-02T07:50:00.1a2Z",
		"2026-12-02 07:50:00Z", "20x6-12-02T07:50:00Z",
	} {
		if _, ok := parseTimeUTC([]byte(s)); ok {
			t.Errorf("parseTimeUTC(%s) succeeded, want failure", s)
		}
		if _, err := time.Parse(time.RFC3339Nano, s); err == nil {
			t.Errorf("time.Parse(%s) succeeded; the fast path must not be stricter", s)
		}
	}
}

func TestDaysSinceEpochAgreesWithTime(t *testing.T) {
	check := func(day time.Time) {
		want := day.Unix() / 86400 // the days are whole: no rounding
		if got := daysSinceEpoch(day.Year(), int(day.Month()), day.Day()); got != want {
			t.Fatalf("daysSinceEpoch(%s) = %d, want %d", day.Format(time.DateOnly), got, want)
		}
	}
	// Every day around today's century boundaries, every 7th elsewhere.
	for day := time.Date(1896, 1, 1, 0, 0, 0, 0, time.UTC); day.Year() <= 2104; day = day.AddDate(0, 0, 1) {
		check(day)
	}
	for day := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC); day.Year() <= 9999; day = day.AddDate(0, 0, 7) {
		check(day)
	}
	check(time.Date(0, 2, 29, 0, 0, 0, 0, time.UTC))
	check(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
}

func TestParseFloatAgreesWithStrconv(t *testing.T) {
	for _, s := range []string{
		"0", "-0", "1", "183.2", "2300.5", "0.1", "0.3", "123456789012345", "1234567890123456",
		"0.000000000000001", "99999999999999.9", "3600000", "3600000.0000001", "1e2", "1.5E-3",
		"179769313486231570000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
		"2.2250738585072011e-308", "4.9e-324", "1e-400", "1e400",
	} {
		ref, refErr := strconv.ParseFloat(s, 64)
		got, ok := parseFloat([]byte(s))
		if ok != (refErr == nil) || (ok && math.Float64bits(got) != math.Float64bits(ref)) {
			t.Errorf("parseFloat(%s) = %v, %v; strconv says %v, %v", s, got, ok, ref, refErr)
		}
	}
}

func TestDecodeBatch(t *testing.T) {
	type call struct {
		Line    string
		Backend string
		Err     error
		Field   string
		Offset  int
	}
	good := func(backend string) string { return `{"pool":"p","backend":"` + backend + `"}` }
	tests := []struct {
		name    string
		in      string
		want    []call
		ok, bad int
	}{
		{"empty", "", nil, 0, 0},
		{"blank lines only", "\n \r\n\t\n", nil, 0, 0},
		{"single object", good("a"), []call{{Line: good("a"), Backend: "a"}}, 1, 0},
		{"single object with newline", good("a") + "\n", []call{{Line: good("a"), Backend: "a"}}, 1, 0},
		{"pretty single object", protocolExample, []call{{Line: protocolExample, Backend: "vllm-a"}}, 1, 0},
		{
			"bad line in the middle",
			good("a") + "\n" + ev(`"ttft_ms":-1`) + "\n" + good("c") + "\n",
			[]call{
				{Line: good("a"), Backend: "a"},
				{Line: ev(`"ttft_ms":-1`), Backend: "b", Err: ErrOutOfRange, Field: "ttft_ms", Offset: 36},
				{Line: good("c"), Backend: "c"},
			}, 2, 1,
		},
		{
			"syntax error resumes on the next line",
			good("a") + "\n{\"pool\":\"p\",\n" + good("c") + "\r\n\n\n" + good("d"),
			[]call{
				{Line: good("a"), Backend: "a"},
				{Line: `{"pool":"p",`, Backend: "", Err: ErrBadJSON, Offset: 12},
				{Line: good("c"), Backend: "c"},
				{Line: good("d"), Backend: "d"},
			}, 3, 1,
		},
		{
			"two objects on one line",
			good("a") + " " + good("b") + "\n" + good("c"),
			[]call{
				{Line: good("a") + " " + good("b"), Backend: "a", Err: ErrBadJSON, Offset: 27},
				{Line: good("c"), Backend: "c"},
			}, 1, 1,
		},
		{
			"garbage lines",
			"hello\n" + good("a") + "\n[1]\n",
			[]call{
				{Line: "hello", Err: ErrBadJSON},
				{Line: good("a"), Backend: "a"},
				{Line: "[1]", Err: ErrBadJSON},
			}, 1, 2,
		},
		{
			"pretty objects are not NDJSON",
			"{\n\"pool\":\"p\",\"backend\":\"a\"}\n" + good("b"),
			[]call{
				{Line: "{", Err: ErrBadJSON, Offset: 1},
				{Line: `"pool":"p","backend":"a"}`, Err: ErrBadJSON},
				{Line: good("b"), Backend: "b"},
			}, 1, 2,
		},
		{
			"lines that each open an array",
			strings.Repeat(`{"x":[`+"\n", 3) + good("a"),
			[]call{
				{Line: `{"x":[`, Err: ErrBadJSON, Offset: 6},
				{Line: `{"x":[`, Err: ErrBadJSON, Offset: 6},
				{Line: `{"x":[`, Err: ErrBadJSON, Offset: 6},
				{Line: good("a"), Backend: "a"},
			}, 1, 3,
		},
		{
			"offsets count from the object, not the payload",
			"\n  " + ev(`"ttft_ms":-1`) + "\n",
			[]call{{Line: ev(`"ttft_ms":-1`), Backend: "b", Err: ErrOutOfRange, Field: "ttft_ms", Offset: 36}}, 0, 1,
		},
		{
			"offsets of a missing field",
			" {} ",
			[]call{{Line: "{}", Err: ErrMissingField, Field: "pool"}}, 0, 1,
		},
		{
			"leading blanks on a line",
			good("a") + "\n \t" + good("b") + "\n",
			[]call{{Line: good("a"), Backend: "a"}, {Line: good("b"), Backend: "b"}}, 2, 0,
		},
		{
			"missing field and trailing spaces",
			`{"pool":"p"}  ` + "\n" + good("a") + "\t \r\n",
			[]call{
				{Line: `{"pool":"p"}`, Err: ErrMissingField, Field: "backend"},
				{Line: good("a"), Backend: "a"},
			}, 1, 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decoder
			var got []call
			var evs []*Event
			ok, bad := d.DecodeBatch([]byte(tt.in), func(line []byte, e *Event, err error) {
				c := call{Line: string(line), Backend: e.Backend}
				if err != nil {
					var de *DecodeError
					if !errors.As(err, &de) {
						t.Fatalf("error %v is not a *DecodeError", err)
					}
					c.Err, c.Field, c.Offset = de.Err, de.Field, de.Offset
				}
				got = append(got, c)
				evs = append(evs, e)
			})
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if ok != tt.ok || bad != tt.bad {
				t.Errorf("DecodeBatch = %d ok, %d bad; want %d, %d", ok, bad, tt.ok, tt.bad)
			}
			for _, e := range evs {
				if e != evs[0] {
					t.Errorf("the event passed to fn is not reused")
					break
				}
			}
		})
	}
}

func TestDecodeBatchMatchesDecode(t *testing.T) {
	// Every line of an NDJSON batch decodes as Decode decodes it alone.
	lines := []string{
		compactExample, minimalEvent, ev(`"ttft_ms":-1`), `{"pool":"p"}`, `{"pool":`,
		ev(`"outcome":"throttled"`, `"source":"s"`), ev(`"ts":"2026-12-02T09:50:00+02:00"`), `[]`,
	}
	payload := []byte(strings.Join(lines, "\n"))
	var batch, single Decoder
	i := 0
	batch.DecodeBatch(payload, func(line []byte, got *Event, gotErr error) {
		if string(line) != lines[i] {
			t.Fatalf("line %d = %q, want %q", i, line, lines[i])
		}
		var want Event
		wantErr := single.Decode([]byte(lines[i]), &want)
		if diff := cmp.Diff(viewError(wantErr), viewError(gotErr)); diff != "" {
			t.Errorf("line %d error (-want +got):\n%s", i, diff)
		}
		if wantErr == nil {
			if diff := cmp.Diff(want, *got); diff != "" {
				t.Errorf("line %d (-want +got):\n%s", i, diff)
			}
		}
		i++
	})
	if i != len(lines) {
		t.Errorf("fn called %d times, want %d", i, len(lines))
	}
}

// crossCheck decodes data with encoding/json into a map, the reference
// reading of the JSON, and checks that every known field agrees with ev.
func crossCheck(t *testing.T, data []byte, ev *Event) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("encoding/json rejects %q, which Decode accepted: %v", data, err)
	}
	want := Event{}
	str := func(k string) string { s, _ := m[k].(string); return s }
	num := func(k string) (json.Number, bool) { n, ok := m[k].(json.Number); return n, ok }
	want.Pool, want.Backend = str("pool"), str("backend")
	want.Prefix, want.Fingerprint, want.Source = str("prefix"), str("fingerprint"), str("source")
	want.StreamError, want.ModelMismatch = str("stream_error"), str("model_mismatch")
	want.Shed = str("shed")
	if n, ok := num("quota_reset_ms"); ok {
		want.QuotaResetMs, _ = n.Float64()
	}
	want.ToolCallBroken, _ = m["tool_call_broken"].(bool)
	want.FakeStream, _ = m["fake_stream"].(bool)
	if s := str("ts"); s != "" {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("ts %q: %v", s, err)
		}
		ts = ts.UTC()
		want.TS = ts.Add(-time.Duration(ts.Nanosecond() % 1e6))
	}
	if n, ok := num("status"); ok {
		v, err := n.Int64()
		if err != nil {
			t.Fatalf("status %v: %v", n, err)
		}
		want.Status, want.HasStatus = int(v), true
	}
	ints := map[string]struct {
		v   *int64
		has *bool
	}{
		"input_tokens": {&want.InputTokens, new(bool)}, "output_tokens": {&want.OutputTokens, new(bool)},
		"running": {&want.Running, &want.HasRunning}, "waiting": {&want.Waiting, &want.HasWaiting},
	}
	for k, p := range ints {
		if n, ok := num(k); ok {
			v, err := n.Int64()
			if err != nil {
				t.Fatalf("%s %v: %v", k, n, err)
			}
			*p.v, *p.has = v, true
		}
	}
	floats := map[string]struct {
		v   *float64
		has *bool
	}{
		"ttft_ms": {&want.TTFTMs, &want.HasTTFT}, "duration_ms": {&want.DurationMs, &want.HasDuration},
		"retry_after_ms": {&want.RetryAfterMs, new(bool)},
		"kv_cache_usage": {&want.KVCacheUsage, &want.HasKVCache},
	}
	for k, p := range floats {
		if n, ok := num(k); ok {
			v, err := n.Float64()
			if err != nil {
				t.Fatalf("%s %v: %v", k, n, err)
			}
			*p.v, *p.has = v, true
		}
	}
	want.Cold, _ = m["cold"].(bool)
	want.CacheHit, _ = m["cache_hit"].(bool)
	if o, ok := m["outcome"].(string); ok {
		want.Outcome, _ = ParseOutcome(o)
	} else {
		want.Outcome = OutcomeFromStatus(want.Status)
	}
	if diff := cmp.Diff(want, *ev); diff != "" {
		t.Errorf("Decode(%q) disagrees with encoding/json (-json +Decode):\n%s", data, diff)
	}
}

func unsafeStringData(s string) *byte { return unsafe.StringData(s) }

// errorView is a *DecodeError in comparable form; Sentinel indexes
// sentinels, -1 for none.
type errorView struct {
	Sentinel      int
	Field, Source string
	Offset        int
}

func viewError(err error) errorView {
	var de *DecodeError
	if !errors.As(err, &de) {
		return errorView{Sentinel: -1}
	}
	v := errorView{Sentinel: -1, Field: de.Field, Source: de.Source, Offset: de.Offset}
	for i, s := range sentinels {
		if de.Err == s {
			v.Sentinel = i
		}
	}
	return v
}
