package probes

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/robfig/cron/v3"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// Sink receives what the Prober finds. Its methods are called without any
// Prober lock held (so they may call back into the Prober), from the probing
// goroutines; they must be safe for concurrent use and should not block for
// long: a backend's next cycle waits for them.
type Sink interface {
	// Alert is a drift status change of one backend (published on
	// fw.drift.<pool> by the wiring).
	Alert(fleetwatch.DriftAlert)
	// Status is a backend's combined drift status (worst of against its
	// baseline and against its peers), called when it changes.
	Status(pool, backend string, s fleetwatch.DriftStatus)
	// ProbeError is a failed probe cycle: never a verdict.
	ProbeError(pool, backend string, err error)
}

// ErrUnknownBackend is returned for a pool/backend pair that is not a target.
var ErrUnknownBackend = errors.New("probes: unknown backend")

// Lifecycle errors of the Prober and the Reviewer (docs/DECISIONS.md
// "Lifecycles").
var (
	// ErrRunning is returned by Run while another Run of the same value
	// runs.
	ErrRunning = errors.New("probes: already running")
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("probes: closed")
)

// Settings configure a Prober. The zero value works (and probes nothing).
type Settings struct {
	// Targets are the backends to probe. Pool and Backend must be set and
	// unique together.
	Targets []Target
	// Suite is the prompt suite. If nil, the built-in default-v1.
	Suite *drift.Suite
	// Store persists baselines. If nil, they live in memory only.
	Store Store
	// States persists each backend's drift state (status, CUSUM, cooldown,
	// last alert, quarantine) whenever it changes, so that a restart or a
	// new owner continues where the last one stopped. If nil, it lives in
	// memory only.
	States Store
	// Quarantine records that the wiring gives drifted backends weight 0
	// (the analyzer does it); it is shown in the statuses and stored in
	// the state. The Prober itself does nothing else with it.
	Quarantine bool
	// Sink receives alerts, statuses and probe errors. If nil, discarded.
	Sink Sink
	// Schedule is the cron spec of probe cycles (robfig/cron, with
	// descriptors such as "@every 5m"). If empty, "@every 5m".
	Schedule string
	// Jitter is the largest per-backend offset added to the schedule, so
	// that backends are not all probed at once; each backend's offset is a
	// fixed hash of its ids. If zero, a tenth of the schedule's interval,
	// at most 5 minutes; negative: none.
	Jitter time.Duration
	// Timeout bounds each probe request. If zero, 30s.
	Timeout time.Duration
	// Enrol is how many cycles enrolment takes at least. If zero, 8.
	Enrol int
	// EnrolMin is the minimum enrolment span. If zero, 2h; negative: none.
	EnrolMin time.Duration
	// Params are the decision thresholds (zero fields take defaults).
	Params drift.Params
	// HTTPClient sends the probes. If nil, a client with its own transport.
	HTTPClient *http.Client
	// Metrics receives the probe metrics. If nil, a private set.
	Metrics *metrics.Set
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Owns reports whether this prober is to probe the backends of pool
	// now: the scheduled and traffic-triggered cycles (and the identity
	// checks at start) of a pool it does not own are skipped, so that
	// several instances sharing the pools by partition probe each backend
	// once. If nil, every pool is owned. ProbeBackend called directly
	// always probes.
	Owns func(pool string) bool
}

// owns reports whether the prober's scheduled work covers pool.
func (p *Prober) owns(pool string) bool { return p.s.Owns == nil || p.s.Owns(pool) }

type backendKey struct{ pool, backend string }

// outbox collects what is to be told to the Sink while a backend's lock is
// held, so that the Sink is called after it is released (a Sink may call
// back into the Prober, e.g. Rebaseline, without deadlocking).
type outbox []func()

func (o *outbox) add(f func()) { *o = append(*o, f) }

// flush delivers, in order. Call it with no lock held.
func (o *outbox) flush() {
	for _, f := range *o {
		f()
	}
	*o = nil
}

// backendState is one target's state.
type backendState struct {
	t      Target
	client *Client
	offset time.Duration // jitter

	run sync.Mutex     // serialises this backend's cycles and re-baselines
	mon *drift.Monitor // guarded by run; nil until the baseline was loaded

	// guarded by Prober.mu
	peer      fleetwatch.DriftStatus
	peerSince time.Time
	reported  fleetwatch.DriftStatus
	snap      BackendStatus
	pvalue    float64
	lastAlert *fleetwatch.DriftAlert
	monState  drift.DriftState // the monitor's part of the state, copied by refreshLocked
	trafficFP string           // the fingerprint traffic showed in the last fingerprint event
	queued    bool             // a cycle is queued on Prober.urgent

	budget *budget // guarded by Prober.mu: the probe budget and spend (budget.go)

	saveMu sync.Mutex // serialises the backend's state saves; guards saved
	saved  []byte     // the state last written (or read) in States
}

