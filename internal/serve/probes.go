package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// probeDeps is what startProbes needs from serve.
type probeDeps struct {
	cfg *config.Config
	// prober, when set, is the prober of an earlier start, updated to
	// cfg and reused (a reload keeps the state of the targets that stay).
	prober   *probes.Prober
	nc       *nats.Conn
	js       jetstream.JetStream // nil without JetStream
	prefix   string
	setDrift func(pool, backend string, s fleetwatch.DriftStatus)
	metrics  *metrics.Set
	logf     func(string, ...any)
	// onAlert, when set, also receives every drift alert (the status page).
	onAlert func(fleetwatch.DriftAlert)
	// onReview, when set, receives every review digest (the alerts).
	onReview func(fleetwatch.DriftReview)
	// getenv reads API keys. If nil, os.Getenv.
	getenv func(string) string
	// now is the clock. If nil, time.Now.
	now func() time.Time
	// fingerprints, when set, hands the fingerprint events of traffic to
	// the probes while they run.
	fingerprints *fingerprintSink
	// owns, when set, tells the probes which pools this instance decides
	// now (probes.Settings.Owns): with several instances each backend is
	// probed by its pool's owner alone.
	owns func(pool string) bool
	// leader, when set, says whether this instance publishes the review
	// digest (the owner of partition 0); the others skip it.
	leader func() bool
}

// fingerprintSink is the collector's sink in serve: the analyzer (through
// the partitions' sink with JetStream), plus a
// drift.Fingerprints tracker that follows the system_fingerprint of
// outcome events and hands its events (rare: a change, a disagreement with
// the pool) to the running probes. The analyzer stays free of it; the
// tracker costs one lock per batch that carries fingerprints.
type fingerprintSink struct {
	an      collector.RefusingSink
	tracker *drift.Fingerprints
	handler atomic.Pointer[func([]drift.FingerprintEvent)] // nil while the probes do not run
}

func newFingerprintSink(an collector.RefusingSink) *fingerprintSink {
	return &fingerprintSink{an: an, tracker: drift.NewFingerprints(drift.FingerprintSettings{})}
}

func (f *fingerprintSink) track(batch []fleetwatch.Event) {
	if evs := f.tracker.Observe(batch); len(evs) > 0 {
		if h := f.handler.Load(); h != nil {
			(*h)(evs)
		}
	}
}

// Observe implements collector.Sink.
func (f *fingerprintSink) Observe(batch []fleetwatch.Event) bool {
	f.track(batch)
	return f.an.Observe(batch)
}

// ObserveRefusing implements collector.RefusingSink, so that the
// analyzer's refusals still reach the collector.
func (f *fingerprintSink) ObserveRefusing(batch []fleetwatch.Event, refused []fleetwatch.Refusal) (bool, []fleetwatch.Refusal) {
	f.track(batch)
	return f.an.ObserveRefusing(batch, refused)
}

// wireSink publishes what the prober finds.
type wireSink struct {
	d    probeDeps
	subj fleetwatch.Subjects

	mu     sync.Mutex // guards recent
	recent []fleetwatch.DriftAlert
}

func (w *wireSink) Alert(a fleetwatch.DriftAlert) {
	data, err := json.Marshal(a)
	if err != nil {
		w.d.logf("drift: encode alert: %v", err)
		return
	}
	if err := w.d.nc.Publish(w.subj.Drift(a.Pool), data); err != nil {
		w.d.logf("drift: publish alert: %v", err)
	}
	w.d.logf("drift: %s/%s %s -> %s (against %s): %s", a.Pool, a.Backend, a.Previous, a.Status, a.Against, a.Reason)
	w.mu.Lock()
	w.recent = append(w.recent, a)
	if len(w.recent) > 1000 {
		w.recent = w.recent[len(w.recent)-1000:]
	}
	w.mu.Unlock()
	if w.d.onAlert != nil {
		w.d.onAlert(a)
	}
}

func (w *wireSink) Status(pool, backend string, s fleetwatch.DriftStatus) {
	if w.d.setDrift != nil {
		w.d.setDrift(pool, backend, s)
	}
}

func (w *wireSink) ProbeError(pool, backend string, err error) {}

