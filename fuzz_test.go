package fleetwatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// FuzzDecode feeds arbitrary bytes to Decode: it must never panic; it must
// call the input bad JSON exactly when encoding/json does (or the input is
// valid JSON but not an object); an event it accepts must agree with
// encoding/json's reading and survive Decode(AppendEvent(ev)) unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		protocolExample, compactExample, minimalEvent, ev(), ev(`"ttft_ms":-1`),
		ev(`"source":"\ud83d\ude00\ud800\u00e9\n"`), ev(`"x":[{"a":null,"b":[true,false,1e5,"\""]}]`),
		ev(`"ts":"2026-12-02T09:50:00.123456+02:00"`), ev(`"status":99999999999999999999`),
		ev(`"ttft_ms":1e309`), ev(`"pool":"a","pool":null`), `{"pool":"meta-llama/Llama-3.1-70B-Instruct","backend":"http://h:1"}`,
		`[]`, `{`, `{"pool":"p","backend":"b"} x`, "{\"pool\":\"p\",\"backend\":\"\xff\"}", "",
		ev(`"input_tokens":-0`, `"retry_after_ms":-0`, `"ttft_ms":-0.0`),
		ev(`"v":2`), ev(`"status":1000`), ev(`"status":200.0`), ev(`"outcome":"x"`), ev(`"outcome":"client_error"`), ev(`"outcome":"stalled"`),
		ev(`"ts":"2026-02-30T00:00:00Z"`), ev(`"ts":"0000-01-01T00:00:00+01:00"`), ev(`"input_tokens":1.5`),
		ev(`"output_tokens":9223372036854775808`), ev(`"cold":1`), ev(`"cache_hit":true`, `"cold":null`),
		ev(`"retry_after_ms":3600001`), ev(`"duration_ms":"5"`), ev(`"prefix":"` + strings.Repeat("x", 129) + `"`),
		"{\"pool\":\"p\",\"backend\":\"b\",\"fingerprint\":\"\xff\"}", `{"pool":"a..b","backend":"b"}`,
		`{"p\u006fol":"p","b\u0061ckend":"\u00e9\ud83d\ude00"}`, "{\"pool\":\"p\",\"backend\":\"b\"}\n\n{\"pool\":\"q\"}\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchAgreesWithDecode(t, data)
		var d Decoder
		var got Event
		err := d.Decode(data, &got)
		checkSyntaxAgreesWithEncodingJSON(t, data, err)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || sentinelsIn(err) != 1 {
				t.Fatalf("Decode(%q) = %v, want a *DecodeError with one sentinel", data, err)
			}
			if de.Offset < 0 || de.Offset > len(data) {
				t.Fatalf("Decode(%q).Offset = %d, outside the input", data, de.Offset)
			}
			return
		}
		crossCheck(t, data, &got)
		checkInvariants(t, &got)
		enc := AppendEvent(nil, &got)
		var back Event
		if err := d.Decode(enc, &back); err != nil {
			t.Fatalf("Decode(AppendEvent(Decode(%q))) = %v; encoded %s", data, err, enc)
		}
		if diff := cmp.Diff(got, back); diff != "" {
			t.Fatalf("Decode(AppendEvent(ev)) for input %q (-want +got):\n%s", data, diff)
		}
	})
}

// checkInvariants checks what every decoded event guarantees, by the
// protocol's rules.
func checkInvariants(t *testing.T, e *Event) {
	t.Helper()
	inRange := func(v float64) bool { return v >= 0 && v <= MaxDurationMs }
	switch {
	case ValidatePoolID(e.Pool) != nil:
		t.Fatalf("decoded an invalid pool id %q", e.Pool)
	case ValidateBackendID(e.Backend) != nil:
		t.Fatalf("decoded an invalid backend id %q", e.Backend)
	case e.Outcome == OutcomeUnset || e.Outcome.String() == "":
		t.Fatalf("decoded outcome %d", e.Outcome)
	case e.Status < 0 || e.Status > 999 || (!e.HasStatus && e.Status != 0):
		t.Fatalf("decoded status %d (present %v)", e.Status, e.HasStatus)
	case !inRange(e.TTFTMs) || !inRange(e.DurationMs) || !inRange(e.RetryAfterMs):
		t.Fatalf("decoded times out of range: %v %v %v", e.TTFTMs, e.DurationMs, e.RetryAfterMs)
	case e.InputTokens < 0 || e.OutputTokens < 0:
		t.Fatalf("decoded negative tokens: %d %d", e.InputTokens, e.OutputTokens)
	case len(e.Prefix) > MaxPrefixLen || len(e.Fingerprint) > MaxFingerprintLen || len(e.Source) > MaxSourceLen:
		t.Fatalf("decoded an oversize string")
	case !utf8.ValidString(e.Prefix) || !utf8.ValidString(e.Fingerprint) || !utf8.ValidString(e.Source):
		t.Fatalf("decoded invalid UTF-8")
	case !e.TS.IsZero() && (e.TS.Location() != time.UTC || e.TS.Nanosecond()%int(time.Millisecond) != 0):
		t.Fatalf("decoded ts %v is not UTC milliseconds", e.TS)
	}
}

