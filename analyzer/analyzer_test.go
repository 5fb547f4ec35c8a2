package analyzer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSnapshotFields(t *testing.T) {
	cost := 0.6
	a := newAnalyzer(t, Config{
		Epoch: "test-epoch",
		Pools: []PoolConfig{{
			ID: "llama", Mode: fleetwatch.ModeFailover, AllOpen: fleetwatch.AllOpenSpread, AffinityTolerance: 3,
			Backends: []BackendConfig{{ID: "b", Priority: 0}, {ID: "a", Priority: 1, CostPerMTok: &cost}},
		}},
	})
	evs := series("llama", "a", ok, 10, t0, 5*time.Second, 100)
	evs = append(evs, alternate("llama", "a", 5, at(5*time.Second), 4*time.Second, 0, fail, fail, throttled, canceled, clientErr)...)
	a.Observe(evs)
	now := at(10 * time.Second)
	ev := a.Evaluate(now)
	p100 := binValue(int(binOf(100)))
	want := fleetwatch.Snapshot{
		V: 1, Pool: "llama", Epoch: "test-epoch", Seq: 1, At: fleetwatch.At(now), TTLMs: 5000,
		Mode: fleetwatch.ModeFailover, AllOpen: fleetwatch.AllOpenSpread, AffinityTolerance: 3,
		MedianEWMATTFTMs: new(float64(100)),
		Backends: []fleetwatch.Backend{
			{
				Backend: "a", State: fleetwatch.StateClosed, Priority: 1,
				// n = 13 counted, observed weight 1 - (1/13)/0.5, prior 1, k = 5.
				Weight: 0.8889,
				Reason: "not evaluated: 14 of 20 requests, 1 of them client errors; weight 0.89: 429 pressure (rate_429 0.08 of throttle_rate 0.50 gives 0.85), " +
					"shrinkage toward the pool's 1.00 over 13 requests (k 5) gives 0.89",
				EWMATTFTMs: new(float64(100)), P50TTFTMs: new(float64(p100)), P95TTFTMs: new(float64(p100)),
				SuccessRate: new(float64(10.0 / 12)), Rate429: new(float64(1.0 / 13)),
				Requests: 15, WindowMs: 30000, Drift: fleetwatch.DriftUnknown, CostPerMTok: new(float64(0.6)),
				Since: new(fleetwatch.At(now)),
			},
			{
				Backend: "b", State: fleetwatch.StateClosed, Weight: 1, WindowMs: 30000, Reason: "not evaluated: 0 of 20 requests",
				Drift: fleetwatch.DriftUnknown, Since: new(fleetwatch.At(now)),
			},
		},
	}
	if len(ev.Snapshots) != 1 {
		t.Fatalf("%d snapshots, want 1", len(ev.Snapshots))
	}
	if diff := cmp.Diff(want, ev.Snapshots[0], cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
	// Snapshots returns the same without advancing seq.
	if diff := cmp.Diff([]fleetwatch.Snapshot{want}, a.Snapshots(now), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("Snapshots (-want +got):\n%s", diff)
	}
	if p100 < 97 || p100 > 103 {
		t.Errorf("p50 of 100ms samples reported as %v", p100)
	}
}

func TestSnapshotOpenAndMedian(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(100, "a"), healthy(300, "b"), healthy(200, "c"), series("p", "x", fail, 5, t0, 5*time.Second, 0)))
	now := at(10 * time.Second)
	a.Evaluate(now)
	snap, _ := a.Snapshot("p", now)
	if snap.MedianEWMATTFTMs == nil || *snap.MedianEWMATTFTMs != 200 {
		t.Errorf("median %v, want 200 (x has no EWMA)", snap.MedianEWMATTFTMs)
	}
	var ids []string
	for _, d := range snap.Backends {
		ids = append(ids, d.Backend)
		if (d.OpenUntil != nil) != (d.State == fleetwatch.StateOpen) {
			t.Errorf("%s: state %s open_until %v", d.Backend, d.State, d.OpenUntil)
		}
	}
	if !slices.IsSorted(ids) {
		t.Errorf("backends not sorted: %v", ids)
	}
	x := snap.Find("x")
	if x.SuccessRate == nil || *x.SuccessRate != 0 || x.Rate429 == nil || *x.Rate429 != 0 || x.P50TTFTMs != nil {
		t.Errorf("x: success %v rate429 %v p50 %v", x.SuccessRate, x.Rate429, x.P50TTFTMs)
	}
	if !x.OpenUntil.Equal(now.Add(30*time.Second)) || !x.Since.Equal(now) {
		t.Errorf("x: open_until %v since %v", x.OpenUntil, x.Since)
	}
}