// Prober runs drift probes against its targets on a cron schedule. Use
// ProbeBackend to run one backend's cycle directly (the cron job body), Run
// to schedule, Close to stop.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): a Run while another runs
// returns ErrRunning; a Run after Close returns ErrClosed; Close is
// idempotent and safe concurrently with Run. Run may be called again after
// a Run returned: that is how a reload works (stop Run, Update, Run), and
// Update also reopens a closed Prober.
type Prober struct {
	s       Settings
	suite   *drift.Suite
	sched   cron.Schedule
	metrics *proberMetrics
	// estimates are the suite's tiers' costs before their first run.
	estimates map[string]float64

	mu       sync.Mutex // guards the mutable fields of backendState marked so, and closed/running/cancel
	backends map[backendKey]*backendState
	order    []backendKey
	closed   bool
	running  bool               // a Run runs
	cancel   context.CancelFunc // the running Run's; nil when none runs

	// urgent queues cycles to run at once (fingerprint events), one per
	// backend at most; Run drains it.
	urgent chan backendKey
}

// New validates s and returns a Prober. It does no I/O.
func New(s Settings) (*Prober, error) {
	if s.Suite == nil {
		def, err := drift.LoadSuite(drift.DefaultSuite)
		if err != nil {
			return nil, err
		}
		s.Suite = def
	}
	if s.Store == nil {
		s.Store = &memStore{m: map[backendKey][]byte{}}
	}
	if s.States == nil {
		s.States = &memStates{memStore{m: map[backendKey][]byte{}}}
	}
	if s.Sink == nil {
		s.Sink = discardSink{}
	}
	if s.Schedule == "" {
		s.Schedule = "@every 5m"
	}
	if s.Timeout == 0 {
		s.Timeout = 30 * time.Second
	}
	if s.HTTPClient == nil {
		s.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	s.Params = s.Params.WithDefaults()
	sched, err := ParseSchedule(s.Schedule)
	if err != nil {
		return nil, fmt.Errorf("probes: schedule %q: %w", s.Schedule, err)
	}
	if s.Jitter == 0 {
		n1 := sched.Next(s.Now())
		s.Jitter = min(sched.Next(n1).Sub(n1)/10, 5*time.Minute)
	}
	p := &Prober{s: s, suite: s.Suite, sched: sched, backends: map[backendKey]*backendState{}, urgent: make(chan backendKey, len(s.Targets)),
		estimates: staticEstimates(s.Suite)}
	for i, t := range s.Targets {
		if t.Pool == "" || t.Backend == "" || t.URL == "" {
			return nil, fmt.Errorf("probes: targets[%d]: pool, backend and url are required", i)
		}
		if t.Endpoint != "" && t.Endpoint != EndpointChat && t.Endpoint != EndpointCompletions {
			return nil, fmt.Errorf("%w: targets[%d] (%s/%s): endpoint %q: want %s or %s",
				ErrInvalidTarget, i, t.Pool, t.Backend, t.Endpoint, EndpointChat, EndpointCompletions)
		}
		if t.BudgetTokensPerDay < 0 {
			return nil, fmt.Errorf("%w: targets[%d] (%s/%s): budget %d tokens per day: must be >= 0 (0: unlimited)",
				ErrInvalidTarget, i, t.Pool, t.Backend, t.BudgetTokensPerDay)
		}
		if c := t.CostPerMTok; c != nil && (!(*c >= 0) || math.IsInf(*c, 0)) {
			return nil, fmt.Errorf("%w: targets[%d] (%s/%s): cost per million tokens %v: must be a finite number >= 0",
				ErrInvalidTarget, i, t.Pool, t.Backend, *c)
		}
		k := backendKey{t.Pool, t.Backend}
		if p.backends[k] != nil {
			return nil, fmt.Errorf("probes: targets[%d]: %s/%s listed twice", i, t.Pool, t.Backend)
		}
		st := &backendState{t: t, client: NewClient(t, s.HTTPClient), reported: fleetwatch.DriftUnknown,
			peer: fleetwatch.DriftOK, pvalue: math.NaN(), budget: newBudget(t.BudgetTokensPerDay)}
		if s.Jitter > 0 {
			h := fnv.New64a()
			h.Write([]byte(t.Pool + "\x00" + t.Backend))
			st.offset = time.Duration(h.Sum64() % uint64(s.Jitter))
		}
		st.snap = BackendStatus{Pool: t.Pool, Backend: t.Backend, Status: fleetwatch.DriftUnknown, Baseline: fleetwatch.DriftUnknown, Peers: fleetwatch.DriftOK}
		p.backends[k] = st
		p.order = append(p.order, k)
	}
	p.metrics = newProberMetrics(s.Metrics, p)
	for _, t := range s.Targets {
		if t.BudgetTokensPerDay > 0 {
			for _, tier := range budgetTiers {
				p.metrics.tierSkipped(t.Pool, t.Backend, tier) // present at 0 from the start
			}
		}
	}
	return p, nil
}

// Suite is the prompt suite in use.
func (p *Prober) Suite() *drift.Suite { return p.suite }

func (p *Prober) state(pool, backend string) (*backendState, error) {
	st := p.backends[backendKey{pool, backend}]
	if st == nil {
		return nil, fmt.Errorf("%w: %s/%s", ErrUnknownBackend, pool, backend)
	}
	return st, nil
}

// load makes sure st.mon exists, from the stored baseline (and drift
// state) when there is one of the current suite, and compares the pool's
// peers when it loaded a baseline. Called with st.run held.
func (p *Prober) load(ctx context.Context, st *backendState, o *outbox) error {
	loaded, err := p.loadMonitor(ctx, st, o)
	if loaded {
		p.comparePeers(ctx, st.t.Pool, o)
	}
	return err
}

// loadMonitor is load without the peer comparison; it reports whether it
// loaded a baseline. Called with st.run held.
func (p *Prober) loadMonitor(ctx context.Context, st *backendState, o *outbox) (bool, error) {
	if st.mon != nil {
		return false, nil
	}
	var b *drift.Baseline
	data, err := p.s.Store.Load(ctx, st.t.Pool, st.t.Backend)
	switch {
	case errors.Is(err, ErrNoBaseline), err == nil && len(data) == 0:
	case err != nil:
		return false, fmt.Errorf("probes: load baseline of %s/%s: %w", st.t.Pool, st.t.Backend, err)
	default:
		if b, err = drift.UnmarshalBaseline(data); err != nil {
			p.s.Logf("probes: %s/%s: stored baseline unusable, enrolling again: %v", st.t.Pool, st.t.Backend, err)
			b = nil
		} else if b.SuiteHash != p.suite.Hash {
			p.s.Logf("probes: %s/%s: suite changed (%s %s -> %s %s), enrolling again", st.t.Pool, st.t.Backend, b.Suite, b.SuiteHash, p.suite.Name, p.suite.Hash)
			b = nil
		}
	}
	st.mon = drift.NewMonitor(st.t.Pool, st.t.Backend, drift.MonitorSettings{Suite: p.suite, Enrol: p.s.Enrol, EnrolMin: p.s.EnrolMin, Params: p.s.Params}, b)
	var restored *drift.DriftState
	if b != nil {
		if ds := p.loadState(ctx, st); ds != nil && st.mon.ImportState(ds) {
			restored = ds
			p.s.Logf("probes: %s/%s: drift state restored: %s since %s (peers %s), CUSUM %.2f, cooldown %d",
				st.t.Pool, st.t.Backend, ds.Status, fleetwatch.FormatTime(ds.Since), ds.Peers, ds.CUSUM.C, ds.CUSUM.Cooldown)
		}
	}
	p.mu.Lock()
	if restored != nil {
		if restored.Peers != "" {
			st.peer, st.peerSince = restored.Peers, restored.PeersSince
		}
		st.lastAlert = restored.LastAlert
	}
	p.refreshLocked(st)
	p.mu.Unlock()
	p.notifyStatus(st, o)
	return b != nil, nil
}

// ProbeBackend runs one probe cycle of a backend: the cron job body. A
// metadata change (fingerprint, /v1/models, /version, prompt token counts)
// runs one extra cycle at once. A failed cycle is reported to the Sink as a
// probe error and returned; it never changes a drift status.
func (p *Prober) ProbeBackend(ctx context.Context, pool, backend string) error {
	st, err := p.state(pool, backend)
	if err != nil {
		return err
	}
	var o outbox
	st.run.Lock()
	extra, err := p.cycle(ctx, st, &o)
	if err == nil && extra {
		_, err = p.cycle(ctx, st, &o)
	}
	st.run.Unlock()
	o.flush()
	if err != nil {
		// The Sink and the status got err as it is, beside the ids.
		return fmt.Errorf("probes: %s/%s: %w", pool, backend, err)
	}
	return nil
}

// cycle runs one cycle with st.run held and reports whether its metadata
// changed.
func (p *Prober) cycle(ctx context.Context, st *backendState, o *outbox) (bool, error) {
	if err := p.load(ctx, st, o); err != nil {
		p.probeError(st, err, o)
		return false, err
	}
	now := p.s.Now()
	pl := p.planTiers(st, now)
	var use cycleUsage
	cy, caps, err := st.client.RunTiers(ctx, p.suite, now, p.s.Timeout, Tiers{Sampled: pl.runs(TierSampled), Tools: pl.runs(TierTools),
		SampledUsage: &use.sampled, ToolsUsage: &use.tools})
	if err == nil && pl.runs(TierTeacher) {
		err = p.teach(withMeter(ctx, &use.teacher), st, cy, &caps)
	}
	p.charge(st, pl, &use, now)
	if err != nil {
		p.probeError(st, err, o)
		return false, err
	}
	if !pl.runs(TierSampled) {
		return p.partialCycle(ctx, st, cy, pl, o), nil
	}
	p.mu.Lock()
	cy.TrafficFingerprint = st.trafficFP
	p.mu.Unlock()
	caps.Seed = true // the seed parameter was accepted on every request
	res, err := st.mon.Observe(cy, func(pv float64) bool { return p.fdr(st, pv) })
	if err != nil {
		p.probeError(st, err, o)
		return false, err
	}
	p.metrics.cycles.Inc()
	if res.Enrolled {
		data, err := st.mon.Baseline().Marshal()
		if err == nil {
			err = p.s.Store.Save(ctx, st.t.Pool, st.t.Backend, data)
		}
		if err != nil {
			p.s.Logf("probes: %s/%s: saving baseline: %v", st.t.Pool, st.t.Backend, err)
			p.probeError(st, fmt.Errorf("probes: save baseline of %s/%s: %w", st.t.Pool, st.t.Backend, err), o)
		}
		p.s.Logf("probes: %s/%s: enrolled over %d cycles", st.t.Pool, st.t.Backend, st.mon.Baseline().Cycles)
	}
	p.mu.Lock()
	st.snap.Caps = caps
	st.snap.LastCycle = cy.At
	st.snap.LastError, st.snap.LastErrorKind = "", ""
	p.refreshLocked(st)
	p.mu.Unlock()
	if res.Alert != nil {
		p.emit(st, *res.Alert, o)
	}
	if res.Enrolled {
		p.comparePeers(ctx, st.t.Pool, o)
	}
	p.notifyStatus(st, o)
	o.add(func() { p.saveState(ctx, st) })
	if len(res.IdentityChanges) > 0 {
		p.s.Logf("probes: %s/%s: metadata changed (%v): running an extra cycle", st.t.Pool, st.t.Backend, res.IdentityChanges)
	}
	return len(res.IdentityChanges) > 0, nil
}

// fdr records a black-box backend's p-value and applies Benjamini-Hochberg
// over the latest p-values of every black-box backend.
func (p *Prober) fdr(st *backendState, pv float64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st.pvalue = pv
	var ps []float64
	self := -1
	for _, k := range p.order {
		b := p.backends[k]
		if b == st {
			self = len(ps)
		}
		if !math.IsNaN(b.pvalue) {
			ps = append(ps, b.pvalue)
		}
	}
	return self >= 0 && drift.BenjaminiHochberg(ps, p.s.Params.FDR)[self]
}

func (p *Prober) probeError(st *backendState, err error, o *outbox) {
	kind := drift.ErrorKind(err)
	p.metrics.probeErrors(st.t.Pool, st.t.Backend, kind).Inc()
	p.mu.Lock()
	st.snap.LastError, st.snap.LastErrorKind, st.snap.LastErrorAt = err.Error(), kind, p.s.Now()
	st.snap.Errors++
	p.mu.Unlock()
	p.s.Logf("probes: %s/%s: probe error (%s): %v", st.t.Pool, st.t.Backend, kind, err)
	o.add(func() { p.s.Sink.ProbeError(st.t.Pool, st.t.Backend, err) })
}

// emit counts an alert, records it as the backend's last, and queues it for
// the Sink.
func (p *Prober) emit(st *backendState, a fleetwatch.DriftAlert, o *outbox) {
	p.metrics.alerts(a.Status).Inc()
	p.mu.Lock()
	last := a
	st.lastAlert = &last
	st.snap.LastAlert = &last
	p.mu.Unlock()
	o.add(func() { p.s.Sink.Alert(a) })
}

// notifyStatus tells the Sink the combined status, when it changed, at
// flush time.
func (p *Prober) notifyStatus(st *backendState, o *outbox) {
	o.add(func() {
		p.mu.Lock()
		s := st.snap.Status
		changed := s != st.reported
		st.reported = s
		p.mu.Unlock()
		if changed {
			p.s.Sink.Status(st.t.Pool, st.t.Backend, s)
		}
	})
}

// refreshLocked copies the monitor's state into the status snapshot.
func (p *Prober) refreshLocked(st *backendState) {
	sn := &st.snap
	m := st.mon
	sn.Baseline, sn.Since = m.Status()
	b := m.Baseline()
	sn.Enrolling = b == nil
	sn.EnrolCycles = m.EnrolCycles()
	sn.Logprobs = b != nil && b.Logprobs
	if b != nil {
		sn.BaselineCycles, sn.BaselineCreated = b.Cycles, b.Created
	}
	last := m.Last()
	sn.Score, sn.Threshold = last.Signal.Score, last.Signal.Thresh
	sn.Z = math.NaN()
	if b != nil && b.Logprobs && !last.Enrolled && !last.Enrolling && !last.At.IsZero() {
		sn.Z = b.Null.S2.Z(last.Stats.S2)
	}
	sn.CUSUM = m.Detector().CUSUM.C
	sn.Cooldown = m.Detector().CUSUM.Cooldown
	if cu, ok := m.DecidingCUSUM(); ok {
		sn.CUSUM, sn.Cooldown = cu.C, cu.Cooldown
	}
	sn.Tools = last.Tools
	sn.IdentityPending = m.Detector().IdentityPending
	sn.BaselineSince = sn.Since
	st.monState = m.ExportState()
	combineLocked(st)
}

// combineLocked recomputes the combined status from the baseline and peer
// statuses; it does not touch the monitor, so it may run while another
// goroutine holds st.run.
func combineLocked(st *backendState) {
	sn := &st.snap
	sn.Peers, sn.PeersSince = st.peer, st.peerSince
	sn.Status, sn.Since = worse(sn.Baseline, st.peer), sn.BaselineSince
	if sn.Status == sn.Peers && sn.Peers != fleetwatch.DriftOK && sn.Status != sn.Baseline {
		sn.Since = sn.PeersSince
	}
	sn.LastAlert = st.lastAlert
}

var rank = map[fleetwatch.DriftStatus]int{fleetwatch.DriftUnknown: 0, fleetwatch.DriftOK: 1, fleetwatch.DriftSuspect: 2, fleetwatch.DriftDrifted: 3}

func worse(a, b fleetwatch.DriftStatus) fleetwatch.DriftStatus {
	if rank[b] > rank[a] && !(a == fleetwatch.DriftUnknown && b == fleetwatch.DriftOK) {
		return b
	}
	return a
}

// comparePeers compares the baselines of a pool's backends and emits
// alerts against peers for backends whose peer status changed.
func (p *Prober) comparePeers(ctx context.Context, pool string, o *outbox) {
	baselines := map[string]*drift.Baseline{}
	var states []*backendState
	for _, k := range p.order {
		if k.pool != pool {
			continue
		}
		st := p.backends[k]
		states = append(states, st)
		loaded := false
		if st.run.TryLock() { // another backend's cycle may hold it: use what is stored
			if st.mon != nil {
				loaded = true
				if b := st.mon.Baseline(); b != nil {
					baselines[k.backend] = b
				}
			}
			st.run.Unlock()
		}
		if loaded {
			continue
		}
		// not loaded yet (the start) or busy: what is stored
		if data, err := p.s.Store.Load(ctx, k.pool, k.backend); err == nil && len(data) > 0 {
			if b, err := drift.UnmarshalBaseline(data); err == nil && b.SuiteHash == p.suite.Hash {
				baselines[k.backend] = b
			}
		}
	}
	v := drift.ComparePeers(baselines, p.s.Params)
	tv := drift.CompareToolPeers(baselines, p.s.Params) // toolpeers.go
	now := p.s.Now()
	var alerts []fleetwatch.DriftAlert
	p.mu.Lock()
	for _, st := range states {
		want := fleetwatch.DriftOK
		var score, thresh float64
		reason := ""
		switch {
		case v.Outlier == st.t.Backend:
			want, score = fleetwatch.DriftDrifted, v.OutlierDistance
			thresh = max(p.s.Params.PeerMinNats, p.s.Params.PeerRatio*v.OthersDistance)
			reason = fmt.Sprintf("outlier among %d peers: median baseline distance %.4f nats vs %.4f among the others (needs >= %.2f and >= %.0fx)",
				len(baselines), v.OutlierDistance, v.OthersDistance, p.s.Params.PeerMinNats, p.s.Params.PeerRatio)
		case v.PairDiffers && (v.Pair[0] == st.t.Backend || v.Pair[1] == st.t.Backend):
			d := v.Distances[v.Pair[0]+"|"+v.Pair[1]]
			want, score, thresh = fleetwatch.DriftSuspect, d, p.s.Params.PeerMinNats
			reason = fmt.Sprintf("the two backends %s and %s differ: baseline distance %.4f nats >= %.2f; with two peers neither is blamed",
				v.Pair[0], v.Pair[1], d, p.s.Params.PeerMinNats)
		case tv.Outlier == st.t.Backend:
			want, score, thresh, reason = fleetwatch.DriftDrifted, tv.Stats.Z, tv.Thresh, tv.Reason
		case tv.PairDiffers && (tv.Pair[0] == st.t.Backend || tv.Pair[1] == st.t.Backend):
			want, score, thresh, reason = fleetwatch.DriftSuspect, tv.Stats.Z, tv.Thresh, tv.Reason
		default:
			reason = "in line with its peers"
		}
		if want == st.peer {
			continue
		}
		prev := worse(st.snap.Baseline, st.peer)
		st.peer, st.peerSince = want, now
		combineLocked(st)
		if _, has := baselines[st.t.Backend]; !has && want == fleetwatch.DriftOK {
			continue
		}
		ev := fleetwatch.DriftEvidence{Prompts: len(p.suite.Prompts), MeanAbsLogprobDelta: new(float64(score)),
			ModelIDs: []string{}, Extra: map[string]any{"peer_distances": v.Distances, "peers": len(baselines)}}
		if b := baselines[st.t.Backend]; b != nil {
			ev.ModelIDs = b.Identity.ModelIDs
			if f := b.Identity.Fingerprint; f != "" {
				ev.FingerprintAfter = &f
			}
		}
		alerts = append(alerts, fleetwatch.DriftAlert{V: fleetwatch.ProtocolVersion, Pool: pool, Backend: st.t.Backend,
			At: fleetwatch.At(now), Status: want, Previous: prev, Score: score, Threshold: thresh,
			Against: fleetwatch.AgainstPeers, Suite: p.suite.Name, Evidence: ev, Reason: reason})
	}
	p.mu.Unlock()
	for _, a := range alerts {
		p.emit(p.backends[backendKey{a.Pool, a.Backend}], a, o)
	}
	for _, st := range states {
		p.notifyStatus(st, o)
		o.add(func() { p.saveState(ctx, st) })
	}
}

// Rebaseline drops a backend's baseline and restarts its enrolment: the
// explicit operator action of docs/DRIFT.md. The action is recorded as an
// alert with status "unknown" (previous: the status before) whose reason
// names who asked.
func (p *Prober) Rebaseline(ctx context.Context, pool, backend, by string) (fleetwatch.DriftAlert, error) {
	st, err := p.state(pool, backend)
	if err != nil {
		return fleetwatch.DriftAlert{}, err
	}
	var o outbox
	defer o.flush() // after the unlock below: defers run last in, first out
	st.run.Lock()
	defer st.run.Unlock()
	if err := p.load(ctx, st, &o); err != nil {
		return fleetwatch.DriftAlert{}, err
	}
	if err := p.s.Store.Save(ctx, pool, backend, nil); err != nil {
		return fleetwatch.DriftAlert{}, fmt.Errorf("probes: clear baseline of %s/%s: %w", pool, backend, err)
	}
	now := p.s.Now()
	p.mu.Lock()
	prev := st.snap.Status
	st.mon.Rebaseline(now)
	st.peer, st.peerSince = fleetwatch.DriftOK, now
	p.refreshLocked(st)
	p.mu.Unlock()
	a := RebaselineAlert(pool, backend, p.suite, prev, by, now)
	p.emit(st, a, &o)
	p.notifyStatus(st, &o)
	o.add(func() { p.saveState(ctx, st) })
	p.comparePeers(ctx, pool, &o)
	return a, nil
}

// RebaselineAlert is the record of an operator's re-baseline: status
// "unknown" (the backend enrols again), Extra action "rebaseline".
func RebaselineAlert(pool, backend string, s *drift.Suite, prev fleetwatch.DriftStatus, by string, now time.Time) fleetwatch.DriftAlert {
	if by == "" {
		by = "an operator"
	}
	if prev == "" {
		prev = fleetwatch.DriftUnknown
	}
	return fleetwatch.DriftAlert{V: fleetwatch.ProtocolVersion, Pool: pool, Backend: backend, At: fleetwatch.At(now),
		Status: fleetwatch.DriftUnknown, Previous: prev, Against: fleetwatch.AgainstBaseline, Suite: s.Name,
		Evidence: fleetwatch.DriftEvidence{Prompts: len(s.Prompts), ModelIDs: []string{},
			Extra: map[string]any{"action": "rebaseline", "requested_by": by}},
		Reason: "re-baseline requested by " + by + ": the baseline was dropped and enrolment restarts"}
}

// BackendStatus is one backend's drift state, for `drift status`, the
// review and metrics.
type BackendStatus struct {
	Pool    string                 `json:"pool"`
	Backend string                 `json:"backend"`
	Status  fleetwatch.DriftStatus `json:"status"` // worst of Baseline and Peers
	Since   time.Time              `json:"since"`
	// Baseline is the status against its own baseline, Peers against the
	// other backends of the pool.
	Baseline        fleetwatch.DriftStatus `json:"baseline"`
	BaselineSince   time.Time              `json:"baseline_since"`
	Peers           fleetwatch.DriftStatus `json:"peers"`
	PeersSince      time.Time              `json:"peers_since"`
	Enrolling       bool                   `json:"enrolling"`
	EnrolCycles     int                    `json:"enrol_cycles"`
	BaselineCycles  int                    `json:"baseline_cycles"`
	BaselineCreated time.Time              `json:"baseline_created"`
	Logprobs        bool                   `json:"logprobs"`
	Score           float64                `json:"score"`
	Threshold       float64                `json:"threshold"`
	Z               float64                `json:"-"` // last S2 z, NaN when none
	CUSUM           float64                `json:"cusum"`
	// Cooldown is how many cycles the CUSUM still cannot alarm.
	Cooldown int `json:"cooldown"`
	// IdentityPending is set while the backend is suspect because its
	// identity tier changed (confirmed by the next cycle or cleared).
	IdentityPending bool `json:"identity_pending,omitempty"`
	// Quarantined: drifted while the wiring quarantines drifted backends.
	Quarantined bool `json:"quarantined"`
	// TrafficFingerprint is the system_fingerprint the backend's traffic
	// showed in its last fingerprint event; FingerprintEvents counts them.
	TrafficFingerprint   string                  `json:"traffic_fingerprint,omitempty"`
	FingerprintEvents    int                     `json:"fingerprint_events"`
	LastFingerprintEvent *drift.FingerprintEvent `json:"last_fingerprint_event,omitempty"`
	// LastAlert is the backend's last drift alert, with its evidence.
	LastAlert *fleetwatch.DriftAlert `json:"last_alert,omitempty"`
	// Tools is the last cycle's tool-call tier (nil without tool probes).
	Tools         *drift.ToolResult `json:"tools,omitempty"`
	Caps          Capabilities      `json:"capabilities"`
	LastCycle     time.Time         `json:"last_cycle"`
	LastError     string            `json:"last_error,omitempty"`
	LastErrorKind string            `json:"last_error_kind,omitempty"`
	LastErrorAt   time.Time         `json:"last_error_at"`
	Errors        int               `json:"errors"`
	// Budget is the probe budget and what the probes spent (budget.go).
	Budget *BudgetStatus `json:"budget,omitempty"`
}

// Statuses returns every target's drift state, in target order.
func (p *Prober) Statuses() []BackendStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]BackendStatus, 0, len(p.order))
	now := p.s.Now()
	for _, k := range p.order {
		st := p.backends[k]
		sn := st.snap
		sn.Quarantined = p.s.Quarantine && sn.Status == fleetwatch.DriftDrifted
		sn.Budget = st.budget.status(now, st.t.CostPerMTok, p.estimates)
		out = append(out, sn)
	}
	return out
}

