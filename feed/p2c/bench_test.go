package p2c

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// benchPicker is a picker over n healthy backends with a fresh snapshot,
// reading the real clock as a router would.
func benchPicker(b *testing.B, n int) *Picker {
	return benchPickerClock(b, n, nil)
}

// benchPickerClock is benchPicker with an injected clock (nil: time.Now).
func benchPickerClock(b *testing.B, n int, now func() time.Time) *Picker {
	b.Helper()
	p := New(Settings{RetryRatio: -1, Now: now})
	bs := ids(n)
	for i := range bs {
		bs[i].EWMATTFTMs = floatPtr(100 + float64(i%7)*30)
		bs[i].Weight = 0.5 + float64(i%3)/4
	}
	snap := pool(1, bs...)
	snap.At.Time = time.Now()
	snap.TTLMs = int64(time.Hour / time.Millisecond)
	p.Update(snap)
	return p
}

func floatPtr(v float64) *float64 { return &v }

var sink Choice

func benchPick(b *testing.B, n int, req func(i uint64) Request) {
	benchPickWith(b, benchPicker(b, n), req)
}

func benchPickWith(b *testing.B, p *Picker, req func(i uint64) Request) {
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	i := uint64(0)
	for b.Loop() {
		c, err := p.Pick(r, req(i))
		if err != nil {
			b.Fatal(err)
		}
		sink = c
		c.Done(fleetwatch.OutcomeOK, 100, false)
		i++
	}
}

func plain(uint64) Request { return Request{} }

// prefixed draws from 64 shared prefixes.
func prefixed(i uint64) Request { return Request{Prefix: mix64(i % 64), HasPrefix: true} }

func BenchmarkPick8(b *testing.B)            { benchPick(b, 8, plain) }
func BenchmarkPick100(b *testing.B)          { benchPick(b, 100, plain) }
func BenchmarkPick1000(b *testing.B)         { benchPick(b, 1000, plain) }
func BenchmarkPickAffinity8(b *testing.B)    { benchPick(b, 8, prefixed) }
func BenchmarkPickAffinity100(b *testing.B)  { benchPick(b, 100, prefixed) }
func BenchmarkPickAffinity1000(b *testing.B) { benchPick(b, 1000, prefixed) }

// BenchmarkPickFixedClock separates the picker's own cost from the clock
// read (time.Now costs about 40 ns on this virtual machine): the clock is a
// function returning a fixed time, as in the simulator.
func BenchmarkPickFixedClock(b *testing.B) {
	fixed := time.Now()
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			benchPickWith(b, benchPickerClock(b, n, func() time.Time { return fixed }), plain)
		})
	}
}

// BenchmarkClockRead is the cost of time.Now alone, for the ratio.
func BenchmarkClockRead(b *testing.B) {
	var t time.Time
	for b.Loop() {
		t = time.Now()
	}
	_ = t
}

// BenchmarkPickSeedScore is BenchmarkPick100 with the seed's score.
func BenchmarkPickSeedScore100(b *testing.B) {
	p := benchPickerWith(b, 100, New(Settings{RetryRatio: -1, Score: SeedScore}))
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		c, _ := p.Pick(r, Request{})
		sink = c
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}
}

func benchPickerWith(b *testing.B, n int, p *Picker) *Picker {
	src := benchPicker(b, n)
	p.state.Store(src.state.Load())
	return p
}

// BenchmarkPickBudgeted100 includes the retry budget's deposit (a mutex and
// an exp per first attempt).
func BenchmarkPickBudgeted100(b *testing.B) {
	p := benchPickerWith(b, 100, New(Settings{}))
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		c, _ := p.Pick(r, Request{})
		sink = c
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}
}

// BenchmarkUniformBaseline is the same-run baseline: a plain uniform random
// pick over the same snapshot (one draw, no weights, no score, no clock).
func BenchmarkUniformBaseline(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := benchPicker(b, n)
			st := p.state.Load()
			r := rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for b.Loop() {
				i := uniformInt(r.Uint64(), len(st.entries))
				sink = Choice{Backend: st.entries[i].id, Index: i}
			}
		})
	}
}

// BenchmarkPickParallel measures contention on the shared in-flight
// counters: each goroutine picks, starts and finishes requests.
func BenchmarkPickParallel100(b *testing.B) {
	p := benchPicker(b, 100)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 2))
		for pb.Next() {
			c, _ := p.Pick(r, Request{})
			c.Done(fleetwatch.OutcomeOK, 100, false)
		}
	})
}

