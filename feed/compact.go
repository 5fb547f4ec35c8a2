package feed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// The compact feed (docs/PROTOCOL.md "Compact feed (extension)"): what
// fleetwatch's own routers follow on fw.feed.<pool>, beside the JSON
// snapshot every reader can follow on fw.decisions.<pool>. Two frames:
//
//   - K, a key frame: every field a router reads of every backend (state,
//     weight, priority, open_until, cost, override, quota, EWMA and p95
//     TTFT, load), ids front-coded. Sent with a decision snapshot whose
//     decisions changed, and with the first after KeyEvery, and stored in
//     the fw_feed bucket for a router that joins or lost a key frame.
//   - L, a load frame: every backend's report age (a byte each), and the
//     loads and EWMAs that moved past their threshold since the last
//     frame, each by its position in the key frame it applies to (its
//     base, the key frame's seq). Sent with every other snapshot and on
//     every load beat between them, so a pool's feed costs what changed.
//
// Every frame carries its number n, one more than the pool's previous
// frame within the epoch, so a router that misses one knows it. Numbers
// are varints; times are Unix milliseconds, or milliseconds relative to
// the frame's at.

// Frame kinds.
const (
	FrameKey   byte = 'K'
	FrameLoads byte = 'L'
)

// compactMagic starts every frame: "FW", then the version (1).
var compactMagic = [3]byte{'F', 'W', 1}

// ErrCompact wraps every compact frame decoding error.
var ErrCompact = errors.New("feed: bad compact frame")

// A key frame carries each backend's state, weight, priority, drift
// status, override kind, open_until, quota_until, cost, EWMA and p95 TTFT
// and load; the pool's mode, all_open, shadow, median EWMA, affinity
// tolerance, routers and retry budget; and the snapshot's epoch, seq,
// fence, at and ttl_ms. A router reads nothing else.

// Scales of the quantized numbers: loads and EWMAs in sixteenths (of a
// request, of a millisecond), p95 in milliseconds, weights in 1/10,000
// (the analyzer rounds weights to 4 decimals: exact).
const (
	loadScale   = 16
	ewmaScale   = 16
	weightScale = 10000
)

// Backend flags of a key frame (flags1).
const (
	kStateMask  = 0x03 // 0 closed, 1 half_open, 2 open
	kHasEWMA    = 0x04
	kHasP95     = 0x08
	kHasLoad    = 0x10
	kHasOpen    = 0x20 // open_until
	kHasCost    = 0x40
	kHasQuota   = 0x80
	kLoadMetric = 0x01 // flags2: the load's source is metrics (else event)
	kHasPrio    = 0x02 // flags2
	kOverShift  = 2    // flags2 bits 2-4: the override kind, 0 none
	kDriftShift = 5    // flags2 bits 5-6: the drift status (driftStates)
)

// Pool flags of a key frame.
const (
	pFailover    = 0x01
	pSpread      = 0x02
	pShadowShift = 2 // bits 2-3: 0 off, 1 breakers, 2 observe
	pHasMedian   = 0x10
	pHasBudget   = 0x20
)

// The age vector of a load frame: a report's age in steps of ageUnit
// milliseconds, ageMax for ageMax steps (4.064 s) or more, ageUnknown for
// a backend without a load.
const (
	ageUnit    = 16
	ageMax     = 254
	ageUnknown = 255
)

// Load frame flags and entry masks.
const (
	lHasMedian  = 0x01
	lHasBudget  = 0x02
	eLoad       = 0x01
	eEWMA       = 0x02
	eNoLoad     = 0x04 // the load is no longer published
	eLoadMetric = 0x08
)

var (
	overrideKinds = []fleetwatch.OverrideKind{"", fleetwatch.OverrideDrain, fleetwatch.OverrideForceOpen,
		fleetwatch.OverrideForceClosed, fleetwatch.OverrideWeight}
	shadowModes = []fleetwatch.Shadow{fleetwatch.ShadowOff, fleetwatch.ShadowBreakers, fleetwatch.ShadowObserve}
	states      = []fleetwatch.State{fleetwatch.StateClosed, fleetwatch.StateHalfOpen, fleetwatch.StateOpen}
	driftStates = []fleetwatch.DriftStatus{fleetwatch.DriftUnknown, fleetwatch.DriftOK, fleetwatch.DriftSuspect, fleetwatch.DriftDrifted}
)

