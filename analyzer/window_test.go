package analyzer

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

// windowOp is one step of a window scenario: add an event at second sec
// (relative to t0), or advance to second sec.
type windowOp struct {
	advance bool
	sec     int
	outcome fleetwatch.Outcome
	ttft    float64 // > 0: a latency sample
	retry   float64
}

func TestWindow(t *testing.T) {
	add := func(sec int, o fleetwatch.Outcome) windowOp { return windowOp{sec: sec, outcome: o} }
	sample := func(sec int, ms float64) windowOp { return windowOp{sec: sec, outcome: ok, ttft: ms} }
	adv := func(sec int) windowOp { return windowOp{advance: true, sec: sec} }
	type want struct {
		ok, fail, thr, canceled uint64
		requests, counted       uint64
		maxRetryMs              float64
		samples                 uint64
		dropped                 int
	}
	tests := []struct {
		name string
		ops  []windowOp
		want want
	}{
		{
			name: "counts by outcome within the window",
			ops:  []windowOp{add(0, ok), add(1, fail), add(2, throttled), add(3, canceled), add(29, ok)},
			want: want{ok: 2, fail: 1, thr: 1, canceled: 1, requests: 5, counted: 4},
		},
		{
			name: "a bucket leaves the window after 30 buckets",
			ops:  []windowOp{add(0, fail), add(1, ok), adv(30)},
			want: want{ok: 1, requests: 1, counted: 1},
		},
		{
			name: "an event newer than the head moves it and evicts",
			ops:  []windowOp{add(0, fail), add(5, ok), add(31, ok)},
			want: want{ok: 2, requests: 2, counted: 2},
		},
		{
			name: "a jump beyond the whole window clears everything",
			ops:  []windowOp{add(0, fail), add(10, ok), adv(100), add(100, throttled)},
			want: want{thr: 1, requests: 1, counted: 1},
		},
		{
			name: "an event older than the window is dropped",
			ops:  []windowOp{add(40, ok), add(10, fail), add(11, ok)},
			want: want{ok: 2, requests: 2, counted: 2, dropped: 1},
		},
		{
			name: "out of order within the window is counted",
			ops:  []windowOp{add(20, ok), add(5, fail), add(19, ok)},
			want: want{ok: 2, fail: 1, requests: 3, counted: 3},
		},
		{
			name: "advancing backwards changes nothing",
			ops:  []windowOp{add(20, ok), adv(3), add(21, fail)},
			want: want{ok: 1, fail: 1, requests: 2, counted: 2},
		},
		{
			name: "largest retry-after of the live buckets",
			ops: []windowOp{
				{sec: 0, outcome: throttled, retry: 90_000},
				{sec: 5, outcome: throttled, retry: 12_000},
				{sec: 6, outcome: throttled, retry: 3_000},
				adv(31),
			},
			want: want{thr: 2, requests: 2, counted: 2, maxRetryMs: 12_000},
		},
		{
			name: "latency samples leave with their bucket",
			ops:  []windowOp{sample(0, 100), sample(0, 200), sample(15, 300), adv(30)},
			want: want{ok: 1, requests: 1, counted: 1, samples: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWindow(30, time.Second)
			dropped := 0
			for _, op := range tt.ops {
				num := w.bucketOf(at(time.Duration(op.sec) * time.Second))
				if op.advance {
					w.advance(num)
					continue
				}
				if !w.add(num, op.outcome, op.ttft > 0, binOf(op.ttft), op.retry) {
					dropped++
				}
			}
			s := w.stats()
			var samples uint64
			if w.ttft != nil {
				samples = w.ttft.total
			}
			got := want{
				ok: s.ok(), fail: s.failures(), thr: s.throttled(), canceled: s.counts[canceled],
				requests: s.requests, counted: s.counted, maxRetryMs: s.maxRetryMs,
				samples: samples, dropped: dropped,
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("window (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWindowMatchesRecount drives a window with random events and checks
// that its running totals equal a recount of the events still in the window,
// through the sparse and the dense sample paths.
func TestWindowMatchesRecount(t *testing.T) {
	type rec struct {
		num     int64
		outcome fleetwatch.Outcome
		bin     uint16
		latency bool
		hinted  bool // a 429 with a retry hint
	}
	rng := rand.New(rand.NewPCG(7, 8))
	w := newWindow(10, 100*time.Millisecond)
	var all []rec
	base := w.bucketOf(t0)
	head := base
	for step := range 20_000 {
		// Bursts into one bucket exercise the dense path.
		burst := step%5000 < 4000
		if !burst && rng.IntN(50) == 0 || step%5000 == 0 {
			head += int64(rng.IntN(4))
		}
		num := head - int64(rng.IntN(12))
		if burst {
			num = head
		}
		o := fleetwatch.Outcome(1 + rng.IntN(fleetwatch.NumOutcomes-1))
		r := rec{num: num, outcome: o, latency: o == ok, bin: binOf(50 + rng.Float64()*1000)}
		retry := 0.0
		if rng.IntN(2) == 0 {
			retry = 1000 // a hint on any outcome; only a 429's counts as hinted
			r.hinted = o == throttled
		}
		if w.add(num, r.outcome, r.latency, r.bin, retry) {
			all = append(all, r)
		}
		if step%997 == 0 {
			var want histogram
			var counts [fleetwatch.NumOutcomes]uint64
			var hinted uint64
			for _, r := range all {
				if r.num > w.head-w.size() {
					if r.hinted {
						hinted++
					}
					counts[r.outcome]++
					if r.latency {
						want.add(r.bin)
					}
				}
			}
			if counts != w.counts {
				t.Fatalf("step %d: counts %v, recount %v", step, w.counts, counts)
			}
			if hinted != w.hinted || hinted != w.stats().hinted {
				t.Fatalf("step %d: hinted 429s %d (stats %d), recount %d", step, w.hinted, w.stats().hinted, hinted)
			}
			if same := w.resized(len(w.buckets), time.Duration(w.bucketNanos)); same.hinted != hinted {
				t.Fatalf("step %d: the window resized to its own size has %d hinted 429s, want %d", step, same.hinted, hinted)
			}
			if w.ttft != nil && w.ttft.counts != want.counts {
				t.Fatalf("step %d: histogram differs from the recount", step)
			}
		}
	}
	dense := false
	for i := range w.buckets {
		dense = dense || w.buckets[i].dense != nil
	}
	if !dense {
		t.Fatal("the scenario never used a dense bucket")
	}
	w.reset()
	if _, _, hasTTFT := w.ttftQuantiles(); w.stats().requests != 0 || hasTTFT {
		t.Fatalf("after reset: %d requests, TTFT samples %v", w.stats().requests, hasTTFT)
	}
}