func TestEvaluatePublishing(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(200, "a", "b"), series("q", "z", ok, 3, t0, time.Second, 200)))
	type step struct {
		name    string
		events  []fleetwatch.Event
		at      time.Duration
		wantSeq map[string]uint64 // pool -> seq of the returned snapshot
	}
	// Heartbeats are a phase apart (phase): p's at 10.23 s, 11.23 s, ...,
	// q's at 10.70 s, 11.70 s, ...
	steps := []step{
		{"first Evaluate publishes every pool", nil, 10 * time.Second, map[string]uint64{"p": 1, "q": 1}},
		{"nothing changed within the heartbeat", nil, 10200 * time.Millisecond, map[string]uint64{}},
		{"p's heartbeat (a tenth of a load beat early is tolerated)", nil, 10210 * time.Millisecond, map[string]uint64{"p": 2}},
		{"q's heartbeat, a phase later", nil, 10680 * time.Millisecond, map[string]uint64{"q": 2}},
		{"a trip publishes at once", series("p", "x", fail, 5, at(10700*time.Millisecond), 50*time.Millisecond, 0), 11 * time.Second, map[string]uint64{"p": 3}},
		{"heartbeat again", nil, 12200 * time.Millisecond, map[string]uint64{"p": 4, "q": 3}},
	}
	for _, st := range steps {
		a.Observe(st.events)
		ev := a.Evaluate(at(st.at))
		got := map[string]uint64{}
		for _, s := range ev.Snapshots {
			got[s.Pool] = s.Seq
		}
		if diff := cmp.Diff(st.wantSeq, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", st.name, diff)
		}
	}
	snaps := a.Snapshots(at(12500 * time.Millisecond))
	if len(snaps) != 2 || snaps[0].Pool != "p" || snaps[0].Seq != 4 || snaps[1].Seq != 3 {
		t.Errorf("Snapshots advanced or misordered: %+v", snaps)
	}
	if _, found := a.Snapshot("nope", at(13*time.Second)); found {
		t.Error("Snapshot of an unknown pool found")
	}
}

