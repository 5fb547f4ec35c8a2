package analyzer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

func TestLimitsRejectConfigThatDoesNotFit(t *testing.T) {
	twoBackends := PoolConfig{ID: "p", Backends: []BackendConfig{{ID: "a"}, {ID: "b"}}}
	tests := []struct {
		name    string
		cfg     Config
		wantKey string
	}{
		{"negative max_pools", Config{Limits: Limits{MaxPools: -1}}, "limits.max_pools"},
		{"negative max_backends", Config{Limits: Limits{MaxBackends: -3}}, "limits.max_backends"},
		{"more pools than max_pools", Config{Limits: Limits{MaxPools: 1}, Pools: []PoolConfig{{ID: "p"}, {ID: "q"}}}, "limits.max_pools"},
		{"more backends in a pool than max_backends_per_pool", Config{Limits: Limits{MaxBackendsPerPool: 1}, Pools: []PoolConfig{twoBackends}}, "limits.max_backends_per_pool"},
		{"more backends than max_backends", Config{Limits: Limits{MaxBackends: 3}, Pools: []PoolConfig{twoBackends, {ID: "q", Backends: []BackendConfig{{ID: "a"}, {ID: "b"}}}}}, "limits.max_backends"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			var se *SettingError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New error = %v, want a *SettingError wrapping ErrInvalidConfig", err)
			}
			if se.Key != tt.wantKey {
				t.Errorf("key = %q, want %q (error %v)", se.Key, tt.wantKey, err)
			}
		})
	}
	// Exactly at the limits fits.
	if _, err := New(Config{Limits: Limits{MaxPools: 1, MaxBackendsPerPool: 2, MaxBackends: 2}, Pools: []PoolConfig{twoBackends}}); err != nil {
		t.Errorf("a configuration exactly at the limits: %v", err)
	}
}

func TestLimitsDefaults(t *testing.T) {
	want := Limits{MaxPools: DefaultMaxPools, MaxBackendsPerPool: DefaultMaxBackendsPerPool, MaxBackends: DefaultMaxBackends}
	if diff := cmp.Diff(want, Limits{}.WithDefaults()); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if got := (Limits{MaxPools: 5}).WithDefaults().MaxPools; got != 5 {
		t.Errorf("MaxPools 5 became %d", got)
	}
}

// TestDefaultsHoldAFleetOf10kBackends: with the default limits one
// analyzer takes a fleet of 100 pools of 100 backends whole, as the survivor
// of a failover must (the default of 5,000 refused half of it).
func TestDefaultsHoldAFleetOf10kBackends(t *testing.T) {
	a := newAnalyzer(t, Config{})
	batch := make([]fleetwatch.Event, 0, 10_000)
	for p := range 100 {
		for b := range 100 {
			batch = append(batch, event(fmt.Sprintf("pool-%03d", p), fmt.Sprintf("backend-%03d", b), ok, at(time.Second), 100))
		}
	}
	_, refused := a.ObserveRefusing(batch, []fleetwatch.Refusal{})
	if len(refused) != 0 {
		t.Errorf("%d of 10,000 events refused with the default limits (first: %+v)", len(refused), refused[0])
	}
	if st := a.Stats(); st.Backends != 10_000 {
		t.Errorf("%d backends tracked, want 10,000", st.Backends)
	}
}

// TestObserveRefusesBeyondLimits: configured backends always fit and count
// toward the limits; an event for a new pool or backend beyond a limit is
// refused with its index and reason, and leaves nothing behind.
func TestObserveRefusesBeyondLimits(t *testing.T) {
	a := newAnalyzer(t, Config{
		Limits: Limits{MaxPools: 2, MaxBackendsPerPool: 2, MaxBackends: 3},
		Pools:  []PoolConfig{{ID: "conf", Backends: []BackendConfig{{ID: "c1"}}}},
	})
	ts := at(0)
	batch := []fleetwatch.Event{
		event("conf", "c1", ok, ts, 100), // 0 configured
		event("conf", "x", ok, ts, 100),  // 1 new backend: 2 in conf, 2 in total
		event("conf", "y", ok, ts, 100),  // 2 conf is full
		event("p", "a", ok, ts, 100),     // 3 new pool: 2 pools, 3 backends
		event("q", "a", ok, ts, 100),     // 4 a third pool
		event("p", "b", ok, ts, 100),     // 5 3 backends in total
		event("p", "a", fail, ts, 0),     // 6 known
		event("conf", "y", ok, ts, 100),  // 7 still full
	}
	urgent, refused := a.ObserveRefusing(batch, []fleetwatch.Refusal{})
	if urgent {
		t.Errorf("urgent after one failure")
	}
	want := []fleetwatch.Refusal{
		{Index: 2, Reason: fleetwatch.ReasonTooManyBackends},
		{Index: 4, Reason: fleetwatch.ReasonTooManyPools},
		{Index: 5, Reason: fleetwatch.ReasonTooManyBackends},
		{Index: 7, Reason: fleetwatch.ReasonTooManyBackends},
	}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if pools, backends := a.Tracked(); pools != 2 || backends != 3 {
		t.Errorf("tracked %d pools, %d backends; want 2, 3", pools, backends)
	}
	if diff := cmp.Diff(RefusedCounts{Pools: 1, Backends: 3}, a.Refused()); diff != "" {
		t.Errorf("refused counts (-want +got):\n%s", diff)
	}
	ev := a.Evaluate(at(time.Second))
	var pools []string
	for _, s := range ev.Snapshots {
		pools = append(pools, s.Pool)
	}
	if diff := cmp.Diff([]string{"conf", "p"}, pools); diff != "" {
		t.Errorf("snapshots (-want +got):\n%s", diff)
	}
	if b := backendOf(t, a, "p", "a", at(time.Second)); b.Requests != 2 {
		t.Errorf("p/a counted %d requests, want 2", b.Requests)
	}
	// Observe without the slice refuses the same way.
	a.Observe([]fleetwatch.Event{event("r", "a", ok, ts, 100)})
	if got := a.Refused().Pools; got != 2 {
		t.Errorf("refused pools after Observe = %d, want 2", got)
	}
}

