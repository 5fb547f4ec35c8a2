package fleetwatch

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func TestAppendEvent(t *testing.T) {
	tests := []struct {
		name string
		ev   Event
		want string
	}{
		{
			"protocol example",
			protocolExampleEvent(),
			`{"v":1,"pool":"llama-3.1-70b","backend":"vllm-a","ts":"2026-12-02T07:50:00.123Z","status":200,"outcome":"ok",` +
				`"ttft_ms":183.2,"duration_ms":2300.5,"input_tokens":1200,"output_tokens":350,"prefix":"9f2c1a","cache_hit":true,` +
				`"fingerprint":"fp_44709d6fcb","source":"edge-3"}`,
		},
		{
			"absent fields omitted, outcome derived from no status",
			Event{Pool: "p", Backend: "b"},
			`{"v":1,"pool":"p","backend":"b","outcome":"timeout"}`,
		},
		{
			"outcome derived from status",
			Event{Pool: "p", Backend: "b", Status: 429, HasStatus: true},
			`{"v":1,"pool":"p","backend":"b","status":429,"outcome":"throttled"}`,
		},
		{
			"invalid outcome value derived from status",
			Event{Pool: "p", Backend: "b", Status: 200, HasStatus: true, Outcome: 200},
			`{"v":1,"pool":"p","backend":"b","status":200,"outcome":"ok"}`,
		},
		{
			"zero status present",
			Event{Pool: "p", Backend: "b", HasStatus: true, Outcome: OutcomeCanceled},
			`{"v":1,"pool":"p","backend":"b","status":0,"outcome":"canceled"}`,
		},
		{
			"stalled",
			Event{Pool: "p", Backend: "b", HasStatus: true, Outcome: OutcomeStalled},
			`{"v":1,"pool":"p","backend":"b","status":0,"outcome":"stalled"}`,
		},
		{
			"zero latencies present",
			Event{Pool: "p", Backend: "b", Outcome: OutcomeOK, HasTTFT: true, HasDuration: true},
			`{"v":1,"pool":"p","backend":"b","outcome":"ok","ttft_ms":0,"duration_ms":0}`,
		},
		{
			"cold, retry after",
			Event{Pool: "p", Backend: "b", Outcome: OutcomeThrottled, Cold: true, RetryAfterMs: 1500},
			`{"v":1,"pool":"p","backend":"b","outcome":"throttled","cold":true,"retry_after_ms":1500}`,
		},
		{
			"ts in another zone, below the millisecond",
			Event{Pool: "p", Backend: "b", Outcome: OutcomeOK,
				TS: time.Date(2026, 12, 2, 9, 50, 0, 123_999_999, time.FixedZone("CEST", 2*3600))},
			`{"v":1,"pool":"p","backend":"b","ts":"2026-12-02T07:50:00.123Z","outcome":"ok"}`,
		},
		{
			"floats as encoding/json writes them",
			Event{Pool: "p", Backend: "b", Outcome: OutcomeOK, TTFTMs: 3_600_000, HasTTFT: true, DurationMs: 1e-7, HasDuration: true, RetryAfterMs: 0.1},
			`{"v":1,"pool":"p","backend":"b","outcome":"ok","ttft_ms":3600000,"duration_ms":1e-7,"retry_after_ms":0.1}`,
		},
		{
			"NaN and Inf as null",
			Event{Pool: "p", Backend: "b", Outcome: OutcomeOK, TTFTMs: math.NaN(), HasTTFT: true, DurationMs: math.Inf(1), HasDuration: true},
			`{"v":1,"pool":"p","backend":"b","outcome":"ok","ttft_ms":null,"duration_ms":null}`,
		},
		{
			"strings escaped",
			Event{Pool: "p", Backend: "a\"b\\c\nd\te\x01f\u2028g/é😀", Outcome: OutcomeOK, Source: "x\xffy", Prefix: "\r\x7f"},
			`{"v":1,"pool":"p","backend":"a\"b\\c\nd\te\u0001f\u2028g/é😀","outcome":"ok","prefix":"\r` + "\x7f" + `","source":"x\ufffdy"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendEvent(nil, &tt.ev)
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("AppendEvent (-want +got):\n%s", diff)
			}
			if !json.Valid(got) {
				t.Errorf("AppendEvent wrote invalid JSON: %s", got)
			}
		})
	}
}

func TestAppendEventKeepsDst(t *testing.T) {
	e := protocolExampleEvent()
	dst := []byte("prefix:")
	got := AppendEvent(dst, &e)
	want := "prefix:" + string(AppendEvent(nil, &e))
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("AppendEvent onto a buffer (-want +got):\n%s", diff)
	}
}

func TestAppendEventStringsMatchEncodingJSON(t *testing.T) {
	// Whatever AppendEvent writes for a string, encoding/json reads back as
	// the string encoding/json itself would have written.
	for _, s := range []string{
		"plain", `quote " backslash \ slash /`, "\x00\x01\x1f\x7f", "\n\r\t\b\f", "é😀\u2028\u2029",
		"bad \xff utf8 \xc3", "\xed\xa0\x80", "<html>&amp;",
	} {
		e := Event{Pool: "p", Backend: "b", Source: s}
		var m map[string]any
		if err := json.Unmarshal(AppendEvent(nil, &e), &m); err != nil {
			t.Fatalf("AppendEvent(%q) is not JSON: %v", s, err)
		}
		ref, _ := json.Marshal(s)
		var want string
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, m["source"]); diff != "" {
			t.Errorf("source %q (-encoding/json +AppendEvent):\n%s", s, diff)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		ev   Event
	}{
		{"protocol example", protocolExampleEvent()},
		{"minimal", Event{Pool: "p", Backend: "b", Outcome: OutcomeTimeout}},
		{"every outcome", Event{Pool: "p", Backend: "b", Outcome: OutcomeClientError, Status: 404, HasStatus: true}},
		{"edge numbers", Event{
			Pool: "a/b=c_d-e.f", Backend: "http://[::1]:8000/v1?x=\"y\"", Outcome: OutcomeOK,
			TTFTMs: math.Nextafter(MaxDurationMs, 0), HasTTFT: true, DurationMs: 5e-324, HasDuration: true,
			InputTokens: math.MaxInt64, OutputTokens: 1, RetryAfterMs: MaxDurationMs,
		}},
		{"year bounds", Event{Pool: "p", Backend: "b", Outcome: OutcomeOK, TS: time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)}},
		{"year zero", Event{Pool: "p", Backend: "b", Outcome: OutcomeOK, TS: time.Date(0, 1, 1, 0, 0, 0, 1e6, time.UTC)}},
		{"unicode ids", Event{Pool: "p", Backend: "é😀\u2028", Outcome: OutcomeOK, Fingerprint: "\"\\", Source: "\n", Prefix: "\x00"}},
	}
	var d Decoder
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Event
			data := AppendEvent(nil, &tt.ev)
			if err := d.Decode(data, &got); err != nil {
				t.Fatalf("Decode(%s): %v", data, err)
			}
			if diff := cmp.Diff(tt.ev, got); diff != "" {
				t.Errorf("Decode(AppendEvent(ev)) (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendNDJSON(t *testing.T) {
	evs := []Event{
		protocolExampleEvent(),
		{Pool: "p", Backend: "b", Outcome: OutcomeTimeout},
		{Pool: "q", Backend: "c", Outcome: OutcomeError, Status: 503, HasStatus: true, RetryAfterMs: 2000},
	}
	data := AppendNDJSON(nil, evs)
	if n := countByte(data, '\n'); n != len(evs) || data[len(data)-1] != '\n' {
		t.Fatalf("AppendNDJSON wrote %d lines, want %d ending in a newline:\n%s", n, len(evs), data)
	}
	var d Decoder
	var got []Event
	ok, bad := d.DecodeBatch(data, func(line []byte, e *Event, err error) {
		if err != nil {
			t.Errorf("line %s: %v", line, err)
			return
		}
		got = append(got, *e)
	})
	if ok != len(evs) || bad != 0 {
		t.Errorf("DecodeBatch = %d ok, %d bad; want %d, 0", ok, bad, len(evs))
	}
	if diff := cmp.Diff(evs, got); diff != "" {
		t.Errorf("DecodeBatch(AppendNDJSON(evs)) (-want +got):\n%s", diff)
	}
	if got := AppendNDJSON(nil, nil); len(got) != 0 {
		t.Errorf("AppendNDJSON(nil) = %q, want empty", got)
	}
}

func TestAppendEventAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	e := protocolExampleEvent()
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { buf = AppendEvent(buf[:0], &e) }); n != 0 {
		t.Errorf("AppendEvent into a large enough buffer allocates %v times, want 0", n)
	}
}

