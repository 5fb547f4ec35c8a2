package feed

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// CompactSettings tune the compact feed's encoder. The zero value works.
type CompactSettings struct {
	// KeyEvery is how long a pool goes without a key frame when no
	// decision changed: the first decision snapshot after it goes out as
	// one. A key frame carries every load, so it is also how long a load
	// a router missed (a lost frame) may stay wrong. If zero, 5s.
	KeyEvery time.Duration
	// LoadStep is how far a backend's load (running + waiting) moves
	// before a load frame lists it. If zero, 0.5 (a request).
	LoadStep float64
	// EWMAStep is the relative move of a backend's EWMA TTFT (and of the
	// pool's median), and BudgetStep of the retry budget's rate, that
	// lists them. If zero, 0.05 and 0.1.
	EWMAStep, BudgetStep float64
}

func (s CompactSettings) withDefaults() CompactSettings {
	if s.KeyEvery <= 0 {
		s.KeyEvery = 5 * time.Second
	}
	if s.LoadStep <= 0 {
		s.LoadStep = 0.5
	}
	if s.EWMAStep <= 0 {
		s.EWMAStep = 0.05
	}
	if s.BudgetStep <= 0 {
		s.BudgetStep = 0.1
	}
	return s
}

// CompactEncoder turns one pool's successive snapshots into compact
// frames: a key frame when a decision changed (or KeyEvery passed), else a
// load frame of what moved. It is used by one goroutine.
type CompactEncoder struct {
	s CompactSettings

	keyed   bool
	epoch   string
	hash    uint32
	n       uint64 // the last frame's number
	keySeq  uint64
	keyAt   time.Time
	header  keyHeader
	ids     []string
	decided []decided // per backend of the key frame
	sent    []sentLoad
	median  float64
	budget  float64
	wantKey bool // WantKey: the next decision snapshot goes out as a key frame
}

// keyHeader is what of a snapshot's pool fields makes a key frame.
type keyHeader struct {
	fence      uint64
	ttl        int64
	mode       fleetwatch.Mode
	allOpen    fleetwatch.AllOpen
	shadow     fleetwatch.Shadow
	tolerance  float64
	routers    int
	budgetFree bool
	hasBudget  bool
}

// decided is what of a backend makes a key frame when it changes.
type decided struct {
	state     fleetwatch.State
	weight    float64
	priority  int
	openUntil int64
	quota     int64
	cost      float64
	override  fleetwatch.OverrideKind
	drift     fleetwatch.DriftStatus
}

// sentLoad is what a router knows of a backend's load and EWMA.
type sentLoad struct {
	hasLoad          bool
	running, waiting float64
	ageMs            int64 // the report's age at the frame's at
	metrics          bool
	ewma             float64 // NaN: none
}

// NewCompactEncoder returns an encoder.
func NewCompactEncoder(s CompactSettings) *CompactEncoder {
	return &CompactEncoder{s: s.withDefaults()}
}

