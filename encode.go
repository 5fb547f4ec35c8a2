package fleetwatch

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendEvent appends ev as one compact JSON object, fields in protocol
// order, and returns the extended buffer. Optional fields are omitted when
// absent: ts when zero, status unless HasStatus, ttft_ms and duration_ms
// unless their Has flag is set, the others when zero, false or empty.
// outcome is always written; when ev.Outcome is unset it is derived from
// the status, so that decoding the result gives back ev.
//
// Times are written with millisecond precision in UTC, as AppendTime does; numbers
// the shortest way that reads back to the same float64, in the notation
// encoding/json uses. A number that JSON cannot express (NaN, ±Inf) is
// written as null, which reads back as absent. Strings are escaped as JSON
// requires; invalid UTF-8 becomes U+FFFD.
func AppendEvent(dst []byte, ev *Event) []byte {
	dst = append(dst, `{"v":1,"pool":`...)
	dst = appendString(dst, ev.Pool)
	dst = append(dst, `,"backend":`...)
	dst = appendString(dst, ev.Backend)
	if !ev.TS.IsZero() {
		dst = append(dst, `,"ts":"`...)
		dst = appendTime(dst, ev.TS)
		dst = append(dst, '"')
	}
	if ev.StatusKnown() {
		dst = append(dst, `,"status":`...)
		dst = strconv.AppendInt(dst, int64(ev.Status), 10)
	}
	outcome := ev.Outcome.String()
	if outcome == "" {
		outcome = OutcomeFromStatus(ev.Status).String()
	}
	dst = append(dst, `,"outcome":"`...)
	dst = append(dst, outcome...)
	dst = append(dst, '"')
	if ev.TTFTKnown() {
		dst = append(dst, `,"ttft_ms":`...)
		dst = appendFloat(dst, ev.TTFTMs)
	}
	if ev.DurationKnown() {
		dst = append(dst, `,"duration_ms":`...)
		dst = appendFloat(dst, ev.DurationMs)
	}
	if ev.InputTokens != 0 {
		dst = append(dst, `,"input_tokens":`...)
		dst = strconv.AppendInt(dst, ev.InputTokens, 10)
	}
	if ev.OutputTokens != 0 {
		dst = append(dst, `,"output_tokens":`...)
		dst = strconv.AppendInt(dst, ev.OutputTokens, 10)
	}
	if ev.Cold {
		dst = append(dst, `,"cold":true`...)
	}
	if ev.RetryAfterMs != 0 {
		dst = append(dst, `,"retry_after_ms":`...)
		dst = appendFloat(dst, ev.RetryAfterMs)
	}
	if ev.Prefix != "" {
		dst = append(dst, `,"prefix":`...)
		dst = appendString(dst, ev.Prefix)
	}
	if ev.CacheHit {
		dst = append(dst, `,"cache_hit":true`...)
	}
	if ev.Fingerprint != "" {
		dst = append(dst, `,"fingerprint":`...)
		dst = appendString(dst, ev.Fingerprint)
	}
	if ev.Source != "" {
		dst = append(dst, `,"source":`...)
		dst = appendString(dst, ev.Source)
	}
	if ev.RunningKnown() {
		dst = append(dst, `,"running":`...)
		dst = strconv.AppendInt(dst, ev.Running, 10)
	}
	if ev.WaitingKnown() {
		dst = append(dst, `,"waiting":`...)
		dst = strconv.AppendInt(dst, ev.Waiting, 10)
	}
	if ev.KVCacheKnown() {
		dst = append(dst, `,"kv_cache_usage":`...)
		dst = appendFloat(dst, ev.KVCacheUsage)
	}
	if ev.StreamError != "" {
		dst = append(dst, `,"stream_error":`...)
		dst = appendString(dst, ev.StreamError)
	}
	if ev.ModelMismatch != "" {
		dst = append(dst, `,"model_mismatch":`...)
		dst = appendString(dst, ev.ModelMismatch)
	}
	if ev.ToolCallBroken {
		dst = append(dst, `,"tool_call_broken":true`...)
	}
	if ev.FakeStream {
		dst = append(dst, `,"fake_stream":true`...)
	}
	if ev.QuotaResetMs != 0 {
		dst = append(dst, `,"quota_reset_ms":`...)
		dst = appendFloat(dst, ev.QuotaResetMs)
	}
	if ev.Shed != "" {
		dst = append(dst, `,"shed":`...)
		dst = appendString(dst, ev.Shed)
	}
	return append(dst, '}')
}

// appendTime appends t as AppendTime does, by hand for the years 0 to 9999
// (time.Time.AppendFormat was half the cost of AppendEvent).
func appendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return AppendTime(dst, t)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	return append(dst,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}

// AppendNDJSON appends evs as NDJSON: one AppendEvent object per line, each
// line ending in '\n'.
func AppendNDJSON(dst []byte, evs []Event) []byte {
	for i := range evs {
		dst = AppendEvent(dst, &evs[i])
		dst = append(dst, '\n')
	}
	return dst
}

// appendFloat writes f as encoding/json does: the shortest representation
// that parses back to f, in plain notation for 1e-6 <= |f| < 1e21.
func appendFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string. U+2028 and U+2029 are escaped so
// that the output is also valid JavaScript, as encoding/json does.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