// TestLimitsFreedByExpiry: an expired backend and its emptied pool make
// room again, and a pool that comes back continues its seq.
func TestLimitsFreedByExpiry(t *testing.T) {
	s := Settings{Expiry: time.Minute}
	a := newAnalyzer(t, Config{Settings: s, Limits: Limits{MaxPools: 1, MaxBackends: 1}})
	a.Observe([]fleetwatch.Event{event("p", "a", ok, at(0), 100)})
	first := a.Evaluate(at(0)).Snapshots
	_, refused := a.ObserveRefusing([]fleetwatch.Event{event("q", "a", ok, at(time.Second), 100), event("p", "b", ok, at(time.Second), 100)}, nil)
	if refused != nil {
		t.Errorf("a nil slice grew: %v", refused)
	}
	if got := a.Refused(); got.Pools != 1 || got.Backends != 1 {
		t.Errorf("refused = %+v, want one pool and one backend", got)
	}
	var last uint64
	for sec := 1; sec <= 70; sec++ {
		for _, snap := range a.Evaluate(at(time.Duration(sec) * time.Second)).Snapshots {
			last = snap.Seq
		}
	}
	if pools, backends := a.Tracked(); pools != 0 || backends != 0 {
		t.Fatalf("after expiry: %d pools, %d backends tracked, want none", pools, backends)
	}
	if last <= first[0].Seq {
		t.Fatalf("no snapshot after the first")
	}
	_, refused = a.ObserveRefusing([]fleetwatch.Event{event("p", "c", ok, at(71*time.Second), 100)}, []fleetwatch.Refusal{})
	if len(refused) != 0 {
		t.Errorf("refused %v after expiry made room", refused)
	}
	snaps := a.Evaluate(at(71 * time.Second)).Snapshots
	if len(snaps) != 1 || snaps[0].Seq != last+1 {
		t.Errorf("snapshots after return = %+v, want p with seq %d", snaps, last+1)
	}
}

// TestRetiredSeqBounded: a publisher cycling through invented pools cannot
// grow the memory of retired pools' seqs beyond MaxPools entries, and a
// pool's seq never goes backwards when it returns.
func TestRetiredSeqBounded(t *testing.T) {
	a := newAnalyzer(t, Config{Settings: Settings{Expiry: time.Minute}, Limits: Limits{MaxPools: 3}})
	lastSeq := map[string]uint64{}
	now := at(0)
	for round := 0; round < 20; round++ {
		id := fmt.Sprintf("pool-%d", round%7)
		a.Observe([]fleetwatch.Event{event(id, "a", ok, now, 100)})
		for range 70 {
			for _, snap := range a.Evaluate(now).Snapshots {
				if snap.Seq <= lastSeq[snap.Pool] {
					t.Fatalf("round %d: pool %s seq %d after %d", round, snap.Pool, snap.Seq, lastSeq[snap.Pool])
				}
				lastSeq[snap.Pool] = snap.Seq
			}
			now = now.Add(time.Second)
		}
		if n := len(a.retiredSeq); n > 3 {
			t.Fatalf("round %d: %d retired seqs kept, want at most MaxPools (3)", round, n)
		}
	}
}

// TestObserveRefusingAllocatesNothing: refusing events with a reused slice
// allocates nothing.
func TestObserveRefusingAllocatesNothing(t *testing.T) {
	a := newAnalyzer(t, Config{Limits: Limits{MaxPools: 1, MaxBackends: 1}})
	batch := []fleetwatch.Event{event("p", "a", ok, at(0), 100), event("p", "b", ok, at(0), 100), event("q", "a", ok, at(0), 100)}
	a.Evaluate(at(0))
	refused := make([]fleetwatch.Refusal, 0, len(batch))
	allocs := testing.AllocsPerRun(100, func() {
		_, refused = a.ObserveRefusing(batch, refused[:0])
	})
	if allocs != 0 {
		t.Errorf("ObserveRefusing allocates %v times per batch", allocs)
	}
	if len(refused) != 2 {
		t.Errorf("refused %v, want 2", refused)
	}
}

// BenchmarkObserveRefused is the cost per event of a flood the limits
// refuse: every event names a pool or backend not tracked, with the
// limits full, in batches of 64 through ObserveRefusing with a reused
// slice.
func BenchmarkObserveRefused(b *testing.B) {
	a := newAnalyzer(b, Config{Limits: Limits{MaxPools: 10, MaxBackends: 100}})
	var fill []fleetwatch.Event
	for i := range 100 {
		fill = append(fill, event(fmt.Sprintf("pool-%d", i%10), fmt.Sprintf("b-%d", i), ok, at(0), 100))
	}
	a.Observe(fill)
	batch := make([]fleetwatch.Event, 64)
	for i := range batch {
		if i%2 == 0 {
			batch[i] = event(fmt.Sprintf("invented-%d", i), "b", ok, at(0), 100)
		} else {
			batch[i] = event("pool-1", fmt.Sprintf("invented-%d", i), ok, at(0), 100)
		}
	}
	refused := make([]fleetwatch.Refusal, 0, len(batch))
	b.ReportAllocs()
	for done := 0; b.Loop(); done += len(batch) {
		_, refused = a.ObserveRefusing(batch, refused[:0])
	}
	if len(refused) != len(batch) {
		b.Fatalf("refused %d of %d", len(refused), len(batch))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/event")
}
