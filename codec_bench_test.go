package fleetwatch

import (
	"encoding/json"
	"strings"
	"testing"
)

// jsonEvent is the baseline: the outcome event as a plain struct for
// encoding/json, without any of the protocol's validation.
type jsonEvent struct {
	V            int      `json:"v"`
	Pool         string   `json:"pool"`
	Backend      string   `json:"backend"`
	TS           string   `json:"ts"`
	Status       *int     `json:"status"`
	Outcome      string   `json:"outcome"`
	TTFTMs       *float64 `json:"ttft_ms"`
	DurationMs   *float64 `json:"duration_ms"`
	InputTokens  int64    `json:"input_tokens"`
	OutputTokens int64    `json:"output_tokens"`
	Cold         bool     `json:"cold"`
	RetryAfterMs float64  `json:"retry_after_ms"`
	Prefix       string   `json:"prefix"`
	CacheHit     bool     `json:"cache_hit"`
	Fingerprint  string   `json:"fingerprint"`
	Source       string   `json:"source"`
}

func benchmarkDecode(b *testing.B, in string) {
	data := []byte(in)
	var d Decoder
	var e Event
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Decode(data, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode decodes the protocol's example event, compact.
func BenchmarkDecode(b *testing.B) { benchmarkDecode(b, compactExample) }

// BenchmarkDecodeMinimal decodes an event of pool, backend, status and
// ttft_ms only.
func BenchmarkDecodeMinimal(b *testing.B) { benchmarkDecode(b, minimalEvent) }

// BenchmarkDecodeEncodingJSON is the baseline for BenchmarkDecode:
// encoding/json into a plain struct, same bytes, no validation.
func BenchmarkDecodeEncodingJSON(b *testing.B) {
	data := []byte(compactExample)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var e jsonEvent
		if err := json.Unmarshal(data, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeNDJSON100 decodes a batch of 100 example events; ns/op is
// per event.
func BenchmarkDecodeNDJSON100(b *testing.B) {
	const n = 100
	data := []byte(strings.Repeat(compactExample+"\n", n))
	var d Decoder
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if ok, bad := d.DecodeBatch(data, func([]byte, *Event, error) {}); ok != n || bad != 0 {
			b.Fatalf("DecodeBatch = %d ok, %d bad", ok, bad)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

// BenchmarkAppendEvent encodes the protocol's example event.
func BenchmarkAppendEvent(b *testing.B) {
	e := protocolExampleEvent()
	buf := AppendEvent(nil, &e)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendEvent(buf[:0], &e)
	}
}

// BenchmarkAppendEventEncodingJSON is the baseline for
// BenchmarkAppendEvent: encoding/json Marshal of the plain struct.
func BenchmarkAppendEventEncodingJSON(b *testing.B) {
	var e jsonEvent
	if err := json.Unmarshal([]byte(compactExample), &e); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(&e); err != nil {
			b.Fatal(err)
		}
	}
}
