package serve

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/probes"
)

// Control verbs the probes of serve answer (on Subjects.Control(verb)).
const (
	ControlRebaseline  = "rebaseline"
	ControlDriftStatus = "drift-status"
)

// DriftRetention is how long FW_DRIFT keeps alerts and digests.
const DriftRetention = 30 * 24 * time.Hour

// probeDeps is what startProbes needs from serve.
type probeDeps struct {
	cfg      *config.Config
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
}

// RebaselineRequest is the payload of a re-baseline request.
type RebaselineRequest struct {
	Pool    string `json:"pool"`
	Backend string `json:"backend"`
	By      string `json:"by"`
}

// ControlReply answers a control request.
type ControlReply struct {
	OK       bool                   `json:"ok"`
	Error    string                 `json:"error,omitempty"`
	Alert    *fleetwatch.DriftAlert `json:"alert,omitempty"`
	Statuses []probes.BackendStatus `json:"statuses,omitempty"`
}

// KVBaselines stores baselines in the JetStream KV bucket fw_probe_baselines
// under "<pool>.<base64url(backend)>": pool ids are valid keys, backend ids
// may hold any printable character, and base64url has no '.', so the key is
// unique.
type KVBaselines struct{ KV jetstream.KeyValue }

func baselineKey(pool, backend string) string {
	return pool + "." + base64.RawURLEncoding.EncodeToString([]byte(backend))
}

func (s KVBaselines) Load(ctx context.Context, pool, backend string) ([]byte, error) {
	e, err := s.KV.Get(ctx, baselineKey(pool, backend))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, probes.ErrNoBaseline
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

func (s KVBaselines) Save(ctx context.Context, pool, backend string, data []byte) error {
	_, err := s.KV.Put(ctx, baselineKey(pool, backend), data)
	return err
}

// OpenBaselines creates or opens the baselines bucket (5 revisions kept per
// key, so a re-baseline leaves the previous baseline for audit).
func OpenBaselines(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      subj.BucketBaselines(),
		Description: "fleetwatch drift probe baselines",
		History:     5,
		Storage:     jetstream.FileStorage,
	})
}

// EnsureDriftStream creates or updates FW_DRIFT capturing fw.drift.>.
func EnsureDriftStream(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (jetstream.Stream, error) {
	return js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        subj.StreamDrift(),
		Description: "fleetwatch drift alerts and review digests",
		Subjects:    []string{subj.DriftWildcard()},
		MaxAge:      DriftRetention,
		Storage:     jetstream.FileStorage,
	})
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

