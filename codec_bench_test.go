package fleetwatch

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
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

// BenchmarkDecodeVaried decodes 1024 different events in turn: 32
// backends, 8 sources, 1024 prefixes, varying numbers and times. Unlike
// BenchmarkDecode, where every id equals the previous event's, the ids are
// found by a map lookup in the intern tables, as in a real stream.
func BenchmarkDecodeVaried(b *testing.B) {
	const n = 1024
	var events [n][]byte
	size := 0
	for i := range n {
		e := protocolExampleEvent()
		e.Backend = fmt.Sprintf("vllm-%d.gpu.internal:8000", i%32)
		e.Source = fmt.Sprintf("edge-%d", i%8)
		e.Prefix = fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15)
		e.TS = e.TS.Add(time.Duration(i) * 7 * time.Millisecond)
		e.TTFTMs, e.DurationMs = 100+float64(i%977)/10, 2000+float64(i)
		e.InputTokens, e.OutputTokens = int64(500+i), int64(i%400)
		events[i] = AppendEvent(nil, &e)
		size += len(events[i])
	}
	var d Decoder
	var e Event
	for i := range n { // fill the intern tables: the steady state
		if err := d.Decode(events[i], &e); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(size / n))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := d.Decode(events[i%n], &e); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

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