// checkBatchAgreesWithDecode runs DecodeBatch over data and checks that
// every line it reports decodes alone the same way: an accepted line to the
// same event, a rejected one with the same reason.
func checkBatchAgreesWithDecode(t *testing.T, data []byte) {
	t.Helper()
	var batch, single Decoder
	calls := 0
	ok, bad := batch.DecodeBatch(data, func(line []byte, got *Event, gotErr error) {
		calls++
		if len(bytes.Trim(line, " \t\r\n")) == 0 {
			t.Fatalf("DecodeBatch(%q) reported a blank line", data)
		}
		var want Event
		wantErr := single.Decode(line, &want)
		if diff := cmp.Diff(viewError(wantErr), viewError(gotErr)); diff != "" {
			t.Fatalf("DecodeBatch(%q) line %q error (-Decode +DecodeBatch):\n%s", data, line, diff)
		}
		if gotErr == nil {
			if diff := cmp.Diff(want, *got); diff != "" {
				t.Fatalf("DecodeBatch(%q) line %q (-Decode +DecodeBatch):\n%s", data, line, diff)
			}
		}
	})
	if ok+bad != calls {
		t.Fatalf("DecodeBatch(%q) = %d ok, %d bad, but fn was called %d times", data, ok, bad, calls)
	}
}

// checkSyntaxAgreesWithEncodingJSON checks that Decode reports ErrBadJSON
// exactly when the input is not a JSON object by encoding/json's judgement
// (allowing for the nesting limit).
func checkSyntaxAgreesWithEncodingJSON(t *testing.T, data []byte, err error) {
	t.Helper()
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	isObject := json.Valid(data) && len(trimmed) > 0 && trimmed[0] == '{'
	badJSON := errors.Is(err, ErrBadJSON)
	switch {
	case badJSON && isObject && bytes.Count(data, []byte("["))+
		bytes.Count(data, []byte("{")) < maxNesting:
		t.Fatalf("Decode(%q) = %v, but encoding/json finds a valid object", data, err)
	case !badJSON && !isObject:
		t.Fatalf("Decode(%q) = %v, but encoding/json finds no valid object", data, err)
	}
}

// FuzzRoundTrip builds events from structured inputs, valid or not, and
// checks that AppendEvent always writes valid JSON and that Decode gives
// back exactly the event when it is valid and rejects it (with a reason
// other than bad JSON) when it is not.
func FuzzRoundTrip(f *testing.F) {
	ex := protocolExampleEvent()
	f.Add(ex.Pool, ex.Backend, ex.TS.UnixMilli(), ex.Status, true, uint8(ex.Outcome), ex.TTFTMs, true,
		ex.DurationMs, true, ex.InputTokens, ex.OutputTokens, false, 0.0, ex.Prefix, true, ex.Fingerprint, ex.Source)
	f.Add("p", "b", int64(0), 0, false, uint8(0), 0.0, false, 0.0, false, int64(0), int64(0), false, 0.0, "", false, "", "")
	f.Add("a..b", "", int64(-62135596800001), 1000, true, uint8(9), -1.0, true, math.Inf(1), true,
		int64(-1), int64(math.MaxInt64), true, math.NaN(), strings.Repeat("x", 129), false, "\xff", "\u2028")
	f.Add("p/q=r", "x\"\\\n", int64(253402300799999), 499, true, uint8(0), 3.6e6, true, 5e-324, true,
		int64(1), int64(2), true, 3.6e6, "é", true, "\x00", "s")
	f.Fuzz(func(t *testing.T, pool, backend string, tsMs int64, status int, hasStatus bool, outcome uint8,
		ttft float64, hasTTFT bool, duration float64, hasDuration bool, inTok, outTok int64, cold bool,
		retry float64, prefix string, cacheHit bool, fingerprint, source string) {
		in := Event{
			Pool: pool, Backend: backend, Status: status, HasStatus: hasStatus, Outcome: Outcome(outcome),
			TTFTMs: ttft, HasTTFT: hasTTFT, DurationMs: duration, HasDuration: hasDuration,
			InputTokens: inTok, OutputTokens: outTok, Cold: cold, RetryAfterMs: retry,
			Prefix: prefix, CacheHit: cacheHit, Fingerprint: fingerprint, Source: source,
		}
		if tsMs != 0 {
			in.TS = time.UnixMilli(tsMs)
		}
		checkRoundTrip(t, in)
	})
}