func optF(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func optT(t *fleetwatch.Time) int64 {
	if t == nil {
		return 0
	}
	return t.UnixMilli()
}

// decisionsOnly is h without the fields that follow the loads: the
// routers counted and the retry budget's presence and free flag.
func (h keyHeader) decisionsOnly() keyHeader {
	h.routers, h.hasBudget, h.budgetFree = 0, false, false
	return h
}

func headerOf(snap *fleetwatch.Snapshot) keyHeader {
	h := keyHeader{fence: snap.Fence, ttl: snap.TTLMs, mode: snap.Mode, allOpen: snap.AllOpen,
		shadow: snap.Shadow.Normalize(), tolerance: snap.AffinityTolerance, routers: snap.Routers}
	if rb := snap.RetryBudget; rb != nil {
		h.hasBudget, h.budgetFree = true, rb.Free
	}
	return h
}

func decidedOf(b *fleetwatch.Backend) decided {
	d := decided{state: b.State, weight: b.Weight, priority: b.Priority, openUntil: optT(b.OpenUntil),
		quota: optT(b.QuotaUntil), cost: optF(b.CostPerMTok), drift: b.Drift}
	if b.Override != nil {
		d.override = b.Override.Kind
	}
	return d
}

func sameCost(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// changed reports whether snap's decisions (or the pool fields a key
// frame carries) differ from the last key frame's, so that a load frame
// cannot carry it. For a load beat (loadBeat) the pool fields that follow
// the loads are left out (keyHeader.decisionsOnly).
func (e *CompactEncoder) changed(snap *fleetwatch.Snapshot, loadBeat bool) bool {
	h, was := headerOf(snap), e.header
	if loadBeat {
		h, was = h.decisionsOnly(), was.decisionsOnly()
	}
	if !e.keyed || snap.Epoch != e.epoch || h != was || len(snap.Backends) != len(e.ids) {
		return true
	}
	for i := range snap.Backends {
		b := &snap.Backends[i]
		d := decidedOf(b)
		p := e.decided[i]
		if b.Backend != e.ids[i] || d.state != p.state || d.weight != p.weight || d.priority != p.priority ||
			d.openUntil != p.openUntil || d.quota != p.quota || !sameCost(d.cost, p.cost) || d.override != p.override || d.drift != p.drift {
			return true
		}
	}
	return false
}

// Frame appends the frame of a decision snapshot (one with its own seq)
// to dst and returns it with its kind, and whether the decisions changed:
// a key frame when they did or KeyEvery passed by now since the last key
// frame, else a load frame.
func (e *CompactEncoder) Frame(dst []byte, snap *fleetwatch.Snapshot, now time.Time) ([]byte, byte, bool) {
	if e.changed(snap, false) {
		return e.key(dst, snap, now), FrameKey, true
	}
	if e.wantKey || now.Sub(e.keyAt) >= e.s.KeyEvery {
		return e.key(dst, snap, now), FrameKey, false
	}
	return e.loads(dst, snap), FrameLoads, false
}

// WantKey makes the next decision snapshot's frame a key frame (routers
// that missed frames asked for one: fw.resync.<pool>).
func (e *CompactEncoder) WantKey() { e.wantKey = true }

// Loads appends the load frame of a load beat's snapshot (one that
// repeats the last decision snapshot's seq) to dst. It appends nothing
// and returns false when there is no key frame to base it on: none yet,
// another epoch, or decisions that changed since (the next decision
// snapshot brings the key frame). The pool fields that follow the loads
// rather than the decisions (the routers counted, the retry budget's
// presence and free flag, which its spare capacity sets) do not stop a
// load frame: they go out with the next decision snapshot's key frame,
// and the loads keep going out until then.
func (e *CompactEncoder) Loads(dst []byte, snap *fleetwatch.Snapshot) ([]byte, bool) {
	if e.changed(snap, true) {
		return dst, false
	}
	return e.loads(dst, snap), true
}

// key appends a key frame and remembers what it says.
func (e *CompactEncoder) key(dst []byte, snap *fleetwatch.Snapshot, now time.Time) []byte {
	e.keyed, e.keyAt, e.wantKey = true, now, false
	if snap.Epoch != e.epoch {
		e.epoch, e.hash, e.n = snap.Epoch, EpochHash(snap.Epoch), 0
	}
	e.n++
	e.keySeq = snap.Seq
	e.header = headerOf(snap)
	e.ids, e.decided, e.sent = e.ids[:0], e.decided[:0], e.sent[:0]
	for i := range snap.Backends {
		b := &snap.Backends[i]
		e.ids = append(e.ids, b.Backend)
		e.decided = append(e.decided, decidedOf(b))
		e.sent = append(e.sent, loadOf(b))
	}
	e.median = quantF(optF(snap.MedianEWMATTFTMs), ewmaScale)
	e.budget = math.NaN()
	if snap.RetryBudget != nil {
		e.budget = snap.RetryBudget.PerSec
	}
	return AppendKey(dst, snap, e.n)
}

// quantF is v as a frame carries it (NaN stays NaN).
func quantF(v, scale float64) float64 {
	if math.IsNaN(v) {
		return v
	}
	return float64(quant(v, scale)) / scale
}

// loadOf is what a frame tells of b's load and EWMA (quantized as the
// frame carries them).
func loadOf(b *fleetwatch.Backend) sentLoad {
	s := sentLoad{ewma: math.NaN()}
	if b.EWMATTFTMs != nil {
		s.ewma = quantF(*b.EWMATTFTMs, ewmaScale)
	}
	if l := b.Load; l != nil {
		s.hasLoad, s.ageMs, s.metrics = true, max(l.AgeMs, 0), l.Source == fleetwatch.LoadSourceMetrics
		s.running = quantF(l.Running, loadScale)
		s.waiting = quantF(l.Waiting, loadScale)
	}
	return s
}

// moved reports whether a relative value moved by at least step (or
// appeared or went).
func moved(prev, cur, step float64) bool {
	switch {
	case math.IsNaN(prev) != math.IsNaN(cur):
		return true
	case math.IsNaN(cur):
		return false
	}
	return math.Abs(cur-prev) >= step*max(math.Abs(prev), 1e-9)
}

// loads appends a load frame of what moved since the last frame.
func (e *CompactEncoder) loads(dst []byte, snap *fleetwatch.Snapshot) []byte {
	e.n++
	dst = append(dst, compactMagic[:]...)
	dst = append(dst, FrameLoads)
	dst = binary.LittleEndian.AppendUint32(dst, e.hash)
	dst = appendUvarint(dst, e.keySeq)
	dst = appendUvarint(dst, e.n)
	dst = binary.AppendVarint(dst, timeMs(snap.At))
	var f byte
	median := quantF(optF(snap.MedianEWMATTFTMs), ewmaScale)
	if moved(e.median, median, e.s.EWMAStep) {
		f |= lHasMedian
		e.median = median
	}
	budget := math.NaN()
	if snap.RetryBudget != nil {
		budget = snap.RetryBudget.PerSec
	}
	if moved(e.budget, budget, e.s.BudgetStep) && !math.IsNaN(budget) {
		f |= lHasBudget
		e.budget = budget
	}
	dst = append(dst, f)
	if f&lHasMedian != 0 {
		dst = appendUvarint(dst, quant(median, ewmaScale)) // 0 when it went
	}
	if f&lHasBudget != 0 {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(budget)))
	}
	// Every backend's report age, one byte each in the key frame's order,
	// so that a router always knows when each load it has was reported.
	dst = appendUvarint(dst, uint64(len(snap.Backends)))
	for i := range snap.Backends {
		dst = append(dst, ageByte(snap.Backends[i].Load))
	}
	countAt := len(dst)
	dst = append(dst, 0, 0, 0) // the entry count, a 3-byte uvarint filled in below
	n := 0
	for i := range snap.Backends {
		var entry bool
		dst, entry = e.appendEntry(dst, i, &snap.Backends[i])
		if entry {
			n++
		}
	}
	dst[countAt] = byte(n) | 0x80
	dst[countAt+1] = byte(n>>7) | 0x80
	dst[countAt+2] = byte(n >> 14)
	return dst
}