func TestObserveUrgent(t *testing.T) {
	halfOpen := func(t *testing.T, a *Analyzer) { openX(t, a); a.Evaluate(at(36 * time.Second)) }
	closedPool := func(t *testing.T, a *Analyzer) { a.Observe(healthy(200, "a", "b")) }
	tests := []struct {
		name   string
		setup  func(*testing.T, *Analyzer)
		events []fleetwatch.Event
		want   []bool // per event
	}{
		{"healthy events are not urgent", closedPool, series("p", "x", ok, 3, t0, time.Second, 200), []bool{false, false, false}},
		{"the fifth failure in a row is urgent", closedPool, series("p", "x", fail, 6, t0, time.Second, 0),
			[]bool{false, false, false, false, true, false}},
		{"the fifth ok while half-open is urgent", halfOpen, series("p", "x", ok, 5, at(37*time.Second), time.Second, 200),
			[]bool{false, false, false, false, true}},
		{"a failure while half-open is urgent", halfOpen, series("p", "x", timeout, 2, at(37*time.Second), time.Second, 0), []bool{true, false}},
		{"a 429 while half-open is urgent", halfOpen, series("p", "x", throttled, 1, at(37*time.Second), time.Second, 0), []bool{true}},
		{"an old-generation failure is not", halfOpen, series("p", "x", fail, 1, at(20*time.Second), time.Second, 0), []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
			tt.setup(t, a)
			var got []bool
			for _, e := range tt.events {
				got = append(got, a.Observe([]fleetwatch.Event{e}))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("urgent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEventTime(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Observe([]fleetwatch.Event{{Pool: "p", Backend: "x", Outcome: fail}}) // no ts and no clock yet
	if st := a.Stats(); st.DroppedNoTime != 1 || st.Observed[fail] != 1 {
		t.Errorf("event without time before the first Evaluate: %+v", st)
	}
	a.Observe(series("p", "x", ok, 10, at(5*time.Second), 5*time.Second, 200))
	a.Evaluate(at(10 * time.Second))
	a.Observe([]fleetwatch.Event{
		event("p", "x", fail, at(4*time.Minute), 0),          // 4 minutes ahead: clamped to now + 2 heartbeats
		event("p", "x", fail, at(-30*time.Second), 0),        // older than the window: dropped
		{Pool: "p", Backend: "x", Outcome: clientErr},        // no ts: counted at the latest now
		event("p", "x", fail, at(11500*time.Millisecond), 0), // slightly ahead: counted as is
	})
	a.Observe([]fleetwatch.Event{event("p", "x", ok, at(-time.Minute), 9999)}) // old: no EWMA sample either
	st := a.Stats()
	if st.ClampedFuture != 1 || st.DroppedOld != 2 {
		t.Errorf("clamped %d dropped %d, want 1 and 2", st.ClampedFuture, st.DroppedOld)
	}
	if d := backendOf(t, a, "p", "x", at(13*time.Second)); *d.EWMATTFTMs != 200 {
		t.Errorf("an old event moved the EWMA to %v", *d.EWMATTFTMs)
	}
	// At 13s the window still holds the events of 5s..10s: the skewed event
	// did not push it 4 minutes ahead.
	if d := backendOf(t, a, "p", "x", at(13*time.Second)); d.Requests != 13 {
		t.Errorf("requests %d, want 13", d.Requests)
	}
	if d := backendOf(t, a, "p", "x", at(36*time.Second)); d.Requests != 9 {
		t.Errorf("requests at 36s %d, want 9 (the six events from 7s on and the three late ones)", d.Requests)
	}
}

func TestWeights(t *testing.T) {
	t.Run("damped ramp after recovery", func(t *testing.T) {
		a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
		openX(t, a)
		var got []float64
		for s := 36; s <= 46; s++ {
			now := at(time.Duration(s) * time.Second)
			if s == 37 {
				a.Observe(series("p", "x", ok, 5, now, 500*time.Millisecond, 200))
			}
			a.Evaluate(now)
			got = append(got, backendOf(t, a, "p", "x", now).Weight)
		}
		want := []float64{0.05, 0.30, 0.55, 0.80, 1, 1, 1, 1, 1, 1, 1}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("weights per heartbeat (-want +got):\n%s", diff)
		}
	})
	// A ramp steps on the pool's beats, heartbeats and 250 ms load beats,
	// by the time elapsed: 0.25 a second however often the caller
	// evaluates and whatever the pool's routers, so from half-open's 0.05
	// it takes 15 quarter steps after the first (3.75 s) to reach 1. At
	// the 250 ms heartbeat many routers had, a whole step per beat moved
	// it four times faster; ticks faster than the beats must not move it
	// more often, nor publish it more than once a beat.
	for _, tt := range []struct {
		name    string
		tick    time.Duration
		routers int
	}{
		{"ticks every 100 ms", 100 * time.Millisecond, 0},
		{"ticks every 250 ms, many routers", 250 * time.Millisecond, 2 * fleetwatch.ManyRouters},
	} {
		t.Run("the ramp takes as long: "+tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
			openX(t, a)
			a.Evaluate(at(36 * time.Second)) // half-open
			var routers []fleetwatch.Event
			for i := range tt.routers {
				e := event("p", "a", ok, at(36*time.Second+time.Duration(i)*time.Millisecond), 200)
				e.Source = fmt.Sprintf("router-%d", i)
				routers = append(routers, e)
			}
			a.Observe(concat(routers, series("p", "x", ok, 5, at(36100*time.Millisecond), 500*time.Millisecond, 200)))
			var start, end time.Duration
			published, beats := 0, 0
			for d := 36*time.Second + tt.tick; d <= 44*time.Second; d += tt.tick {
				ev := a.Evaluate(at(d))
				published += len(ev.Snapshots)
				beats += len(ev.Snapshots) + len(ev.Loads)
				w := backendOf(t, a, "p", "x", at(d)).Weight
				if start == 0 && w > 0.05 && w < 1 {
					start = d
				}
				if end == 0 && w == 1 {
					end = d
				}
			}
			if ramp := (end - start).Seconds(); start == 0 || ramp < 3.4 || ramp > 4.1 {
				t.Errorf("the ramp from its first step to 1 took %.2f s (from %v), want 3.75 s (0.25 a second in quarter steps)", ramp, start)
			}
			if published > beats || beats > 8*4+1 {
				t.Errorf("%d snapshots and %d beats in 8 s, want a snapshot per beat at most and 4 beats a second", published, beats)
			}
			if snap, _ := a.Snapshot("p", at(44*time.Second)); tt.routers > 0 && snap.Routers <= fleetwatch.ManyRouters {
				t.Fatalf("setup: %d routers counted, want more than %d", snap.Routers, fleetwatch.ManyRouters)
			}
		})
	}
	t.Run("shrinkage toward the pool prior", func(t *testing.T) {
		// Peers at a 429 rate of 0.25 observe weight 0.5, the prior.
		peers := concat(
			alternate("p", "a", 40, t0, 10*time.Second, 200, throttled, ok, ok, ok),
			alternate("p", "b", 40, t0, 10*time.Second, 200, throttled, ok, ok, ok))
		tests := []struct {
			name string
			x    []fleetwatch.Event
			want float64
		}{
			{"no request: the prior", series("p", "x", canceled, 1, t0, time.Second, 0), 0.5},
			{"four ok: (4x1 + 5x0.5)/9", series("p", "x", ok, 4, t0, 4*time.Second, 200), 0.7222},
			// With 20 counted requests x is part of the prior: (0.5+0.5+1)/3.
			{"forty ok: (40x1 + 5x0.667)/45", series("p", "x", ok, 40, t0, 4*time.Second, 200), 0.963},
			{"429 rate 0.45: (40x0.1 + 5x0.367)/45", alternate("p", "x", 40, t0, 4*time.Second, 200,
				throttled, ok, throttled, ok, throttled, ok, throttled, ok, throttled, ok, throttled, ok, throttled, ok, throttled, ok, throttled, ok, ok, ok), 0.1296},
			{"429 rate 0.49 floors at half_open_weight", alternate("p", "x", 100, t0, 4*time.Second, 200, rate49()...), 0.05},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				a := newAnalyzer(t, Config{})
				a.Observe(concat(peers, tt.x))
				now := at(10 * time.Second)
				a.Evaluate(now)
				if got := backendOf(t, a, "p", "x", now).Weight; got != tt.want {
					t.Errorf("weight %v, want %v", got, tt.want)
				}
			})
		}
	})
	t.Run("quarantine", func(t *testing.T) {
		tests := []struct {
			quarantine bool
			status     fleetwatch.DriftStatus
			want       float64
		}{
			{true, fleetwatch.DriftDrifted, 0},
			{true, fleetwatch.DriftSuspect, 1},
			{true, fleetwatch.DriftOK, 1},
			{false, fleetwatch.DriftDrifted, 1},
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%v %s", tt.quarantine, tt.status), func(t *testing.T) {
				a := newAnalyzer(t, Config{Quarantine: tt.quarantine})
				a.Observe(healthy(200, "a", "x"))
				a.Evaluate(at(10 * time.Second))
				a.SetDrift("p", "x", tt.status)
				a.SetDrift("p", "unknown", fleetwatch.DriftDrifted)
				a.SetDrift("nope", "x", fleetwatch.DriftDrifted)
				ev := a.Evaluate(at(10100 * time.Millisecond))
				d := backendOf(t, a, "p", "x", at(10100*time.Millisecond))
				if d.Weight != tt.want || d.Drift != tt.status {
					t.Errorf("weight %v drift %s, want %v %s", d.Weight, d.Drift, tt.want, tt.status)
				}
				if len(ev.Snapshots) != 1 {
					t.Errorf("a drift change published %d snapshots, want 1", len(ev.Snapshots))
				}
				if st := a.Stats(); st.Backends != 2 || st.Pools != 1 {
					t.Errorf("SetDrift created backends or pools: %+v", st)
				}
			})
		}
	})
}