// BenchmarkUpdate measures applying a snapshot (tables, affinity) for
// pools of 8, 100 and 1,000: "same" keeps the membership (the affinity
// table is shared), "churn" removes and re-adds one backend each time (the
// table is updated incrementally).
func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		bs := ids(n)
		for _, mode := range []string{"same", "churn"} {
			b.Run(fmt.Sprintf("%d/%s", n, mode), func(b *testing.B) {
				p := New(Settings{})
				full, less := pool(1, bs...), pool(1, bs[1:]...)
				p.Update(full)
				b.ReportAllocs()
				seq := uint64(1)
				for b.Loop() {
					seq++
					snap := full
					if mode == "churn" && seq%2 == 0 {
						snap = less
					}
					snap.Seq = seq // Update keeps nothing of the snapshot
					p.Update(snap)
				}
			})
		}
	}
}

// BenchmarkPickStale is the stale path (no feed: equal weights and local
// signals) over 8, 100 and 1,000 backends, with a fixed clock; every
// outcome is a success.
func BenchmarkPickStale(b *testing.B) {
	fixed := time.Now()
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := New(Settings{RetryRatio: -1, Now: func() time.Time { return fixed.Add(time.Hour) }})
			snap := pool(1, ids(n)...)
			snap.At.Time = fixed
			p.Update(snap)
			benchPickWith(b, p, plain)
		})
	}
}

// BenchmarkPickStaleTripped is BenchmarkPickStale with one backend's local
// breaker open: the draws weigh the candidates by their local breakers.
func BenchmarkPickStaleTripped(b *testing.B) {
	fixed := time.Now()
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := New(Settings{RetryRatio: -1, Now: func() time.Time { return fixed.Add(time.Hour) }})
			snap := pool(1, ids(n)...)
			snap.At.Time = fixed
			p.Update(snap)
			for range DefaultLocalFailures {
				c, _ := p.Choose("b0001")
				c.Done(fleetwatch.OutcomeError, 1, false)
			}
			benchPickWith(b, p, plain)
		})
	}
}

// benchLoadPicker is benchPickerClock with a published load on every
// backend and 8 routers, so that the default score ranks by the fleet-load
// estimate over 3 choices.
func benchLoadPicker(b *testing.B, n int, s Settings) *Picker {
	b.Helper()
	fixed := time.Now()
	s.RetryRatio, s.Now = -1, func() time.Time { return fixed }
	p := New(s)
	bs := ids(n)
	for i := range bs {
		bs[i].EWMATTFTMs = floatPtr(100 + float64(i%7)*30)
		bs[i].Weight = 0.5 + float64(i%3)/4
		bs[i].Load = &fleetwatch.Load{Running: float64(i % 11), Waiting: float64(i % 3), AgeMs: 200, Source: "event"}
	}
	snap := pool(1, bs...)
	snap.At.Time = fixed
	snap.TTLMs = int64(time.Hour / time.Millisecond)
	snap.Routers = 8
	p.Update(snap)
	return p
}

// BenchmarkPickLoad is the default picker (load score, 3 choices) over a
// snapshot with loads; BenchmarkPickInFlight2 is the previous default (the
// in-flight score, 2 choices) over the same snapshot, for the ratio in one
// binary. Both with a fixed clock.
func BenchmarkPickLoad(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) { benchPickWith(b, benchLoadPicker(b, n, Settings{}), plain) })
	}
}

func BenchmarkPickInFlight2(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			benchPickWith(b, benchLoadPicker(b, n, Settings{Score: InFlightScore, Choices: 2}), plain)
		})
	}
}

// benchDefaultPicker is a picker with the default score and choices (the
// load score over 3 choices) reading time.Now, over the snapshot of
// benchLoadPicker (published loads, 8 routers). The retry budget is off, as
// in the other pick benchmarks (BenchmarkPickBudgeted100 measures it).
func benchDefaultPicker(b *testing.B, n int) (*Picker, *fleetwatch.Snapshot) {
	return benchDefaultPickerWith(b, n, Settings{})
}

// benchDefaultPickerWith is benchDefaultPicker with settings s (the retry
// budget off).
func benchDefaultPickerWith(b *testing.B, n int, s Settings) (*Picker, *fleetwatch.Snapshot) {
	b.Helper()
	s.RetryRatio = -1
	p := New(s)
	bs := ids(n)
	for i := range bs {
		bs[i].EWMATTFTMs = floatPtr(100 + float64(i%7)*30)
		bs[i].Weight = 0.5 + float64(i%3)/4
		bs[i].Load = &fleetwatch.Load{Running: float64(i % 11), Waiting: float64(i % 3), AgeMs: 200, Source: "event"}
	}
	snap := pool(1, bs...)
	snap.At.Time = time.Now()
	snap.TTLMs = int64(time.Hour / time.Millisecond)
	snap.Routers = 8
	p.Update(snap)
	return p, snap
}