// jittered shifts a schedule by a fixed offset. A wall-clock spec ("0 * * *
// *") is shifted at every activation; an "@every" schedule counts from the
// previous activation, so shifting its first one shifts them all (whole
// seconds: robfig/cron rounds @every activations to the second). cron calls
// Next from its one scheduling goroutine.
type jittered struct {
	inner   cron.Schedule
	offset  time.Duration
	started bool
}

func (j *jittered) Next(t time.Time) time.Time {
	if _, every := j.inner.(cron.ConstantDelaySchedule); every {
		if j.started {
			return j.inner.Next(t)
		}
		j.started = true
		return j.inner.Next(t).Add(j.offset)
	}
	return j.inner.Next(t.Add(-j.offset)).Add(j.offset)
}

// LoadBaselines loads every target's stored baseline now, so that statuses
// (and Sink.Status) are known at start instead of after each backend's first
// cycle. Run calls it; errors are reported as probe errors and the backend
// tries again at its first cycle.
func (p *Prober) LoadBaselines(ctx context.Context) {
	p.loadAll(ctx, nil, false)
}

// loadAll loads the monitors of the targets of pools (nil: all), anew when
// reload is set, then compares the peers of each pool where a baseline was
// loaded, once per pool. It returns the first error (each is reported as a
// probe error).
func (p *Prober) loadAll(ctx context.Context, pools map[string]bool, reload bool) error {
	var first error
	var compare []string
	for _, k := range p.order {
		if pools != nil && !pools[k.pool] {
			continue
		}
		st := p.backends[k]
		var o outbox
		st.run.Lock()
		if reload {
			st.mon = nil
			p.mu.Lock()
			st.reported = "" // tell the Sink whatever the status is
			p.mu.Unlock()
		}
		loaded, err := p.loadMonitor(ctx, st, &o)
		if err != nil {
			p.probeError(st, err, &o)
			if first == nil {
				first = err
			}
		}
		st.run.Unlock()
		o.flush()
		if loaded && !slices.Contains(compare, k.pool) {
			compare = append(compare, k.pool)
		}
	}
	for _, pool := range compare {
		var o outbox
		p.comparePeers(ctx, pool, &o)
		o.flush()
	}
	return first
}