func TestExpiry(t *testing.T) {
	a := newAnalyzer(t, Config{Pools: []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "configured"}}}}})
	a.Observe(concat(series("p", "x", ok, 3, t0, time.Second, 200), series("q", "y", ok, 3, t0, time.Second, 200)))
	a.Evaluate(at(10 * time.Second))
	ev := a.Evaluate(at(10*time.Minute + 3*time.Second))
	var expired []string
	for _, tr := range ev.Transitions {
		if tr.Cause == CauseExpired && tr.To == "" {
			expired = append(expired, tr.Pool+"/"+tr.Backend)
		}
	}
	if diff := cmp.Diff([]string{"p/x", "q/y"}, expired); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	var final []string
	for _, s := range ev.Snapshots {
		final = append(final, fmt.Sprintf("%s:%d", s.Pool, len(s.Backends)))
	}
	if diff := cmp.Diff([]string{"p:1", "q:0"}, final); diff != "" {
		t.Errorf("snapshots (-want +got):\n%s", diff)
	}
	snaps := a.Snapshots(at(11 * time.Minute))
	if len(snaps) != 1 || snaps[0].Pool != "p" || snaps[0].Backends[0].Backend != "configured" {
		t.Errorf("after expiry: %+v", snaps)
	}
	if st := a.Stats(); st.Expired != 2 || st.Backends != 1 || st.Pools != 1 {
		t.Errorf("stats %+v", st)
	}
	// A backend that comes back is tracked again (and its first event is a
	// first event again).
	a.Observe(series("q", "y", ok, 2, at(11*time.Minute), time.Second, 200))
	if d := backendOf(t, a, "q", "y", at(11*time.Minute+2*time.Second)); d.Requests != 2 || d.EWMATTFTMs == nil {
		t.Errorf("returned backend: %+v", d)
	}
	// The pool that comes back continues its seq: routers drop a snapshot
	// whose seq is not newer within the same epoch.
	ev = a.Evaluate(at(11*time.Minute + 3*time.Second))
	if len(ev.Snapshots) != 2 || ev.Snapshots[1].Pool != "q" || ev.Snapshots[1].Seq != 3 {
		t.Errorf("returned pool snapshots: %+v", ev.Snapshots)
	}
}