// ageByte is a load report's age as a load frame's age vector carries it:
// in ageUnit steps, ageUnknown without a load, ageMax for ageMax steps or
// more.
func ageByte(l *fleetwatch.Load) byte {
	if l == nil {
		return ageUnknown
	}
	return byte(min(max(l.AgeMs, 0)/ageUnit, ageMax))
}

// appendEntry appends backend i's entry when its load or EWMA moved.
func (e *CompactEncoder) appendEntry(dst []byte, i int, b *fleetwatch.Backend) ([]byte, bool) {
	cur := loadOf(b)
	prev := &e.sent[i]
	var m byte
	switch {
	case cur.hasLoad && (!prev.hasLoad || cur.metrics != prev.metrics ||
		math.Abs(cur.running+cur.waiting-prev.running-prev.waiting) >= e.s.LoadStep):
		m |= eLoad
		if cur.metrics {
			m |= eLoadMetric
		}
	case !cur.hasLoad && prev.hasLoad:
		m |= eNoLoad
	}
	if moved(prev.ewma, cur.ewma, e.s.EWMAStep) && !math.IsNaN(cur.ewma) {
		m |= eEWMA
	}
	if m == 0 {
		return dst, false
	}
	dst = appendUvarint(dst, uint64(i))
	dst = append(dst, m)
	if m&eLoad != 0 {
		dst = appendUvarint(dst, quant(cur.running, loadScale))
		dst = appendUvarint(dst, quant(cur.waiting, loadScale))
		prev.hasLoad, prev.running, prev.waiting, prev.metrics = true, cur.running, cur.waiting, cur.metrics
	}
	if m&eNoLoad != 0 {
		prev.hasLoad = false
	}
	if m&eEWMA != 0 {
		dst = appendUvarint(dst, quant(cur.ewma, ewmaScale))
		prev.ewma = cur.ewma
	}
	return dst, true
}