// checkRoundTrip encodes in, decodes the result and compares it with what
// the protocol says in should read back as.
func checkRoundTrip(t *testing.T, in Event) {
	t.Helper()
	enc := AppendEvent(nil, &in)
	if !json.Valid(enc) {
		t.Fatalf("AppendEvent(%+v) wrote invalid JSON: %s", in, enc)
	}
	want, valid := readBack(in)
	var d Decoder
	var got Event
	err := d.Decode(enc, &got)
	switch {
	case valid && err != nil:
		t.Fatalf("Decode(%s) = %v, want the event back", enc, err)
	case valid:
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("Decode(%s) (-want +got):\n%s", enc, diff)
		}
		crossCheck(t, enc, &got)
	case err == nil:
		t.Fatalf("Decode(%s) accepted an invalid event: %+v", enc, got)
	case errors.Is(err, ErrBadJSON):
		t.Fatalf("Decode(%s) = %v; AppendEvent wrote valid JSON", enc, err)
	}
}

// readBack returns the event that encoding in and decoding it should give,
// by the protocol's rules written out independently of the decoder, and
// whether that event is valid at all.
func readBack(in Event) (Event, bool) {
	want := in
	valid := true
	want.Pool, want.Backend = replaceInvalidUTF8(in.Pool), replaceInvalidUTF8(in.Backend)
	valid = valid && ValidatePoolID(want.Pool) == nil && ValidateBackendID(want.Backend) == nil
	if !in.TS.IsZero() {
		ts := in.TS.UTC()
		ts = ts.Add(-time.Duration(ts.Nanosecond() % int(time.Millisecond)))
		valid = valid && ts.Year() >= 0 && ts.Year() <= 9999
		want.TS = ts
	}
	if in.Outcome.String() == "" {
		want.Outcome = OutcomeFromStatus(in.Status)
	}
	// A non-zero value is present whatever its flag (Event's doc).
	want.HasStatus = in.HasStatus || in.Status != 0
	valid = valid && want.Status >= 0 && want.Status <= 999
	inRange := func(v float64) bool { return v >= 0 && v <= MaxDurationMs }
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	want.HasTTFT = in.HasTTFT || in.TTFTMs != 0
	if !want.HasTTFT || !finite(in.TTFTMs) {
		want.TTFTMs, want.HasTTFT = 0, false
	}
	want.HasDuration = in.HasDuration || in.DurationMs != 0
	if !want.HasDuration || !finite(in.DurationMs) {
		want.DurationMs, want.HasDuration = 0, false
	}
	if !finite(in.RetryAfterMs) {
		want.RetryAfterMs = 0
	}
	valid = valid && inRange(want.TTFTMs) && inRange(want.DurationMs) && inRange(want.RetryAfterMs)
	valid = valid && in.InputTokens >= 0 && in.OutputTokens >= 0
	want.Prefix = replaceInvalidUTF8(in.Prefix)
	want.Fingerprint = replaceInvalidUTF8(in.Fingerprint)
	want.Source = replaceInvalidUTF8(in.Source)
	valid = valid && len(want.Prefix) <= MaxPrefixLen && len(want.Fingerprint) <= MaxFingerprintLen &&
		len(want.Source) <= MaxSourceLen
	return want, valid
}

// replaceInvalidUTF8 replaces each invalid byte of s by U+FFFD, as JSON
// encoders do.
func replaceInvalidUTF8(s string) string {
	var b strings.Builder
	for _, r := range s { // range yields U+FFFD per invalid byte
		b.WriteRune(r)
	}
	return b.String()
}

// TestRoundTripRapid generates valid events and checks that each survives
// AppendEvent and Decode unchanged, alone and in NDJSON batches.
func TestRoundTripRapid(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs := rapid.SliceOfN(eventGen(), 1, 8).Draw(t, "events")
		var d Decoder
		for i := range evs {
			enc := AppendEvent(nil, &evs[i])
			var got Event
			if err := d.Decode(enc, &got); err != nil {
				t.Fatalf("Decode(%s): %v", enc, err)
			}
			if diff := cmp.Diff(evs[i], got); diff != "" {
				t.Fatalf("Decode(%s) (-want +got):\n%s", enc, diff)
			}
		}
		var got []Event
		d.DecodeBatch(AppendNDJSON(nil, evs), func(line []byte, e *Event, err error) {
			if err != nil {
				t.Fatalf("DecodeBatch line %s: %v", line, err)
			}
			got = append(got, *e)
		})
		if diff := cmp.Diff(evs, got); diff != "" {
			t.Fatalf("DecodeBatch(AppendNDJSON(evs)) (-want +got):\n%s", diff)
		}
	})
}