func TestPoolOverrides(t *testing.T) {
	a := newAnalyzer(t, Config{
		Settings: Settings{MinRequests: 10},
		Pools:    []PoolConfig{{ID: "strict", Settings: Settings{ConsecutiveFailures: 2, Window: 10 * time.Second, TTL: 2 * time.Second}}},
	})
	a.Observe(concat(
		series("strict", "x", fail, 2, t0, time.Second, 0),
		series("default", "x", fail, 2, t0, time.Second, 0),
		alternate("strict", "y", 12, t0, 5*time.Second, 200, fail, ok), // global min_requests 10 is inherited
		series("strict", "z", ok, 12, t0, 5*time.Second, 200),
		series("strict", "w", ok, 12, t0, 5*time.Second, 200),
	))
	now := at(5 * time.Second)
	a.Evaluate(now)
	tests := []struct {
		pool, backend string
		state         fleetwatch.State
		windowMs      int64
		ttlMs         int64
	}{
		{"strict", "x", fleetwatch.StateOpen, 10000, 2000},
		{"strict", "y", fleetwatch.StateOpen, 10000, 2000},
		{"default", "x", fleetwatch.StateClosed, 30000, 5000},
	}
	for _, tt := range tests {
		snap, _ := a.Snapshot(tt.pool, now)
		d := snap.Find(tt.backend)
		if d.State != tt.state || d.WindowMs != tt.windowMs || snap.TTLMs != tt.ttlMs {
			t.Errorf("%s/%s: %s window %d ttl %d, want %s %d %d", tt.pool, tt.backend, d.State, d.WindowMs, snap.TTLMs, tt.state, tt.windowMs, tt.ttlMs)
		}
	}
}