// EpochHash is how a load frame names its epoch: FNV-1a of the epoch.
func EpochHash(epoch string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(epoch))
	return h.Sum32()
}

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func appendString(b []byte, s string) []byte {
	b = appendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func quant(v, scale float64) uint64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return uint64(math.Round(min(v*scale, math.MaxUint32)))
}

func timeMs(t fleetwatch.Time) int64 { return t.UnixMilli() }

// AppendKey appends the key frame of snap, numbered n, to dst.
func AppendKey(dst []byte, snap *fleetwatch.Snapshot, n uint64) []byte {
	dst = append(dst, compactMagic[:]...)
	dst = append(dst, FrameKey)
	dst = appendUvarint(dst, n)
	dst = appendString(dst, snap.Epoch)
	dst = appendUvarint(dst, snap.Seq)
	dst = appendUvarint(dst, snap.Fence)
	at := timeMs(snap.At)
	dst = binary.AppendVarint(dst, at)
	dst = appendUvarint(dst, uint64(max(snap.TTLMs, 0)))
	var pf byte
	if snap.Mode == fleetwatch.ModeFailover {
		pf |= pFailover
	}
	if snap.AllOpen == fleetwatch.AllOpenSpread {
		pf |= pSpread
	}
	for i, m := range shadowModes {
		if snap.Shadow.Normalize() == m {
			pf |= byte(i) << pShadowShift
		}
	}
	if snap.MedianEWMATTFTMs != nil {
		pf |= pHasMedian
	}
	if snap.RetryBudget != nil {
		pf |= pHasBudget
	}
	dst = append(dst, pf)
	if snap.MedianEWMATTFTMs != nil {
		dst = appendUvarint(dst, quant(*snap.MedianEWMATTFTMs, ewmaScale))
	}
	dst = appendUvarint(dst, quant(snap.AffinityTolerance, 1000))
	dst = appendUvarint(dst, uint64(max(snap.Routers, 0)))
	if rb := snap.RetryBudget; rb != nil {
		var f byte
		if rb.Free {
			f |= 1
		}
		if rb.Spare != nil {
			f |= 2
		}
		dst = append(dst, f)
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(rb.PerSec)))
		if rb.Spare != nil {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(*rb.Spare)))
		}
	}
	dst = appendUvarint(dst, uint64(len(snap.Backends)))
	p95 := deadlineP95(snap)
	prev := ""
	for i := range snap.Backends {
		dst = appendKeyBackend(dst, &snap.Backends[i], prev, at, i == p95)
		prev = snap.Backends[i].Backend
	}
	return dst
}

// deadlineP95 is the index of the backend whose p95 TTFT a key frame
// carries: the largest of the backends not open, the one a router's
// first-token deadline reads (route.PoolP95TTFT); -1 when none has one.
func deadlineP95(snap *fleetwatch.Snapshot) int {
	best, at := 0.0, -1
	for i := range snap.Backends {
		b := &snap.Backends[i]
		if b.P95TTFTMs != nil && *b.P95TTFTMs > best && b.State != fleetwatch.StateOpen {
			best, at = *b.P95TTFTMs, i
		}
	}
	return at
}

