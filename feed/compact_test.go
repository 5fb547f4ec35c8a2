package feed

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fleetwatch/fleetwatch"
)

func ptrF(v float64) *float64 { return &v }

func ptrT(t time.Time) *fleetwatch.Time {
	v := fleetwatch.At(t)
	return &v
}

// fullSnapshot has every field a key frame carries, each backend a
// different mix of them.
func fullSnapshot() *fleetwatch.Snapshot {
	at := time.Date(2026, 12, 6, 12, 0, 0, 250e6, time.UTC)
	spare := 0.35
	return &fleetwatch.Snapshot{
		V: fleetwatch.ProtocolVersion, Pool: "llama", Epoch: "01JEPOCH", Seq: 42, Fence: 7,
		At: fleetwatch.At(at), TTLMs: 5000, Mode: fleetwatch.ModeFailover, AllOpen: fleetwatch.AllOpenSpread,
		Shadow: fleetwatch.ShadowObserve, MedianEWMATTFTMs: ptrF(212.5), AffinityTolerance: 2.5, Routers: 64,
		RetryBudget: &fleetwatch.RetryBudget{PerSec: 12.25, Spare: &spare},
		Backends: []fleetwatch.Backend{
			{Backend: "http://10.0.3.17:8000", State: fleetwatch.StateClosed, Weight: 0.8125, Drift: fleetwatch.DriftOK,
				EWMATTFTMs: ptrF(180.0625), P95TTFTMs: ptrF(640),
				Load: &fleetwatch.Load{Running: 7, Waiting: 2.5, AgeMs: 120, Source: fleetwatch.LoadSourceMetrics}},
			{Backend: "http://10.0.3.18:8000", State: fleetwatch.StateOpen, Weight: 0, Drift: fleetwatch.DriftDrifted,
				OpenUntil: ptrT(at.Add(30 * time.Second)), QuotaUntil: ptrT(at.Add(26 * time.Hour)),
				Override: &fleetwatch.Override{Kind: fleetwatch.OverrideForceOpen, Reason: "firmware upgrade", Who: "ops",
					Until: fleetwatch.At(at.Add(time.Hour))}},
			{Backend: "http://10.0.3.19:8000", State: fleetwatch.StateHalfOpen, Weight: 0.05, Priority: -2,
				CostPerMTok: ptrF(0.25), Drift: fleetwatch.DriftSuspect,
				Load: &fleetwatch.Load{Running: 1, AgeMs: 40, Source: fleetwatch.LoadSourceEvent}},
		},
	}
}

// routerView is what of a snapshot a router reads: the fields a key frame
// carries, as it carries them.
func routerView(s *fleetwatch.Snapshot) *fleetwatch.Snapshot {
	out := &fleetwatch.Snapshot{V: s.V, Pool: s.Pool, Epoch: s.Epoch, Seq: s.Seq, Fence: s.Fence, At: s.At,
		TTLMs: s.TTLMs, Mode: s.Mode, AllOpen: s.AllOpen, Shadow: s.Shadow, MedianEWMATTFTMs: s.MedianEWMATTFTMs,
		AffinityTolerance: s.AffinityTolerance, Routers: s.Routers, RetryBudget: s.RetryBudget}
	p95 := deadlineP95(s)
	for i, b := range s.Backends {
		v := fleetwatch.Backend{Backend: b.Backend, State: b.State, Weight: b.Weight, Priority: b.Priority,
			Drift: b.Drift, EWMATTFTMs: b.EWMATTFTMs, OpenUntil: b.OpenUntil,
			QuotaUntil: b.QuotaUntil, CostPerMTok: b.CostPerMTok, Load: b.Load, Override: b.Override}
		if i == p95 {
			v.P95TTFTMs = b.P95TTFTMs
		}
		out.Backends = append(out.Backends, v)
	}
	return out
}