// benchPickDefault picks on benchDefaultPicker. The published loads would
// go stale (Settings.LoadStale, 2s) during a long run and the score would
// fall back to the cheaper local count, so the snapshot is re-applied with
// the clock's time every 4,096 picks, outside the timer.
func benchPickDefault(b *testing.B, n int) { benchPickDefaultWith(b, n, Settings{}) }

func benchPickDefaultWith(b *testing.B, n int, s Settings) {
	p, snap := benchDefaultPickerWith(b, n, s)
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i++; i%4096 == 0 {
			b.StopTimer()
			snap.Seq++
			snap.At.Time = time.Now()
			p.Update(snap)
			b.StartTimer()
		}
		c, err := p.Pick(r, Request{})
		if err != nil {
			b.Fatal(err)
		}
		sink = c
		c.Done(fleetwatch.OutcomeOK, 100, false)
	}
}

// BenchmarkPickDefault is the default pick (load score, 3 choices, time.Now
// per pick) over 8, 100 and 1,000 backends with published loads;
// BenchmarkPickLoad is the same with a fixed clock. BenchmarkLeastConnScan
// is their same-run baseline.
func BenchmarkPickDefault8(b *testing.B)    { benchPickDefault(b, 8) }
func BenchmarkPickDefault100(b *testing.B)  { benchPickDefault(b, 100) }
func BenchmarkPickDefault1000(b *testing.B) { benchPickDefault(b, 1000) }

// BenchmarkPickSampled is BenchmarkPickDefault with Choices 3: 3 sampled
// candidates instead of the scan (the default for 8 routers before
// 2026-12-05).
func BenchmarkPickSampled(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) { benchPickDefaultWith(b, n, Settings{Choices: 3}) })
	}
}

// benchLeastConnScan is a plain least-connections balancer over the state
// of benchDefaultPicker: it scans every backend that is not open for the
// lowest in-flight count (the first on a tie), and counts the request in
// flight there until it is done, as the picker does. No clock, no
// randomness, no weights.
func benchLeastConnScan(b *testing.B, n int) {
	p, _ := benchDefaultPicker(b, n)
	st := p.state.Load()
	b.ReportAllocs()
	for b.Loop() {
		best, bestLoad := -1, int64(0)
		for i := range st.entries {
			e := &st.entries[i]
			if e.state == fleetwatch.StateOpen {
				continue
			}
			if l := e.local.inFlight.Load(); best < 0 || l < bestLoad {
				best, bestLoad = i, l
			}
		}
		l := st.entries[best].local
		l.inFlight.Add(1)
		sink = Choice{Backend: st.entries[best].id, Index: best}
		l.inFlight.Add(-1)
	}
}

func BenchmarkLeastConnScan8(b *testing.B)    { benchLeastConnScan(b, 8) }
func BenchmarkLeastConnScan100(b *testing.B)  { benchLeastConnScan(b, 100) }
func BenchmarkLeastConnScan1000(b *testing.B) { benchLeastConnScan(b, 1000) }

// benchThreeChoiceFloor is the least any pick over three random choices
// does, for the ratio at small pools: three uniform draws (not distinct, no
// weights), the three in-flight loads, the lowest, and the in-flight
// increment and decrement of the scan. No clock, score, EWMA or breaker.
func benchThreeChoiceFloor(b *testing.B, n int) {
	p, _ := benchDefaultPicker(b, n)
	st := p.state.Load()
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		best, bestLoad := -1, int64(0)
		for range 3 {
			i := uniformInt(r.Uint64(), len(st.entries))
			if l := st.entries[i].local.inFlight.Load(); best < 0 || l < bestLoad {
				best, bestLoad = i, l
			}
		}
		l := st.entries[best].local
		l.inFlight.Add(1)
		sink = Choice{Backend: st.entries[best].id, Index: best}
		l.inFlight.Add(-1)
	}
}

func BenchmarkThreeChoiceFloor8(b *testing.B)    { benchThreeChoiceFloor(b, 8) }
func BenchmarkThreeChoiceFloor100(b *testing.B)  { benchThreeChoiceFloor(b, 100) }
func BenchmarkThreeChoiceFloor1000(b *testing.B) { benchThreeChoiceFloor(b, 1000) }