// startProbes starts the drift probes and the drift review of serve: probe
// targets from the configured backends, baselines in KV, alerts on
// fw.drift.<pool> (kept in FW_DRIFT), the probe and review crons, and the
// control subjects `drift rebaseline` and `drift status` talk to. stop
// stops everything and waits for running cycles.
func startProbes(ctx context.Context, d probeDeps) (stop func(), err error) {
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
	cfg := d.cfg
	subj := fleetwatch.Subjects{Prefix: d.prefix}
	suite, err := probes.LoadSuite(cfg.Probes.Suite)
	if err != nil {
		return nil, err
	}
	sink := &wireSink{d: d, subj: subj}
	var store probes.BaselineStore
	var stream jetstream.Stream
	if d.js != nil {
		kv, err := OpenBaselines(ctx, d.js, subj)
		if err != nil {
			return nil, fmt.Errorf("baselines bucket: %w", err)
		}
		store = KVBaselines{kv}
		if stream, err = EnsureDriftStream(ctx, d.js, subj); err != nil {
			return nil, fmt.Errorf("drift stream: %w", err)
		}
	} else {
		d.logf("drift: no JetStream: baselines live in memory and alerts are not kept for review")
	}
	ps := cfg.ProbeSettings(d.getenv)
	ps.Suite = suite
	ps.Store = store
	ps.Sink = sink
	ps.Metrics = d.metrics
	ps.Now = d.now
	ps.Logf = d.logf
	prober, err := probes.New(ps)
	if err != nil {
		return nil, err
	}
	rs := cfg.ReviewSettings()
	reviewDir := rs.Dir
	rs.Statuses = prober.Statuses
	rs.Now = d.now
	rs.Logf = d.logf
	rs.Alerts = func(ctx context.Context, since time.Time) ([]fleetwatch.DriftAlert, error) {
		if stream == nil {
			return sink.alertsSince(since), nil
		}
		alerts, _, err := ReadDrift(ctx, d.js, subj, since)
		return alerts, err
	}
	rs.Publish = func(ctx context.Context, r fleetwatch.DriftReview) error {
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
		rs.LastReview = func(ctx context.Context) (time.Time, bool, error) { return LastReview(ctx, d.js, subj) }
	}
	reviewer, err := probes.NewReviewer(rs)
	if err != nil {
		return nil, err
	}

	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, s := range subs {
			s.Unsubscribe()
		}
	}
	respond := func(m *nats.Msg, r ControlReply) {
		data, _ := json.Marshal(r)
		if err := m.Respond(data); err != nil {
			d.logf("drift: control reply: %v", err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	sub, err := d.nc.Subscribe(subj.Control(ControlRebaseline), func(m *nats.Msg) {
		var req RebaselineRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			respond(m, ControlReply{Error: "bad request: " + err.Error()})
			return
		}
		a, err := prober.Rebaseline(runCtx, req.Pool, req.Backend, req.By)
		if err != nil {
			respond(m, ControlReply{Error: err.Error()})
			return
		}
		respond(m, ControlReply{OK: true, Alert: &a})
	})
	if err != nil {
		cancel()
		return nil, err
	}
	subs = append(subs, sub)
	sub, err = d.nc.Subscribe(subj.Control(ControlDriftStatus), func(m *nats.Msg) {
		respond(m, ControlReply{OK: true, Statuses: prober.Statuses()})
	})
	if err != nil {
		cancel()
		unsubscribe()
		return nil, err
	}
	subs = append(subs, sub)

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
		len(ps.Targets), cfg.Probes.Schedule, suite.Name, suite.Hash, cfg.Review.Schedule, reviewDir)
	var once sync.Once
	return func() {
		once.Do(func() {
			unsubscribe()
			cancel()
			prober.Close()
			reviewer.Close()
			wg.Wait()
		})
	}, nil
}

// ReadDrift reads FW_DRIFT from since: the alerts, and the review digests.
func ReadDrift(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects, since time.Time) ([]fleetwatch.DriftAlert, []fleetwatch.DriftReview, error) {
	stream, err := js.Stream(ctx, subj.StreamDrift())
	if err != nil {
		return nil, nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj.DriftWildcard()},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return nil, nil, err
	}
	var alerts []fleetwatch.DriftAlert
	var reviews []fleetwatch.DriftReview
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, nil, err
		}
		n := 0
		var last jetstream.Msg
		for m := range batch.Messages() {
			n++
			last = m
			if m.Subject() == subj.DriftReview() {
				var r fleetwatch.DriftReview
				if json.Unmarshal(m.Data(), &r) == nil {
					reviews = append(reviews, r)
				}
				continue
			}
			var a fleetwatch.DriftAlert
			if json.Unmarshal(m.Data(), &a) == nil && a.Backend != "" {
				alerts = append(alerts, a)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, nil, err
		}
		if n == 0 {
			break
		}
		if md, err := last.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	return alerts, reviews, nil
}

// LastReview is when the last review digest in FW_DRIFT was made.
func LastReview(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) (time.Time, bool, error) {
	stream, err := js.Stream(ctx, subj.StreamDrift())
	if err != nil {
		return time.Time{}, false, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, subj.DriftReview())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	var r fleetwatch.DriftReview
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return time.Time{}, false, nil
	}
	return r.At.Time, true, nil
}