func TestEpoch(t *testing.T) {
	a := newAnalyzer(t, Config{Seed: 1})
	if a.Epoch() != "" {
		t.Fatalf("epoch before the first Evaluate: %q", a.Epoch())
	}
	a.Evaluate(t0)
	e1 := a.Epoch()
	if len(e1) != 26 || strings.Trim(e1, crockford) != "" {
		t.Fatalf("epoch %q is not 26 Crockford base32 digits", e1)
	}
	b := newAnalyzer(t, Config{Seed: 1})
	b.Evaluate(t0)
	c := newAnalyzer(t, Config{Seed: 2})
	c.Evaluate(t0)
	later := newAnalyzer(t, Config{Seed: 0})
	later.Evaluate(t0.Add(time.Millisecond))
	if b.Epoch() != e1 || c.Epoch() == e1 || e1[:10] != c.Epoch()[:10] || !(later.Epoch() > e1) {
		t.Errorf("epochs: seed 1 %s, seed 1 %s, seed 2 %s, 1ms later %s", e1, b.Epoch(), c.Epoch(), later.Epoch())
	}
	fixed := newAnalyzer(t, Config{Epoch: "mine"})
	fixed.Observe(healthy(200, "a"))
	if ev := fixed.Evaluate(t0); ev.Snapshots[0].Epoch != "mine" {
		t.Errorf("configured epoch ignored: %q", ev.Snapshots[0].Epoch)
	}
}

func TestStats(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
	a.Observe(concat(healthy(200, "a"), alternate("p", "x", 8, t0, 4*time.Second, 0, fail, timeout, throttled, canceled, clientErr, fail, fail, fail)))
	a.Evaluate(at(5 * time.Second))
	got := a.Stats()
	var wantObserved [fleetwatch.NumOutcomes]uint64
	wantObserved[ok], wantObserved[fail], wantObserved[timeout] = 25, 4, 1
	wantObserved[throttled], wantObserved[canceled], wantObserved[clientErr] = 1, 1, 1
	want := Stats{
		Pools: 1, Backends: 2, Observed: wantObserved,
		Trips:                    map[string]uint64{CauseConsecutive: 1},
		HeldByGate:               map[string]uint64{CauseFailureRate: 1, CauseThrottled: 0},
		LatencySamplesDiscounted: Discounts{First: 1},
	}
	delete(want.HeldByGate, CauseThrottled)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if got.LatencySamplesDiscounted.Total() != 1 {
		t.Errorf("total discounts %d", got.LatencySamplesDiscounted.Total())
	}
}

// TestConcurrentUse runs Observe and Evaluate on two goroutines (meaningful
// under -race).
func TestConcurrentUse(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Observe(healthy(200, "a"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			a.Observe(alternate("p", fmt.Sprint("b", i%7), 20, at(time.Duration(i)*50*time.Millisecond), 50*time.Millisecond, 200, ok, ok, fail))
		}
	}()
	published := 0
	for i := range 100 {
		published += len(a.Evaluate(at(time.Duration(i) * 100 * time.Millisecond)).Snapshots)
		_ = a.Snapshots(at(time.Duration(i) * 100 * time.Millisecond))
		_ = a.Stats()
	}
	wg.Wait()
	if published == 0 || a.Stats().Observed[ok] != 25+200*14 {
		t.Errorf("published %d, observed %v", published, a.Stats().Observed)
	}
}

// rate49 is a cycle of 100 outcomes with 49 throttled.
func rate49() []fleetwatch.Outcome {
	out := make([]fleetwatch.Outcome, 100)
	for i := range out {
		out[i] = ok
		if i%2 == 0 && i < 98 {
			out[i] = throttled
		}
	}
	return out
}