func countByte(b []byte, c byte) int {
	n := 0
	for _, x := range b {
		if x == c {
			n++
		}
	}
	return n
}

func TestAppendTimeMatchesAppendTime(t *testing.T) {
	for _, ts := range []time.Time{
		time.Date(2026, 12, 2, 7, 50, 0, 123_456_789, time.UTC),
		time.Date(2026, 12, 2, 9, 50, 0, 999_999_999, time.FixedZone("", 7200)),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(999, 2, 28, 23, 59, 59, 1e6, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC),
		time.UnixMilli(1764661800123),
	} {
		if got, want := string(appendTime(nil, ts)), string(AppendTime(nil, ts)); got != want {
			t.Errorf("appendTime(%v) = %s, AppendTime says %s", ts, got, want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		ts := time.Unix(rapid.Int64Range(-70e9, 300e9).Draw(t, "sec"), rapid.Int64Range(0, 1e9-1).Draw(t, "nsec"))
		if got, want := string(appendTime(nil, ts)), string(AppendTime(nil, ts)); got != want {
			t.Fatalf("appendTime(%v) = %s, AppendTime says %s", ts, got, want)
		}
	})
}

// TestEncodeCarriesNonZeroWithoutFlag: an Event built without its Has
// flags still carries every non-zero field (Event{TTFTMs: 120} used to
// lose its TTFT silently), and a zero with its flag is still sent.
func TestEncodeCarriesNonZeroWithoutFlag(t *testing.T) {
	ev := Event{Pool: "chat", Backend: "a", Status: 200, Outcome: OutcomeOK, TTFTMs: 120, DurationMs: 900, Running: 3, KVCacheUsage: 0.5}
	if !ev.Latency() {
		t.Error("an ok event with TTFTMs 120 is not a latency sample")
	}
	var dec Decoder
	var got Event
	if err := dec.Decode(AppendEvent(nil, &ev), &got); err != nil {
		t.Fatal(err)
	}
	if !got.HasTTFT || got.TTFTMs != 120 || !got.HasDuration || got.DurationMs != 900 || !got.HasStatus || got.Status != 200 ||
		!got.HasRunning || got.Running != 3 || !got.HasKVCache || got.KVCacheUsage != 0.5 {
		t.Errorf("decoded %+v, want status 200, ttft 120, duration 900, running 3, kv 0.5, each present", got)
	}
	zero := Event{Pool: "chat", Backend: "a", Status: 200, HasTTFT: true}
	got = Event{}
	if err := dec.Decode(AppendEvent(nil, &zero), &got); err != nil {
		t.Fatal(err)
	}
	if !got.HasTTFT || got.TTFTMs != 0 {
		t.Errorf("decoded %+v, want a present ttft_ms of 0", got)
	}
}
