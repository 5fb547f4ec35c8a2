package serve

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// BenchmarkFeedSecond10k is one second of serve's decision loop at fleet
// scale: 100 pools of 100 backends, 10 events a second per backend with
// their loads moving, evaluated on serve's tick (evaluateEvery: 25 ms, the
// pools due at each; analyzer.EvaluateDue), each evaluation's snapshots published (JSON and compact frames, the KV puts
// queued) and its load beats sent as load frames, to an embedded NATS
// server with JetStream. One op is one simulated second, so ns/op over
// 1e9 is the share of a core it takes (the events' Observe is the
// collector's, outside the timer). The goal (issue 33): under 10% of a
// core here with 1,000 routers counted.
func BenchmarkFeedSecond10k(b *testing.B) {
	every := evaluateEvery(analyzer.Settings{}.WithDefaults())
	// The same-run baseline: every pool at once on a 250 ms tick, as serve
	// evaluated before the pools took their own phases.
	b.Run("all-250ms", func(b *testing.B) { benchFeedSecond(b, 250*time.Millisecond, false) })
	b.Run("due-"+every.String(), func(b *testing.B) { benchFeedSecond(b, every, true) })
}

func benchFeedSecond(b *testing.B, every time.Duration, dueOnly bool) {
	const pools, perPool, perSecond, routers = 100, 100, 10, 1000
	url, _ := feedtest.NewServer(b)
	nc := feedtest.Connect(b, url)
	pub, err := feed.NewPublisher(b.Context(), nc, feed.PublisherSettings{})
	if err != nil {
		b.Fatal(err)
	}
	var cfg analyzer.Config
	for p := range pools {
		pc := analyzer.PoolConfig{ID: fmt.Sprintf("pool-%03d", p)}
		for k := range perPool {
			pc.Backends = append(pc.Backends, analyzer.BackendConfig{ID: fmt.Sprintf("http://10.%d.%d.%d:8000", p/100, p%100, k)})
		}
		cfg.Pools = append(cfg.Pools, pc)
	}
	a, err := analyzer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	events := make([]fleetwatch.Event, 0, pools*perPool*perSecond)
	second := func(s int) []fleetwatch.Event {
		events = events[:0]
		for i := range pools * perPool * perSecond {
			p, k := i%pools, (i/pools)%perPool
			events = append(events, fleetwatch.Event{Pool: cfg.Pools[p].ID, Backend: cfg.Pools[p].Backends[k].ID,
				Outcome: fleetwatch.OutcomeOK, TTFTMs: 150 + 100*rng.Float64(), HasTTFT: true,
				Running: int64(rng.IntN(8)), HasRunning: true, Waiting: int64(rng.IntN(3)), HasWaiting: true,
				Source: fmt.Sprintf("r%d", (i/pools)%routers),
				TS:     t0.Add(time.Duration(s)*time.Second + time.Duration(i)*time.Second/time.Duration(pools*perPool*perSecond))})
		}
		return events
	}
	loop := func(s int) (snaps, beats int) {
		for at := every; at <= time.Second; at += every {
			var ev analyzer.Evaluation
			if now := t0.Add(time.Duration(s)*time.Second + at); dueOnly {
				ev = a.EvaluateDue(now)
			} else {
				ev = a.Evaluate(now)
			}
			for i := range ev.Snapshots {
				if err := pub.Publish(b.Context(), &ev.Snapshots[i]); err != nil {
					b.Fatal(err)
				}
			}
			for i := range ev.Loads {
				if err := pub.PublishLoads(&ev.Loads[i]); err != nil {
					b.Fatal(err)
				}
			}
			snaps, beats = snaps+len(ev.Snapshots), beats+len(ev.Loads)
		}
		return snaps, beats
	}
	for s := range 30 { // a full window first
		a.Observe(second(s))
		loop(s)
	}
	b.ReportAllocs()
	b.ResetTimer()
	snaps, beats := 0, 0
	for i := range b.N {
		b.StopTimer()
		a.Observe(second(30 + i))
		b.StartTimer()
		n, m := loop(30 + i)
		snaps, beats = snaps+n, beats+m
	}
	b.StopTimer()
	if err := pub.Flush(b.Context()); err != nil {
		b.Fatal(err)
	}
	if snaps < b.N*pools || beats < b.N*pools*2 {
		b.Fatalf("%d snapshots and %d load beats in %d seconds of %d pools: want one snapshot and three load beats a second per pool", snaps, beats, b.N, pools)
	}
	b.ReportMetric(float64(snaps)/float64(b.N), "snapshots/s")
	b.ReportMetric(float64(beats)/float64(b.N), "load-beats/s")
	if snap, _ := a.Snapshot(cfg.Pools[0].ID, t0.Add(time.Duration(30+b.N)*time.Second)); snap.Routers != routers {
		b.Fatalf("routers %d, want %d", snap.Routers, routers)
	}
}
