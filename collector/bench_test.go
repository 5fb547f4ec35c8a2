package collector

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// countingSink counts events and keeps nothing: the cheapest possible
// analyzer, so that the benchmark measures the collector.
type countingSink struct{ n atomic.Int64 }

func (s *countingSink) Observe(batch []fleetwatch.Event) bool {
	s.n.Add(int64(len(batch)))
	return false
}

// benchEvent is a representative outcome event of about 256 bytes.
func benchEvent(i int) fleetwatch.Event {
	return fleetwatch.Event{
		Pool: "meta-llama/Llama-3.1-70B-Instruct", Backend: fmt.Sprintf("vllm-%d.pool.internal:8000", i%8),
		TS: time.Now().UTC(), Status: 200, HasStatus: true, Outcome: fleetwatch.OutcomeOK,
		TTFTMs: 183.2 + float64(i%100), HasTTFT: true, DurationMs: 2300.5, HasDuration: true,
		InputTokens: 1200, OutputTokens: 350, Prefix: "9f2c1a44", CacheHit: true,
		Fingerprint: "fp_44709d6fcb", Source: "edge-3",
	}
}

// BenchmarkCollectorThroughput publishes b.N outcome events over a real
// embedded NATS server as fast as one client can, and measures how fast
// they come out of the other end:
//
//   - plain-subscriber: the baseline, a nats.go subscriber that only counts
//     messages (same pending limits as the collector);
//   - plain-queue-2subs: the same with two queue subscriptions, the
//     collector's delivery shape without its work;
//   - collector-nojs: the collector without JetStream capture;
//   - collector-jetstream: the collector republishing accepted events for
//     FW_OUTCOMES (the default deployment);
//   - collector-ndjson100-nojs and collector-ndjson100: the collector with
//     events batched 100 per message, as the router publishes them,
//     without and with JetStream capture.
//
// events/s is end to end (publish to sink); cpu-ns/event is the CPU time of
// the whole process (publisher, embedded server, subscriber) per event
// delivered, which other load on a shared machine disturbs much less than
// the wall clock; dropped is what nats.go dropped because a subscription
// fell behind. Run with a fixed count, e.g. -benchtime=400000x, so every
// variant sees the same burst.
func BenchmarkCollectorThroughput(b *testing.B) {
	single := fleetwatch.AppendEvent(nil, ptr(benchEvent(0)))
	var ndjson []byte
	for i := 0; i < 100; i++ {
		ndjson = fleetwatch.AppendEvent(ndjson, ptr(benchEvent(i)))
		ndjson = append(ndjson, '\n')
	}
	b.Run("plain-subscriber", func(b *testing.B) {
		url, _ := feedtest.NewServer(b, feedtest.WithoutJetStream())
		nc := feedtest.Connect(b, url)
		var got atomic.Int64
		sub, err := nc.Subscribe("fw.outcomes.>", func(*nats.Msg) { got.Add(1) })
		if err != nil {
			b.Fatal(err)
		}
		if err := sub.SetPendingLimits(DefaultPendingMsgs, DefaultPendingBytes); err != nil {
			b.Fatal(err)
		}
		nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		runThroughput(b, url, single, 1, func() (events, dropped int64) {
			d, _ := sub.Dropped()
			return got.Load(), int64(d)
		})
	})
	b.Run("plain-queue-2subs", func(b *testing.B) {
		url, _ := feedtest.NewServer(b, feedtest.WithoutJetStream())
		nc := feedtest.Connect(b, url)
		var got atomic.Int64
		var subs []*nats.Subscription
		for i := 0; i < 2; i++ {
			sub, err := nc.QueueSubscribe("fw.outcomes.>", "q", func(*nats.Msg) { got.Add(1) })
			if err != nil {
				b.Fatal(err)
			}
			if err := sub.SetPendingLimits(DefaultPendingMsgs, DefaultPendingBytes); err != nil {
				b.Fatal(err)
			}
			subs = append(subs, sub)
		}
		nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		runThroughput(b, url, single, 1, func() (events, dropped int64) {
			for _, sub := range subs {
				d, _ := sub.Dropped()
				dropped += int64(d)
			}
			return got.Load(), dropped
		})
	})
	for _, v := range []struct {
		name     string
		opts     []feedtest.Option
		payload  []byte
		perMsg   int
		settings Settings
	}{
		{"collector-nojs", []feedtest.Option{feedtest.WithoutJetStream()}, single, 1, Settings{}},
		{"collector-jetstream", nil, single, 1, Settings{}},
		{"collector-ndjson100-nojs", []feedtest.Option{feedtest.WithoutJetStream()}, ndjson, 100, Settings{}},
		{"collector-ndjson100", nil, ndjson, 100, Settings{}},
		{"collector-intake", nil, single, 1, Settings{Intake: true}},
		{"collector-intake-ndjson100", nil, ndjson, 100, Settings{Intake: true}},
	} {
		b.Run(v.name, func(b *testing.B) {
			url, _ := feedtest.NewServer(b, v.opts...)
			nc := feedtest.Connect(b, url)
			nc.SetErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
			sink := &countingSink{}
			c, _ := startCollector(b, nc, sink, v.settings)
			runThroughput(b, url, v.payload, v.perMsg, func() (events, dropped int64) {
				return sink.n.Load(), int64(c.Stats().Dropped) * int64(v.perMsg)
			})
		})
	}
}