// TestObserveOddInputs: events the decoder would not produce are handled
// without poisoning state.
func TestObserveOddInputs(t *testing.T) {
	tests := []struct {
		name  string
		event fleetwatch.Event
		check func(t *testing.T, st Stats, d fleetwatch.Backend)
	}{
		{"no outcome: derived from the status", fleetwatch.Event{Status: 503},
			func(t *testing.T, st Stats, d fleetwatch.Backend) {
				if st.Observed[fail] != 1 || d.SuccessRate == nil || *d.SuccessRate != 2.0/3 {
					t.Errorf("observed %v success %v", st.Observed, d.SuccessRate)
				}
			}},
		{"unknown outcome: dropped", fleetwatch.Event{Outcome: fleetwatch.Outcome(99)},
			func(t *testing.T, st Stats, d fleetwatch.Backend) {
				if st.DroppedInvalid != 1 || d.Requests != 2 {
					t.Errorf("dropped %d requests %d", st.DroppedInvalid, d.Requests)
				}
			}},
		{"NaN TTFT: no sample", fleetwatch.Event{Outcome: ok, TTFTMs: math.NaN(), HasTTFT: true},
			func(t *testing.T, st Stats, d fleetwatch.Backend) {
				if d.EWMATTFTMs == nil || *d.EWMATTFTMs != 200 || d.Requests != 3 {
					t.Errorf("ewma %v requests %d", d.EWMATTFTMs, d.Requests)
				}
			}},
		{"negative TTFT: no sample", fleetwatch.Event{Outcome: ok, TTFTMs: -5, HasTTFT: true},
			func(t *testing.T, st Stats, d fleetwatch.Backend) {
				if d.EWMATTFTMs == nil || *d.EWMATTFTMs != 200 {
					t.Errorf("ewma %v", d.EWMATTFTMs)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{})
			a.Observe(series("p", "x", ok, 2, t0, time.Second, 200)) // the first is discounted
			e := tt.event
			e.Pool, e.Backend, e.TS = "p", "x", at(2*time.Second)
			a.Observe([]fleetwatch.Event{e})
			tt.check(t, a.Stats(), backendOf(t, a, "p", "x", at(3*time.Second)))
		})
	}
	t.Run("a retry-after of a day is honoured for an hour", func(t *testing.T) {
		a := newAnalyzer(t, Config{})
		a.Observe(concat(healthy(200, "a", "b"), withRetry(series("p", "x", throttled, 30, t0, 10*time.Second, 0), 86_400_000)))
		now := at(10 * time.Second)
		a.Evaluate(now)
		d := backendOf(t, a, "p", "x", now)
		if d.State != fleetwatch.StateOpen || d.OpenUntil.Sub(now) != time.Hour || !strings.HasSuffix(d.Reason, "retry-after 1h0m0s") {
			t.Errorf("x: %s until %v reason %q", d.State, d.OpenUntil, d.Reason)
		}
	})
}

func TestFinalAdvancesEveryPool(t *testing.T) {
	a := newAnalyzer(t, Config{})
	a.Observe(concat(healthy(200, "a"), series("q", "b", ok, 3, t0, time.Second, 100)))
	first := a.Evaluate(at(10 * time.Second))
	seqs := map[string]uint64{}
	for _, s := range first.Snapshots {
		seqs[s.Pool] = s.Seq
	}
	// Nothing changed and no heartbeat is due: Evaluate publishes nothing,
	// Final publishes every pool with a larger seq.
	if ev := a.Evaluate(at(10*time.Second + time.Millisecond)); len(ev.Snapshots) != 0 {
		t.Fatalf("Evaluate published %d snapshots with nothing due", len(ev.Snapshots))
	}
	final := a.Final(at(10*time.Second + 2*time.Millisecond))
	if len(final) != 2 {
		t.Fatalf("Final returned %d pools, want 2", len(final))
	}
	for _, s := range final {
		if s.Seq != seqs[s.Pool]+1 {
			t.Errorf("pool %s: final seq %d, want %d", s.Pool, s.Seq, seqs[s.Pool]+1)
		}
	}
}