// appendKeyBackend appends one backend of a key frame, its id front-coded
// against prev, its p95 TTFT with p95.
func appendKeyBackend(dst []byte, b *fleetwatch.Backend, prev string, at int64, p95 bool) []byte {
	var f1, f2 byte
	for i, s := range states {
		if b.State == s {
			f1 |= byte(i)
		}
	}
	if b.EWMATTFTMs != nil {
		f1 |= kHasEWMA
	}
	if p95 {
		f1 |= kHasP95
	}
	if b.Load != nil {
		f1 |= kHasLoad
		if b.Load.Source == fleetwatch.LoadSourceMetrics {
			f2 |= kLoadMetric
		}
	}
	if b.OpenUntil != nil {
		f1 |= kHasOpen
	}
	if b.CostPerMTok != nil {
		f1 |= kHasCost
	}
	if b.QuotaUntil != nil {
		f1 |= kHasQuota
	}
	if b.Priority != 0 {
		f2 |= kHasPrio
	}
	if b.Override != nil {
		for i, k := range overrideKinds {
			if b.Override.Kind == k {
				f2 |= byte(i) << kOverShift
			}
		}
	}
	for i, d := range driftStates {
		if b.Drift == d {
			f2 |= byte(i) << kDriftShift
		}
	}
	dst = append(dst, f1, f2)
	shared := 0
	for shared < len(prev) && shared < len(b.Backend) && prev[shared] == b.Backend[shared] {
		shared++
	}
	dst = appendUvarint(dst, uint64(shared))
	dst = appendString(dst, b.Backend[shared:])
	dst = appendUvarint(dst, weightScale-uint64(math.Round(min(max(b.Weight, 0), 1)*weightScale))) // 0 for a healthy 1: one byte
	if b.Priority != 0 {
		dst = binary.AppendVarint(dst, int64(b.Priority))
	}
	if b.EWMATTFTMs != nil {
		dst = appendUvarint(dst, quant(*b.EWMATTFTMs, ewmaScale))
	}
	if p95 {
		dst = appendUvarint(dst, quant(*b.P95TTFTMs, 1))
	}
	if l := b.Load; l != nil {
		dst = appendUvarint(dst, quant(l.Running, loadScale))
		dst = appendUvarint(dst, quant(l.Waiting, loadScale))
		dst = appendUvarint(dst, uint64(max(l.AgeMs, 0)))
	}
	if b.OpenUntil != nil {
		dst = binary.AppendVarint(dst, timeMs(*b.OpenUntil)-at)
	}
	if b.CostPerMTok != nil {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(*b.CostPerMTok)))
	}
	if b.QuotaUntil != nil {
		dst = binary.AppendVarint(dst, timeMs(*b.QuotaUntil)-at)
	}
	if o := b.Override; o != nil { // rare: an operator's, in full
		dst = appendString(dst, o.Reason)
		dst = appendString(dst, o.Who)
		dst = binary.AppendVarint(dst, timeMs(o.Until)-at)
		if o.Weight != nil {
			dst = appendUvarint(dst, uint64(math.Round(min(max(*o.Weight, 0), 1)*weightScale)))
		}
	}
	return dst
}

// reader reads a frame; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCompact, what)
	}
}