// eventGen generates valid events as Decode returns them: UTC times in
// milliseconds, the outcome always set, zero values where a field is
// absent.
func eventGen() *rapid.Generator[Event] {
	poolGen := rapid.StringMatching(`[-/_=a-zA-Z0-9]([-/_=.a-zA-Z0-9]{0,40}[-/_=a-zA-Z0-9])?`).Filter(func(s string) bool {
		return !strings.Contains(s, "..")
	})
	idGen := rapid.StringOfN(rapid.RuneFrom(nil, unicode.L, unicode.N, unicode.P, unicode.S, unicode.Zs), 1, 40, MaxIDLen)
	optGen := func(max int) *rapid.Generator[string] {
		return rapid.OneOf(rapid.Just(""), rapid.StringOfN(rapid.Rune(), 0, 40, max))
	}
	msGen := rapid.OneOf(
		rapid.Float64Range(0, MaxDurationMs),
		rapid.Map(rapid.IntRange(0, MaxDurationMs), func(n int) float64 { return float64(n) }),
		rapid.SampledFrom([]float64{0, MaxDurationMs, 5e-324, 1e-7, 183.2, 0.1}),
	)
	return rapid.Custom(func(t *rapid.T) Event {
		e := Event{
			Pool:    poolGen.Draw(t, "pool"),
			Backend: idGen.Draw(t, "backend"),
		}
		if rapid.Bool().Draw(t, "hasTS") {
			ms := rapid.Int64Range(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
				time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli()).Draw(t, "ts")
			e.TS = time.UnixMilli(ms).UTC()
		}
		if e.HasStatus = rapid.Bool().Draw(t, "hasStatus"); e.HasStatus {
			e.Status = rapid.IntRange(0, 999).Draw(t, "status")
		}
		e.Outcome = Outcome(rapid.IntRange(int(OutcomeUnset), NumOutcomes-1).Draw(t, "outcome"))
		if e.Outcome == OutcomeUnset {
			e.Outcome = OutcomeFromStatus(e.Status)
		}
		if e.HasTTFT = rapid.Bool().Draw(t, "hasTTFT"); e.HasTTFT {
			e.TTFTMs = msGen.Draw(t, "ttft")
		}
		if e.HasDuration = rapid.Bool().Draw(t, "hasDuration"); e.HasDuration {
			e.DurationMs = msGen.Draw(t, "duration")
		}
		e.InputTokens = rapid.Int64Min(0).Draw(t, "inputTokens")
		e.OutputTokens = rapid.Int64Min(0).Draw(t, "outputTokens")
		e.Cold = rapid.Bool().Draw(t, "cold")
		e.RetryAfterMs = rapid.OneOf(rapid.Just(0.0), msGen).Draw(t, "retryAfter")
		e.Prefix = truncateUTF8(optGen(MaxPrefixLen).Draw(t, "prefix"), MaxPrefixLen)
		e.CacheHit = rapid.Bool().Draw(t, "cacheHit")
		e.Fingerprint = truncateUTF8(optGen(MaxFingerprintLen).Draw(t, "fingerprint"), MaxFingerprintLen)
		e.Source = truncateUTF8(optGen(MaxSourceLen).Draw(t, "source"), MaxSourceLen)
		if e.HasRunning = rapid.Bool().Draw(t, "hasRunning"); e.HasRunning {
			e.Running = rapid.Int64Min(0).Draw(t, "running")
		}
		if e.HasWaiting = rapid.Bool().Draw(t, "hasWaiting"); e.HasWaiting {
			e.Waiting = rapid.Int64Min(0).Draw(t, "waiting")
		}
		if e.HasKVCache = rapid.Bool().Draw(t, "hasKVCache"); e.HasKVCache {
			e.KVCacheUsage = rapid.Float64Range(0, 1).Draw(t, "kvCache")
		}
		e.StreamError = truncateUTF8(rapid.OneOf(rapid.SampledFrom([]string{"", StreamErrorEvent, StreamCut}),
			optGen(MaxStreamErrorLen)).Draw(t, "streamError"), MaxStreamErrorLen)
		e.ModelMismatch = truncateUTF8(optGen(MaxModelLen).Draw(t, "modelMismatch"), MaxModelLen)
		e.ToolCallBroken = rapid.Bool().Draw(t, "toolCallBroken")
		e.FakeStream = rapid.Bool().Draw(t, "fakeStream")
		if rapid.Bool().Draw(t, "quota") {
			e.QuotaResetMs = rapid.Float64Range(MaxDurationMs, MaxQuotaResetMs).Draw(t, "quotaResetMs")
		}
		e.Shed = optGen(MaxShedLen).Draw(t, "shed")
		e.Backend = truncateUTF8(e.Backend, MaxIDLen)
		return e
	})
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune.
func truncateUTF8(s string, n int) string {
	for len(s) > n {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