func ptr[T any](v T) *T { return &v }

// runThroughput publishes ceil(b.N/perMsg) copies of payload and waits until
// every event has come out (or been counted as dropped).
func runThroughput(b *testing.B, url string, payload []byte, perMsg int, progress func() (events, dropped int64)) {
	pub := feedtest.Connect(b, url)
	msgs := (b.N + perMsg - 1) / perMsg
	want := int64(msgs * perMsg)
	b.SetBytes(int64(len(payload) / perMsg))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpuStart := time.Now(), testkit.ProcessCPU()
	for i := 0; i < msgs; i++ {
		if err := pub.Publish("fw.outcomes.bench", payload); err != nil {
			b.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		b.Fatal(err)
	}
	var events, dropped int64
	deadline := time.Now().Add(2 * time.Minute)
	for {
		events, dropped = progress()
		if events+dropped >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed, cpu := time.Since(start), testkit.ProcessCPU()-cpuStart
	b.StopTimer()
	b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
	if cpu > 0 && events > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(events), "cpu-ns/event")
	}
	b.ReportMetric(float64(dropped), "dropped")
	if events+dropped < want {
		b.Errorf("only %d of %d events accounted for (%d dropped)", events+dropped, want, dropped)
	}
}

// BenchmarkWorkerOnMsg measures the collector's own CPU per event, without
// NATS delivery: a subscription callback handling one message, decode
// included, handing batches to a counting sink, with the republish for
// FW_OUTCOMES off (nojs) and on (republish). The baseline is the decoder
// alone on the same bytes, in the same run.
func BenchmarkWorkerOnMsg(b *testing.B) {
	single := fleetwatch.AppendEvent(nil, ptr(benchEvent(0)))
	var ndjson []byte
	for i := 0; i < 100; i++ {
		ndjson = fleetwatch.AppendEvent(ndjson, ptr(benchEvent(i)))
		ndjson = append(ndjson, '\n')
	}
	url, _ := feedtest.NewServer(b, feedtest.WithoutJetStream())
	for _, v := range []struct {
		name    string
		payload []byte
		perMsg  int
	}{{"single", single, 1}, {"ndjson100", ndjson, 100}} {
		b.Run(v.name+"/decoder-baseline", func(b *testing.B) {
			var dec fleetwatch.Decoder
			n := 0
			count := func([]byte, *fleetwatch.Event, error) { n++ }
			b.SetBytes(int64(len(v.payload)))
			b.ReportAllocs()
			for b.Loop() {
				dec.DecodeBatch(v.payload, count)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*v.perMsg), "ns/event")
		})
		for _, stream := range []bool{false, true} {
			name := v.name + "/collector-nojs"
			if stream {
				name = v.name + "/collector-republish"
			}
			b.Run(name, func(b *testing.B) {
				nc := feedtest.Connect(b, url)
				c, err := New(nc, &countingSink{}, Settings{NoJetStream: true})
				if err != nil {
					b.Fatal(err)
				}
				if stream {
					// Turn the republish path on: NDJSON encoding and a core
					// publish on fw.accepted.<pool>, which no stream captures
					// on this server.
					if c.js, err = jetstream.New(nc); err != nil {
						b.Fatal(err)
					}
				}
				w := newWorker(c)
				msg := &nats.Msg{Subject: "fw.outcomes.bench", Data: v.payload}
				b.SetBytes(int64(len(v.payload)))
				b.ReportAllocs()
				for b.Loop() {
					w.onMsg(msg) // full batches and 64 KiB stream buffers are handed over inside
				}
				w.flush(false)
				w.flush(true)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*v.perMsg), "ns/event")
			})
		}
	}
}