// alertsSince is the in-memory fallback of the review without JetStream.
func (w *wireSink) alertsSince(since time.Time) []fleetwatch.DriftAlert {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []fleetwatch.DriftAlert
	for _, a := range w.recent {
		if !a.At.Before(since) {
			out = append(out, a)
		}
	}
	return out
}

// driftProbes are serve's running drift probes (startProbes).
type driftProbes struct {
	prober *probes.Prober
	stop   func()
}

// Stop stops the probes, the review and the control subscriptions, and
// waits for running cycles. It is idempotent.
func (d *driftProbes) Stop() { d.stop() }

// Restore reloads the stored baselines and drift states of pools (nil:
// all) and hands their statuses to the analyzer again (probes.Prober.Restore).
func (d *driftProbes) Restore(ctx context.Context, pools []string) error {
	return d.prober.Restore(ctx, pools)
}

// startProbes starts the drift probes and the drift review of serve: probe
// targets from the configured backends, baselines and drift states in KV,
// alerts on fw.drift.<pool> (kept in FW_DRIFT), the probe and review
// crons, and the control subjects `drift rebaseline` and `drift status`
// talk to. Before it returns, every stored baseline and drift state is
// loaded and its status handed to setDrift, so that the first snapshot
// after a restart already carries them (a drifted backend stays
// quarantined).
func startProbes(ctx context.Context, d probeDeps) (*driftProbes, error) {
	d.defaults()
	cfg := d.cfg
	subj := fleetwatch.Subjects{Prefix: d.prefix}
	suite, err := drift.LoadSuite(cfg.Probes.Suite)
	if err != nil {
		return nil, err
	}
	sink := &wireSink{d: d, subj: subj}
	st, err := openDriftStores(ctx, d, subj)
	if err != nil {
		return nil, err
	}
	ps := cfg.ProbeSettings(d.getenv)
	ps.Suite = suite
	ps.Store = st.baselines
	ps.States = st.states
	ps.Sink = sink
	ps.Metrics = d.metrics
	ps.Now = d.now
	ps.Logf = d.logf
	ps.Owns = d.owns
	prober := d.prober
	if prober != nil {
		err = prober.Update(ps)
	} else {
		prober, err = probes.New(ps)
	}
	if err != nil {
		return nil, err
	}
	reviewer, err := newReviewer(d, subj, prober, sink, st.stream != nil)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	subs, err := answerDriftControl(runCtx, d, subj, prober)
	if err != nil {
		cancel()
		return nil, err
	}

	// Before the first snapshot: every stored baseline and drift state,
	// handed to setDrift (Run finds them loaded).
	prober.LoadBaselines(runCtx)
	if d.fingerprints != nil {
		h := prober.Fingerprint
		d.fingerprints.handler.Store(&h)
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := prober.Run(runCtx); err != nil {
			d.logf("drift probes: %v", err)
		}
	})
	wg.Go(func() {
		if err := reviewer.Run(runCtx); err != nil {
			d.logf("drift review: %v", err)
		}
	})
	d.logf("drift: probing %d backend(s) on %q with suite %s (%s); review %q into %s",
		len(ps.Targets), cfg.Probes.Schedule, suite.Name, suite.Hash, cfg.Review.Schedule, cfg.ReviewSettings().Dir)
	var once sync.Once
	return &driftProbes{prober: prober, stop: func() {
		once.Do(func() {
			if d.fingerprints != nil {
				d.fingerprints.handler.Store(nil)
			}
			for _, s := range subs {
				s.Unsubscribe()
			}
			cancel()
			prober.Close()
			reviewer.Close()
			wg.Wait()
		})
	}}, nil
}