func (r *reader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		r.b = nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		r.b = nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte1(what string) byte {
	if len(r.b) < 1 {
		r.fail(what)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) float32(what string) float64 {
	if len(r.b) < 4 {
		r.fail(what)
		r.b = nil
		return 0
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(r.b))
	r.b = r.b[4:]
	return float64(v)
}

func (r *reader) bytes(n uint64, what string) []byte {
	if uint64(len(r.b)) < n {
		r.fail(what)
		r.b = nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// FrameKind returns the kind of a compact frame (FrameKey or FrameLoads),
// or an error wrapping ErrCompact.
func FrameKind(data []byte) (byte, error) {
	if len(data) < 4 || data[0] != compactMagic[0] || data[1] != compactMagic[1] {
		return 0, fmt.Errorf("%w: no magic", ErrCompact)
	}
	if data[2] != compactMagic[2] {
		return 0, fmt.Errorf("%w: version %d", ErrCompact, data[2])
	}
	switch data[3] {
	case FrameKey, FrameLoads:
		return data[3], nil
	}
	return 0, fmt.Errorf("%w: kind %q", ErrCompact, data[3])
}

// maxKeyBackends bounds a key frame's backends on decoding (a garbage
// count must not allocate gigabytes).
const maxKeyBackends = 1 << 16

// DecodeKey decodes a key frame into a snapshot of pool (the frame does
// not name its pool: its subject or its key does) and returns it with the
// frame's number. The snapshot carries what the frame does, which is what
// a router reads; the reasons, request counts and rates are not in it, and
// it passes fleetwatch.Snapshot.Validate or DecodeKey fails.
func DecodeKey(data []byte, pool string) (*fleetwatch.Snapshot, uint64, error) {
	return decodeKey(data, pool, nil)
}

// keyScratch is where the watcher decodes a key frame it may not keep
// (Watcher.refresh): the snapshot, its backends and the values they point
// to are reused by the next decoding into it, and an id equal to the one
// known at its position (the ids of the pool's key frame applied) is that
// string, so that decoding the key frame of decisions a router has
// allocates nothing. Nothing decoded into it may be kept.
type keyScratch struct {
	snap   fleetwatch.Snapshot
	nums   []float64
	loads  []fleetwatch.Load
	times  []fleetwatch.Time
	budget fleetwatch.RetryBudget
	epoch  string
	known  []string
}

// float, load and time return a place for a decoded value: in ks, or new
// without one (DecodeKey).
func (ks *keyScratch) float(v float64) *float64 {
	if ks == nil {
		p := new(float64)
		*p = v
		return p
	}
	ks.nums = append(ks.nums, v)
	return &ks.nums[len(ks.nums)-1]
}

func (ks *keyScratch) load() *fleetwatch.Load {
	if ks == nil {
		return new(fleetwatch.Load)
	}
	ks.loads = append(ks.loads, fleetwatch.Load{})
	return &ks.loads[len(ks.loads)-1]
}

func (ks *keyScratch) time(ms int64) *fleetwatch.Time {
	t := fleetwatch.At(time.UnixMilli(ms))
	if ks == nil {
		p := new(fleetwatch.Time)
		*p = t
		return p
	}
	ks.times = append(ks.times, t)
	return &ks.times[len(ks.times)-1]
}

// id returns the backend id at position i made of prefix and suffix: the
// known one when it is that, else a new string.
func (ks *keyScratch) id(i int, prefix string, suffix []byte) string {
	if ks != nil && i < len(ks.known) {
		k := ks.known[i]
		if len(k) == len(prefix)+len(suffix) && k[:len(prefix)] == prefix && k[len(prefix):] == string(suffix) {
			return k
		}
	}
	return prefix + string(suffix)
}

// decodeKey is DecodeKey, into ks when it is not nil.
func decodeKey(data []byte, pool string, ks *keyScratch) (*fleetwatch.Snapshot, uint64, error) {
	kind, err := FrameKind(data)
	if err != nil {
		return nil, 0, err
	}
	if kind != FrameKey {
		return nil, 0, fmt.Errorf("%w: not a key frame", ErrCompact)
	}
	r := &reader{b: data[4:]}
	n := r.uvarint("n")
	var snap *fleetwatch.Snapshot
	epoch := r.bytes(r.uvarint("epoch"), "epoch")
	if ks != nil {
		ks.snap = fleetwatch.Snapshot{V: fleetwatch.ProtocolVersion, Pool: pool, Backends: ks.snap.Backends}
		ks.nums, ks.loads, ks.times = ks.nums[:0], ks.loads[:0], ks.times[:0]
		snap = &ks.snap
		if ks.epoch != string(epoch) {
			ks.epoch = string(epoch)
		}
		snap.Epoch = ks.epoch
	} else {
		snap = &fleetwatch.Snapshot{V: fleetwatch.ProtocolVersion, Pool: pool, Epoch: string(epoch)}
	}
	snap.Seq = r.uvarint("seq")
	snap.Fence = r.uvarint("fence")
	at := r.varint("at")
	snap.At = fleetwatch.At(time.UnixMilli(at))
	snap.TTLMs = int64(r.uvarint("ttl"))
	pf := r.byte1("pool flags")
	snap.Mode, snap.AllOpen = fleetwatch.ModeBalance, fleetwatch.AllOpenShed
	if pf&pFailover != 0 {
		snap.Mode = fleetwatch.ModeFailover
	}
	if pf&pSpread != 0 {
		snap.AllOpen = fleetwatch.AllOpenSpread
	}
	if sh := int(pf>>pShadowShift) & 3; sh < len(shadowModes) {
		snap.Shadow = shadowModes[sh]
	}
	if pf&pHasMedian != 0 {
		snap.MedianEWMATTFTMs = ks.float(float64(r.uvarint("median")) / ewmaScale)
	}
	snap.AffinityTolerance = float64(r.uvarint("tolerance")) / 1000
	snap.Routers = int(r.uvarint("routers"))
	if pf&pHasBudget != 0 {
		f := r.byte1("budget")
		var rb *fleetwatch.RetryBudget
		if ks != nil {
			rb = &ks.budget
		} else {
			rb = new(fleetwatch.RetryBudget)
		}
		*rb = fleetwatch.RetryBudget{Free: f&1 != 0, PerSec: r.float32("budget")}
		if f&2 != 0 {
			rb.Spare = ks.float(r.float32("spare"))
		}
		snap.RetryBudget = rb
	}
	count := r.uvarint("backends")
	if count > maxKeyBackends || count > uint64(len(r.b)) {
		return nil, 0, fmt.Errorf("%w: %d backends", ErrCompact, count)
	}
	if ks == nil {
		snap.Backends = make([]fleetwatch.Backend, count)
	} else {
		// Room for every value a backend may point to (an override's
		// weight aside), so that the arrays grow at most once a frame (a
		// pointer taken before a growth stays right: into the old array).
		c := int(count)
		snap.Backends = slices.Grow(snap.Backends[:0], c)[:c]
		clear(snap.Backends)
		ks.nums = slices.Grow(ks.nums, 3*c)
		ks.loads = slices.Grow(ks.loads, c)
		ks.times = slices.Grow(ks.times, 2*c)
	}
	prev := ""
	for i := range snap.Backends {
		decodeKeyBackend(r, &snap.Backends[i], prev, at, ks, i)
		prev = snap.Backends[i].Backend
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	if r.err != nil {
		return nil, 0, r.err
	}
	if err := snap.Validate(); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrCompact, err)
	}
	return snap, n, nil
}

func decodeKeyBackend(r *reader, b *fleetwatch.Backend, prev string, at int64, ks *keyScratch, i int) {
	f1, f2 := r.byte1("backend flags"), r.byte1("backend flags")
	if s := int(f1 & kStateMask); s < len(states) {
		b.State = states[s]
	} else {
		r.fail("state")
	}
	shared := r.uvarint("id")
	if shared > uint64(len(prev)) {
		r.fail("id prefix")
		return
	}
	b.Backend = ks.id(i, prev[:shared], r.bytes(r.uvarint("id"), "id"))
	if w := r.uvarint("weight"); w <= weightScale {
		b.Weight = float64(weightScale-w) / weightScale
	} else {
		r.fail("weight")
	}
	b.Drift = driftStates[int(f2>>kDriftShift)&3]
	if f2&kHasPrio != 0 {
		b.Priority = int(r.varint("priority"))
	}
	if f1&kHasEWMA != 0 {
		b.EWMATTFTMs = ks.float(float64(r.uvarint("ewma")) / ewmaScale)
	}
	if f1&kHasP95 != 0 {
		b.P95TTFTMs = ks.float(float64(r.uvarint("p95")))
	}
	if f1&kHasLoad != 0 {
		l := ks.load()
		l.Source = fleetwatch.LoadSourceEvent
		if f2&kLoadMetric != 0 {
			l.Source = fleetwatch.LoadSourceMetrics
		}
		l.Running = float64(r.uvarint("running")) / loadScale
		l.Waiting = float64(r.uvarint("waiting")) / loadScale
		l.AgeMs = int64(r.uvarint("age"))
		b.Load = l
	}
	if f1&kHasOpen != 0 {
		b.OpenUntil = ks.time(at + r.varint("open_until"))
	}
	if f1&kHasCost != 0 {
		b.CostPerMTok = ks.float(r.float32("cost"))
	}
	if f1&kHasQuota != 0 {
		b.QuotaUntil = ks.time(at + r.varint("quota_until"))
	}
	if k := int(f2>>kOverShift) & 7; k > 0 {
		if k >= len(overrideKinds) {
			r.fail("override")
			return
		}
		o := &fleetwatch.Override{Kind: overrideKinds[k]}
		o.Reason = string(r.bytes(r.uvarint("override reason"), "override reason"))
		o.Who = string(r.bytes(r.uvarint("override who"), "override who"))
		o.Until = fleetwatch.At(time.UnixMilli(at + r.varint("override until")))
		if o.Kind == fleetwatch.OverrideWeight {
			o.Weight = ks.float(float64(r.uvarint("override weight")) / weightScale)
		}
		b.Override = o
	}
}

// LoadEntry is one backend's entry of a load frame. A value that did not
// move is NaN (Running and Waiting move together; NoLoad says the load is
// no longer published).
type LoadEntry struct {
	Index            int // position in the key frame's backends
	Running, Waiting float64
	Metrics          bool // the load's source is metrics
	NoLoad           bool
	EWMATTFTMs       float64
}

// Loads is a decoded load frame. Its slice is reused by the next decode
// into the same Loads.
type Loads struct {
	Epoch  uint32 // EpochHash of the key frame's epoch
	Base   uint64 // seq of the key frame it applies to
	N      uint64 // the frame's number
	At     time.Time
	Median float64 // the pool's median EWMA TTFT; NaN when it did not move, 0 when it went
	Budget float64 // the retry budget's per_sec; NaN when it did not move
	// Ages are every backend's report age at At in milliseconds, in the
	// key frame's order: -1 without a load; AgeMax or more is as old as
	// the frame can say.
	Ages    []int64
	Entries []LoadEntry
}

// AgeMax is the oldest report age a load frame tells apart (4.064 s).
const AgeMax = ageMax * ageUnit

// DecodeLoads decodes a load frame into l, reusing its slice.
func DecodeLoads(data []byte, l *Loads) error {
	kind, err := FrameKind(data)
	if err != nil {
		return err
	}
	if kind != FrameLoads {
		return fmt.Errorf("%w: not a load frame", ErrCompact)
	}
	r := &reader{b: data[4:]}
	if len(r.b) < 4 {
		return fmt.Errorf("%w: epoch", ErrCompact)
	}
	l.Epoch = binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	l.Base = r.uvarint("base")
	l.N = r.uvarint("n")
	l.At = time.UnixMilli(r.varint("at"))
	f := r.byte1("flags")
	l.Median, l.Budget = math.NaN(), math.NaN()
	if f&lHasMedian != 0 {
		l.Median = float64(r.uvarint("median")) / ewmaScale // 0: the median went
	}
	if f&lHasBudget != 0 {
		l.Budget = r.float32("budget")
	}
	ages := r.uvarint("ages")
	if ages > maxKeyBackends || ages > uint64(len(r.b)) {
		return fmt.Errorf("%w: %d ages", ErrCompact, ages)
	}
	l.Ages = l.Ages[:0]
	for _, a := range r.bytes(ages, "ages") {
		if a == ageUnknown {
			l.Ages = append(l.Ages, -1)
		} else {
			l.Ages = append(l.Ages, int64(a)*ageUnit)
		}
	}
	n := r.uvarint("entries")
	if n > maxKeyBackends || n > uint64(len(r.b)) {
		return fmt.Errorf("%w: %d entries", ErrCompact, n)
	}
	l.Entries = l.Entries[:0]
	for range n {
		e := LoadEntry{Index: int(r.uvarint("index")), Running: math.NaN(), Waiting: math.NaN(), EWMATTFTMs: math.NaN()}
		m := r.byte1("mask")
		e.NoLoad, e.Metrics = m&eNoLoad != 0, m&eLoadMetric != 0
		if m&eLoad != 0 {
			e.Running = float64(r.uvarint("running")) / loadScale
			e.Waiting = float64(r.uvarint("waiting")) / loadScale
		}
		if m&eEWMA != 0 {
			e.EWMATTFTMs = float64(r.uvarint("ewma")) / ewmaScale
		}
		l.Entries = append(l.Entries, e)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	return r.err
}

// Update fills u (its slice reused) with what l says of the key frame
// applied (epoch, base and its backends' ids, in its order) for
// p2c.Picker.UpdateLoads: every backend with a report age, its load and
// EWMA where they moved.
func (l *Loads) Update(u *p2c.LoadUpdate, epoch string, base uint64, ids []string) {
	u.Epoch, u.Base, u.At, u.Median, u.Budget, u.Full = epoch, base, l.At, l.Median, l.Budget, false
	u.Backends = u.Backends[:0]
	for i, id := range ids {
		age := int64(-1)
		if i < len(l.Ages) {
			age = l.Ages[i]
		}
		u.Backends = append(u.Backends, p2c.BackendLoad{Backend: id, Running: math.NaN(), Waiting: math.NaN(),
			AgeMs: age, EWMATTFTMs: math.NaN()})
	}
	for _, e := range l.Entries {
		if e.Index < 0 || e.Index >= len(u.Backends) {
			continue
		}
		b := &u.Backends[e.Index]
		b.Running, b.Waiting, b.Metrics, b.NoLoad, b.EWMATTFTMs = e.Running, e.Waiting, e.Metrics, e.NoLoad, e.EWMATTFTMs
	}
}