// Run schedules every target's cycles with robfig/cron (Recover and
// SkipIfStillRunning set explicitly, so a panicking or slow cycle neither
// kills the scheduler nor piles up) until ctx is done or Close is called,
// then waits for running cycles to finish and returns nil. It returns
// ErrRunning while another Run runs and ErrClosed after Close.
func (p *Prober) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.running {
		p.mu.Unlock()
		return ErrRunning
	}
	p.running, p.cancel = true, cancel
	p.mu.Unlock()
	defer func() { // registered first: runs after the cycles finished
		p.mu.Lock()
		p.running, p.cancel = false, nil
		p.mu.Unlock()
	}()
	p.LoadBaselines(ctx)
	var checks sync.WaitGroup // the identity checks at start
	defer checks.Wait()
	for _, k := range p.order {
		st := p.backends[k]
		if !p.owns(st.t.Pool) {
			continue
		}
		checks.Go(func() { p.checkIdentity(ctx, st) })
	}
	logger := cronLogger{p.s.Logf}
	c := cron.New(cron.WithChain(cron.Recover(logger)), cron.WithLogger(logger))
	for _, k := range p.order {
		st := p.backends[k]
		job := cron.NewChain(cron.SkipIfStillRunning(logger)).Then(cron.FuncJob(func() {
			if !p.owns(st.t.Pool) {
				return // another instance decides (and probes) this pool
			}
			_ = p.ProbeBackend(ctx, st.t.Pool, st.t.Backend) // reported to the Sink
		}))
		c.Schedule(&jittered{inner: p.sched, offset: st.offset}, job)
	}
	c.Start()
	var urgent sync.WaitGroup
	urgent.Go(func() { p.runUrgent(ctx) })
	<-ctx.Done()
	<-c.Stop().Done()
	urgent.Wait()
	return nil
}