// defaults fills what the caller left unset.
func (d *probeDeps) defaults() {
	if d.logf == nil {
		d.logf = func(string, ...any) {}
	}
	if d.getenv == nil {
		d.getenv = os.Getenv
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.metrics == nil {
		d.metrics = metrics.NewSet()
	}
}

// driftStores are the probes' JetStream stores (all nil without
// JetStream: baselines and states in memory, no alerts kept).
type driftStores struct {
	baselines probes.Store
	states    probes.Store
	stream    jetstream.Stream
}

func openDriftStores(ctx context.Context, d probeDeps, subj fleetwatch.Subjects) (driftStores, error) {
	var st driftStores
	if d.js == nil {
		d.logf("drift: no JetStream: baselines and drift states live in memory and alerts are not kept for review")
		return st, nil
	}
	kv, err := control.OpenBaselines(ctx, d.js, subj)
	if err != nil {
		return st, fmt.Errorf("baselines bucket: %w", err)
	}
	st.baselines = control.KVBaselines{KV: kv}
	skv, err := control.OpenDriftStates(ctx, d.js, subj)
	if err != nil {
		return st, fmt.Errorf("drift state bucket: %w", err)
	}
	st.states = control.KVStates{KV: skv}
	if st.stream, err = control.EnsureDriftStream(ctx, d.js, subj); err != nil {
		return st, fmt.Errorf("drift stream: %w", err)
	}
	return st, nil
}

// newReviewer builds the review digest's scheduler: alerts read back from
// FW_DRIFT (kept is false without it: from the sink's memory), the digest
// published by the leader alone.
func newReviewer(d probeDeps, subj fleetwatch.Subjects, prober *probes.Prober, sink *wireSink, kept bool) (*probes.Reviewer, error) {
	rs := d.cfg.ReviewSettings()
	rs.Statuses = prober.Statuses
	rs.Now = d.now
	rs.Logf = d.logf
	rs.Alerts = func(ctx context.Context, since time.Time) ([]fleetwatch.DriftAlert, error) {
		if !kept {
			return sink.alertsSince(since), nil
		}
		alerts, _, err := control.ReadDrift(ctx, d.js, subj, since)
		return alerts, err
	}
	rs.Publish = func(ctx context.Context, r fleetwatch.DriftReview) error {
		if d.leader != nil && !d.leader() {
			return nil // another instance of the deployment publishes it
		}
		if d.onReview != nil {
			d.onReview(r)
		}
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if d.js != nil {
			_, err = d.js.Publish(ctx, subj.DriftReview(), data)
			return err
		}
		return d.nc.Publish(subj.DriftReview(), data)
	}
	if d.js != nil {
		rs.LastReview = func(ctx context.Context) (time.Time, bool, error) { return control.LastReview(ctx, d.js, subj) }
	}
	return probes.NewReviewer(rs)
}

// answerDriftControl subscribes the drift control verbs (re-baseline,
// drift status); the subscriptions are the caller's to end.
func answerDriftControl(ctx context.Context, d probeDeps, subj fleetwatch.Subjects, prober *probes.Prober) ([]*nats.Subscription, error) {
	respond := func(m *nats.Msg, r control.Reply) {
		data, _ := json.Marshal(r)
		if err := m.Respond(data); err != nil {
			d.logf("drift: control reply: %v", err)
		}
	}
	rebaseline, err := d.nc.Subscribe(subj.Control(control.VerbRebaseline), func(m *nats.Msg) {
		var req control.RebaselineRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			respond(m, control.Reply{Error: "bad request: " + err.Error()})
			return
		}
		a, err := prober.Rebaseline(ctx, req.Pool, req.Backend, req.By)
		if err != nil {
			respond(m, control.Reply{Error: err.Error()})
			return
		}
		respond(m, control.Reply{OK: true, Alert: &a})
	})
	if err != nil {
		return nil, err
	}
	status, err := d.nc.Subscribe(subj.Control(control.VerbDriftStatus), func(m *nats.Msg) {
		respond(m, control.Reply{OK: true, Statuses: prober.Statuses()})
	})
	if err != nil {
		rebaseline.Unsubscribe()
		return nil, err
	}
	return []*nats.Subscription{rebaseline, status}, nil
}

// errNoDriftProbes is returned by restoreDrift when the probes do not run
// (probes.disabled, or Run has not started them yet).
var errNoDriftProbes = errors.New("serve: drift probes not running")

// restoreDrift reloads the stored baselines and drift states of the
// configured backends of pools (nil: every pool) and hands their drift
// statuses to the analyzer, so that a drifted backend is quarantined in the
// next snapshot: what a new owner of pools calls when it takes them over,
// before it publishes their first snapshot. Run does the same for every
// pool at start. It waits for a running probe cycle of each backend.
func (s *Server) restoreDrift(ctx context.Context, pools []string) error {
	s.rl.probes.RLock() // not while a reload restarts the probes
	defer s.rl.probes.RUnlock()
	s.mu.Lock()
	d := s.drift
	s.mu.Unlock()
	if d == nil {
		return errNoDriftProbes
	}
	return d.Restore(ctx, pools)
}