// A key frame carries every field a router reads, as it was (the numbers
// to their quantum: a sixteenth of a request and of a millisecond, whole
// milliseconds of p95 and times; an override in full; the p95 TTFT only of
// the backend the router's first-token deadline reads), and names its
// number.
func TestKeyFrameRoundTrip(t *testing.T) {
	snap := fullSnapshot()
	frame := AppendKey(nil, snap, 9)
	got, n, err := DecodeKey(frame, snap.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if n != 9 {
		t.Errorf("frame number %d, want 9", n)
	}
	opts := cmp.Options{cmpopts.EquateApprox(0, 1.0/32), cmp.Comparer(func(a, b fleetwatch.Time) bool { return a.Equal(b.Time) })}
	if diff := cmp.Diff(routerView(snap), got, opts); diff != "" {
		t.Errorf("decoded key frame (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("decoded key frame does not validate: %v", err)
	}
}

// Decoding into a scratch (the watcher's refresh) gives what DecodeKey
// gives, frame after frame whatever the scratch held before (other ids,
// more backends, an override, a budget), fails on what DecodeKey fails
// on, and allocates nothing for a key frame of the ids it knows.
func TestDecodeKeyIntoScratch(t *testing.T) {
	full := fullSnapshot()
	at := time.Unix(1_700_000_000, 0)
	small := pool100(3, at)
	small.Backends = small.Backends[:2]
	opts := cmp.Comparer(func(a, b fleetwatch.Time) bool { return a.Equal(b.Time) })
	var ks keyScratch
	for i, snap := range []*fleetwatch.Snapshot{analyzerPool100(at), full, small, analyzerPool100(at.Add(time.Second)), full} {
		frame := AppendKey(nil, snap, uint64(i+1))
		want, wn, err := DecodeKey(frame, snap.Pool)
		if err != nil {
			t.Fatal(err)
		}
		ks.known = []string{"http://10.0.3.17:8000", "b-000"} // one right, one not
		got, gn, err := decodeKey(frame, snap.Pool, &ks)
		if err != nil || gn != wn {
			t.Fatalf("frame %d: %v, number %d (want %d)", i, err, gn, wn)
		}
		if diff := cmp.Diff(want, got, opts); diff != "" {
			t.Errorf("frame %d into the scratch (-DecodeKey +scratch):\n%s", i, diff)
		}
		if _, _, err := decodeKey(frame[:len(frame)-1], snap.Pool, &ks); !errors.Is(err, ErrCompact) {
			t.Errorf("frame %d cut short into the scratch: %v, want ErrCompact", i, err)
		}
	}
	snap := analyzerPool100(at)
	frame := AppendKey(nil, snap, 1)
	ks.known = nil
	for i := range snap.Backends {
		ks.known = append(ks.known, snap.Backends[i].Backend)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _, _ = decodeKey(frame, snap.Pool, &ks) }); allocs != 0 {
		t.Errorf("decoding a key frame of known ids into the scratch: %v allocations, want 0", allocs)
	}
}

// Every truncation of a frame, and frames of another version or kind, fail
// with ErrCompact, never a panic; a frame with bytes after its end fails.
func TestCompactFramesRejected(t *testing.T) {
	key := AppendKey(nil, fullSnapshot(), 1)
	enc := NewCompactEncoder(CompactSettings{})
	snap := fullSnapshot()
	enc.Frame(nil, snap, time.Unix(0, 0))
	snap.Backends[0].Load.Running += 3
	loads, kind, _ := enc.Frame(nil, snap, time.Unix(1, 0))
	if kind != FrameLoads {
		t.Fatalf("second frame %q, want a load frame", kind)
	}
	var l Loads
	for i := range len(key) {
		if _, _, err := DecodeKey(key[:i], "p"); !errors.Is(err, ErrCompact) {
			t.Errorf("key frame cut at %d of %d: %v, want ErrCompact", i, len(key), err)
		}
	}
	for i := range len(loads) {
		if err := DecodeLoads(loads[:i], &l); !errors.Is(err, ErrCompact) {
			t.Errorf("load frame cut at %d of %d: %v, want ErrCompact", i, len(loads), err)
		}
	}
	for name, data := range map[string][]byte{
		"trailing byte": append(append([]byte(nil), key...), 0),
		"version 2":     append([]byte{'F', 'W', 2}, key[3:]...),
		"kind X":        append([]byte{'F', 'W', 1, 'X'}, key[4:]...),
		"JSON":          []byte(`{"v":1}`),
	} {
		if _, _, err := DecodeKey(data, "p"); !errors.Is(err, ErrCompact) {
			t.Errorf("%s: %v, want ErrCompact", name, err)
		}
	}
	if err := DecodeLoads(key, &l); !errors.Is(err, ErrCompact) {
		t.Errorf("a key frame decoded as loads: %v, want ErrCompact", err)
	}
}

// pool100 is a 100-backend pool as a serve publishes it, each backend with
// an EWMA, a p95 and a load from its metrics.
func pool100(seq uint64, at time.Time) *fleetwatch.Snapshot {
	s := &fleetwatch.Snapshot{V: 1, Pool: "llama-3-70b", Epoch: "01JEPOCHXYZ", Seq: seq, At: fleetwatch.At(at), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, MedianEWMATTFTMs: ptrF(200), AffinityTolerance: 2.5,
		Routers: 64, RetryBudget: &fleetwatch.RetryBudget{PerSec: 20}}
	for i := range 100 {
		s.Backends = append(s.Backends, fleetwatch.Backend{Backend: fmt.Sprintf("http://10.1.%d.%d:8000", i/50, 10+i%50),
			State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftOK,
			EWMATTFTMs: ptrF(150 + float64(i)), P95TTFTMs: ptrF(600 + float64(i)),
			Load: &fleetwatch.Load{Running: float64(i % 8), Waiting: float64(i % 3), AgeMs: 80, Source: fleetwatch.LoadSourceMetrics}})
	}
	return s
}

// The encoder sends a key frame first, then load frames listing what moved
// past its threshold only: a load by LoadStep, an EWMA by EWMAStep, a load
// that went (every report's age goes in the age vector); a decision change, KeyEvery and a
// new epoch bring a key frame. Loads (a load beat) never sends a key frame.
func TestCompactEncoderListsWhatMoved(t *testing.T) {
	enc := NewCompactEncoder(CompactSettings{})
	t0 := time.Unix(1_700_000_000, 0)
	snap := pool100(1, t0)
	frame, kind, changed := enc.Frame(nil, snap, t0)
	if kind != FrameKey || !changed {
		t.Fatalf("first frame %q changed %v, want a key frame of changed decisions", kind, changed)
	}
	if len(frame) > 2500 {
		t.Errorf("key frame of 100 backends: %d bytes, want at most 2500", len(frame))
	}
	listed := func(data []byte) []int {
		t.Helper()
		var l Loads
		if err := DecodeLoads(data, &l); err != nil {
			t.Fatal(err)
		}
		var idx []int
		for _, e := range l.Entries {
			idx = append(idx, e.Index)
		}
		return idx
	}
	step := func(seq uint64, d time.Duration, change func(s *fleetwatch.Snapshot)) ([]byte, byte, bool) {
		s := pool100(seq, t0.Add(d))
		change(s)
		return enc.Frame(nil, s, t0.Add(d))
	}
	frame, kind, _ = step(1, 250*time.Millisecond, func(*fleetwatch.Snapshot) {})
	if kind != FrameLoads || len(listed(frame)) != 0 {
		t.Errorf("nothing moved: %q frame listing %v, want an empty load frame", kind, listed(frame))
	}
	frame, _ = enc.Loads(nil, func() *fleetwatch.Snapshot {
		s := pool100(1, t0.Add(500*time.Millisecond))
		s.Backends[3].Load.Running += 0.25                      // below LoadStep
		s.Backends[4].Load.Waiting += 1                         // a request more
		s.Backends[5].Load.AgeMs = 10                           // a newer report of the same load: its age only
		s.Backends[11].Load.AgeMs = 900                         // an older one: its age only
		s.Backends[6].Load = nil                                // gone
		*s.Backends[7].EWMATTFTMs *= 1.06                       // past EWMAStep
		*s.Backends[8].EWMATTFTMs *= 1.01                       // below
		*s.Backends[9].P95TTFTMs *= 2                           // p95 goes with key frames only
		s.Backends[10].Load.Source = fleetwatch.LoadSourceEvent // another source
		return s
	}())
	if diff := cmp.Diff([]int{4, 6, 7, 10}, listed(frame)); diff != "" {
		t.Errorf("entries listed (-want +got):\n%s", diff)
	}
	var l Loads
	if err := DecodeLoads(frame, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Ages) != 100 || l.Ages[0] != 80 || l.Ages[5] != 0 || l.Ages[6] != -1 || l.Ages[11] != 896 {
		t.Errorf("ages %v..., want 100 with 80 ms (in 16 ms steps), 0 for b5, none for b6, 896 for b11", l.Ages[:12])
	}
	lower := func(s *fleetwatch.Snapshot) { s.Backends[2].Weight = 0.75 }
	if _, kind, changed = step(2, time.Second, lower); kind != FrameKey || !changed {
		t.Errorf("a weight changed: %q changed %v, want a key frame of changed decisions", kind, changed)
	}
	if _, kind, changed = step(3, 2*time.Second, lower); kind != FrameLoads || changed {
		t.Errorf("weights as in the key frame: %q changed %v, want a load frame", kind, changed)
	}
	if _, kind, changed = step(4, 6*time.Second, lower); kind != FrameKey || changed {
		t.Errorf("KeyEvery passed: %q changed %v, want a key frame, decisions unchanged", kind, changed)
	}
	if _, ok := enc.Loads(nil, func() *fleetwatch.Snapshot {
		s := pool100(4, t0.Add(6250*time.Millisecond))
		lower(s)
		s.Backends[0].State = fleetwatch.StateOpen
		return s
	}()); ok {
		t.Error("Loads sent a frame for decisions that changed")
	}
	if _, kind, _ = step(1, 7*time.Second, func(s *fleetwatch.Snapshot) { s.Epoch = "another" }); kind != FrameKey {
		t.Errorf("a new epoch: %q, want a key frame", kind)
	}
}

// The pool fields that follow the loads (the routers counted, the retry
// budget's presence and its free flag, which the spare capacity sets) do
// not stop a load beat's frame: the loads keep going out, and the next
// decision snapshot's frame is a key frame that carries the new fields.
// Before, a flip of either stopped every load frame until the next
// heartbeat (in the simulator's bad-request flood at 64 routers, 17% of
// the load beats, p99 +7% against the JSON snapshots).
func TestLoadBeatKeepsGoingWhenLoadDerivedFieldsMove(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for name, move := range map[string]func(s *fleetwatch.Snapshot){
		"routers":     func(s *fleetwatch.Snapshot) { s.Routers = 63 },
		"budget free": func(s *fleetwatch.Snapshot) { s.RetryBudget.Free = true },
		"no budget":   func(s *fleetwatch.Snapshot) { s.RetryBudget = nil },
	} {
		enc := NewCompactEncoder(CompactSettings{})
		enc.Frame(nil, pool100(1, t0), t0)
		s := pool100(1, t0.Add(250*time.Millisecond))
		move(s)
		s.Backends[4].Load.Waiting += 1
		frame, ok := enc.Loads(nil, s)
		if !ok {
			t.Errorf("%s moved: the load beat sent nothing", name)
			continue
		}
		var l Loads
		if err := DecodeLoads(frame, &l); err != nil || len(l.Entries) != 1 || l.Entries[0].Index != 4 || l.Base != 1 {
			t.Errorf("%s moved: load frame %+v (%v), want backend 4's load on key frame 1", name, l, err)
		}
		s = pool100(2, t0.Add(time.Second))
		move(s)
		frame, kind, changed := enc.Frame(nil, s, t0.Add(time.Second))
		if kind != FrameKey || !changed {
			t.Errorf("%s moved: the heartbeat's frame is %q (changed %v), want a key frame", name, kind, changed)
			continue
		}
		got, _, err := DecodeKey(frame, "llama-3-70b")
		if err != nil || got.Routers != s.Routers || (got.RetryBudget == nil) != (s.RetryBudget == nil) ||
			(s.RetryBudget != nil && got.RetryBudget.Free != s.RetryBudget.Free) {
			t.Errorf("%s moved: key frame says routers %d budget %+v (%v), want %d %+v", name, got.Routers, got.RetryBudget, err, s.Routers, s.RetryBudget)
		}
	}
}

// Load frames are numbered one after the other from the key frame, name
// the key frame's seq as their base and the epoch by its hash.
func TestCompactFrameNumbers(t *testing.T) {
	enc := NewCompactEncoder(CompactSettings{})
	t0 := time.Unix(1_700_000_000, 0)
	key, _, _ := enc.Frame(nil, pool100(5, t0), t0)
	_, n, err := DecodeKey(key, "p")
	if err != nil || n != 1 {
		t.Fatalf("key frame number %d (%v), want 1", n, err)
	}
	for i := uint64(2); i <= 4; i++ {
		frame, ok := enc.Loads(nil, pool100(5, t0.Add(time.Duration(i)*250*time.Millisecond)))
		var l Loads
		if err := DecodeLoads(frame, &l); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if l.N != i || l.Base != 5 || l.Epoch != EpochHash("01JEPOCHXYZ") || math.IsNaN(l.Median) == false {
			t.Errorf("load frame %d: n %d base %d epoch %x median %v, want n %d, base 5, the epoch's hash, no median move", i, l.N, l.Base, l.Epoch, l.Median, i)
		}
	}
}

// Decoding a load frame into a Loads that held one before allocates
// nothing.
func TestDecodeLoadsAllocatesNothing(t *testing.T) {
	enc := NewCompactEncoder(CompactSettings{LoadStep: 0.01})
	t0 := time.Unix(1_700_000_000, 0)
	enc.Frame(nil, pool100(1, t0), t0)
	s := pool100(1, t0.Add(250*time.Millisecond))
	for i := range s.Backends {
		s.Backends[i].Load.Running++
	}
	frame, _ := enc.Loads(nil, s)
	var l Loads
	if err := DecodeLoads(frame, &l); err != nil || len(l.Entries) != 100 {
		t.Fatalf("%v, %d entries", err, len(l.Entries))
	}
	if a := testing.AllocsPerRun(100, func() { _ = DecodeLoads(frame, &l) }); a != 0 {
		t.Errorf("DecodeLoads allocates %v per frame, want 0", a)
	}
}

// FuzzCompactFrames: no input makes the decoders panic or return a key
// frame that does not validate.
func FuzzCompactFrames(f *testing.F) {
	f.Add(AppendKey(nil, fullSnapshot(), 3))
	enc := NewCompactEncoder(CompactSettings{})
	t0 := time.Unix(1_700_000_000, 0)
	enc.Frame(nil, pool100(1, t0), t0)
	s := pool100(1, t0)
	s.Backends[1].Load.Running = 40
	frame, _ := enc.Loads(nil, s)
	f.Add(frame)
	f.Fuzz(func(t *testing.T, data []byte) {
		if snap, _, err := DecodeKey(data, "p"); err == nil {
			if err := snap.Validate(); err != nil {
				t.Errorf("decoded key frame does not validate: %v", err)
			}
		}
		var l Loads
		_ = DecodeLoads(data, &l)
	})
}

// analyzerPool100 is a 100-backend snapshot with every field the analyzer
// fills (reasons, quantiles, rates, since, trips, TPOT, loads with KV
// cache): what serve publishes as JSON.
func analyzerPool100(at time.Time) *fleetwatch.Snapshot {
	s := pool100(7, at)
	for i := range s.Backends {
		b := &s.Backends[i]
		b.P50TTFTMs, b.SuccessRate, b.Rate429 = ptrF(140+float64(i)), ptrF(0.9987), ptrF(0.0021)
		b.P50TPOTMs, b.P95TPOTMs = ptrF(21.5), ptrF(38.25)
		b.Requests, b.WindowMs, b.Trips, b.Since = int64(800+i), 30000, 0, ptrT(at.Add(-time.Hour))
		b.Reason = fmt.Sprintf("weight 1: 429 rate 0.0021 over %d requests (prior 0.998, shrunk with k=5); EWMA %.0f ms", 800+i, 150+float64(i))
		b.Load.KVCacheUsage = ptrF(0.4375)
	}
	return s
}

// The sizes of one 100-backend pool's feed: its JSON snapshot as serve
// publishes it (52 KB here, 520 bytes a backend; issue 33 measured
// 598-668 with drift and probe reasons too), its key frame (1,667 bytes)
// and a load frame in which 60 of the 100 loads moved (375 bytes).
func TestCompactFrameSizes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	snap := analyzerPool100(t0)
	data, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	enc := NewCompactEncoder(CompactSettings{})
	key, _, _ := enc.Frame(nil, snap, t0)
	next := analyzerPool100(t0.Add(250 * time.Millisecond))
	for i := range 60 {
		next.Backends[i].Load.Running += 2
	}
	loads, _ := enc.Loads(nil, next)
	t.Logf("100 backends: JSON %d bytes, key frame %d, load frame with 60 loads moved %d", len(data), len(key), len(loads))
	if len(data) < 45_000 {
		t.Errorf("JSON snapshot %d bytes: the fixture no longer has what serve publishes", len(data))
	}
	if len(key)*20 > len(data) || len(loads) > 500 {
		t.Errorf("key frame %d bytes (want under a twentieth of the JSON's %d), load frame %d (want at most 500)", len(key), len(data), len(loads))
	}
}