// runUrgent runs the cycles queued by fingerprint events until ctx ends.
func (p *Prober) runUrgent(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-p.urgent:
			st := p.backends[k]
			p.mu.Lock()
			st.queued = false
			p.mu.Unlock()
			if !p.owns(k.pool) {
				continue
			}
			_ = p.ProbeBackend(ctx, k.pool, k.backend) // reported to the Sink
		}
	}
}

// Fingerprint takes the metadata events of traffic (a Fingerprints
// tracker's): each is counted in fleetwatch_drift_fingerprint_events_total,
// logged and shown in the backend's status, and runs a probe cycle of the
// backend at once (at most one queued per backend); the fingerprint the
// traffic showed is evidence for the cycles that follow (see
// Cycle.TrafficFingerprint). Events of backends that are not targets are
// ignored. It never blocks: it may be called from the ingest path.
func (p *Prober) Fingerprint(events []drift.FingerprintEvent) {
	for _, e := range events {
		k := backendKey{e.Pool, e.Backend}
		st := p.backends[k]
		if st == nil {
			continue
		}
		p.metrics.fingerprintEvents(e.Pool, e.Backend, e.Kind).Inc()
		p.s.Logf("probes: %s/%s: traffic fingerprint %s: %q -> %q (%d changes seen): probing now",
			e.Pool, e.Backend, e.Kind, e.Before, e.After, e.Changes)
		p.mu.Lock()
		ev := e
		st.trafficFP = e.After
		st.snap.TrafficFingerprint = e.After
		st.snap.FingerprintEvents++
		st.snap.LastFingerprintEvent = &ev
		if !st.queued {
			select {
			case p.urgent <- k:
				st.queued = true
			default:
			}
		}
		p.mu.Unlock()
	}
}

// checkIdentity reads a backend's identity tier at start and, when it
// differs from its baseline's (the backend was changed while nobody
// watched), runs a full cycle at once instead of waiting for the
// schedule. A backend without a baseline, or whose identity cannot be
// read, waits for its first cycle (which reports any error).
func (p *Prober) checkIdentity(ctx context.Context, st *backendState) {
	st.run.Lock()
	var b *drift.Baseline
	if st.mon != nil {
		b = st.mon.Baseline()
	}
	st.run.Unlock()
	if b == nil {
		return
	}
	p.metrics.identityChecks.Inc()
	id, err := st.client.Identity(ctx, p.s.Timeout)
	if err != nil {
		p.s.Logf("probes: %s/%s: identity check at start: %v (the first cycle will tell)", st.t.Pool, st.t.Backend, err)
		return
	}
	tier := b.Identity.TierChanges(id)
	if len(tier) == 0 {
		return
	}
	p.s.Logf("probes: %s/%s: identity differs from the baseline at start (%v): probing now", st.t.Pool, st.t.Backend, tier)
	_ = p.ProbeBackend(ctx, st.t.Pool, st.t.Backend) // reported to the Sink
}

// Close stops a running Run (without waiting for it) and makes every later
// Run return ErrClosed until Update reopens the Prober. It is idempotent,
// safe concurrently with Run, and returns nil.
func (p *Prober) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.cancel != nil {
		p.cancel()
	}
	return nil
}

// cronLogger adapts Logf to cron.Logger.
type cronLogger struct{ logf func(string, ...any) }

func (l cronLogger) Info(string, ...any) {}
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.logf("probes: cron: %s: %v %v", msg, err, kv)
}

type discardSink struct{}

func (discardSink) Alert(fleetwatch.DriftAlert)                   {}
func (discardSink) Status(string, string, fleetwatch.DriftStatus) {}
func (discardSink) ProbeError(string, string, error)              {}

// memStore is the in-memory baseline Store used when none is given.
type memStore struct {
	mu sync.Mutex // guards m
	m  map[backendKey][]byte
}

func (s *memStore) Load(_ context.Context, pool, backend string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[backendKey{pool, backend}]
	if !ok {
		return nil, ErrNoBaseline
	}
	return d, nil
}

func (s *memStore) Save(_ context.Context, pool, backend string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[backendKey{pool, backend}] = data
	return nil
}

// sortStatuses orders statuses by pool then backend.
func sortStatuses(s []BackendStatus) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Pool != s[j].Pool {
			return s[i].Pool < s[j].Pool
		}
		return s[i].Backend < s[j].Backend
	})
}
