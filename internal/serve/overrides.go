package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/control"
)

// Operator overrides (docs/OPERATIONS.md "Taking a backend out"): an
// operator drains, forces open or closed, or re-weights one backend for a
// while, over HTTP (POST /api/overrides), NATS (Subjects.OverridesSet) or
// `fleetwatch override`. An override is a value in the KV bucket
// Subjects.BucketOverrides under control.Key(pool, backend), so it
// survives restarts and every instance of a deployment sees it: each
// watches the bucket and hands the overrides in force to its analyzer,
// which applies them to what it publishes (analyzer.SetOverrides). Every
// change is published on Subjects.OverridesAudit and kept in the stream
// Subjects.StreamAudit. Without JetStream overrides are refused
// (errOverridesNoJetStream): kept in memory they would be lost on restart
// and unseen by routers' other instances, and an operator should know.

// Errors of override requests.
var (
	// errBadOverride is a malformed override request.
	errBadOverride = errors.New("serve: bad override request")
	// errNoOverride is a clear of a backend without an override.
	errNoOverride = errors.New("serve: no override in force")
	// errUnknownTarget refuses an override of a pool or backend that is
	// neither configured nor in a current snapshot (a typo would
	// otherwise be accepted and drain nothing); control.OverrideRequest.Force
	// sets one anyway, for a backend about to be added.
	errUnknownTarget = errors.New("serve: unknown override target")
	// errOverridesNoJetStream refuses overrides on a server without
	// JetStream.
	errOverridesNoJetStream = errors.New("serve: overrides need JetStream (the fw_overrides KV bucket): this server runs without it")
)

// overrides is the server's view of the bucket.
type overrides struct {
	s  *Server
	kv jetstream.KeyValue // nil without JetStream

	mu      sync.Mutex // guards byKey
	byKey   map[string]storedOverride
	changes *metrics.Counter
}

type storedOverride struct {
	o   analyzer.BackendOverride
	rev uint64
}

func newOverrides(s *Server) *overrides {
	o := &overrides{s: s, byKey: map[string]storedOverride{}}
	o.changes = s.metrics.NewCounter("fleetwatch_override_changes_total")
	s.metrics.NewGauge("fleetwatch_overrides_active", func() float64 {
		return float64(len(o.active(time.Now())))
	})
	return o
}

// open creates (or binds) the bucket and the audit stream.
func (o *overrides) open(ctx context.Context, js jetstream.JetStream) error {
	kv, err := o.ensureAssets(ctx, js)
	if err != nil {
		return err
	}
	o.kv = kv
	return nil
}

// ensure creates the bucket and the audit stream again if the server lost
// them (jsensure.go); the bucket handle in use stays valid.
func (o *overrides) ensure(ctx context.Context) error {
	if o.kv == nil {
		return nil
	}
	_, err := o.ensureAssets(ctx, o.s.js)
	return err
}

func (o *overrides) ensureAssets(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	return control.OpenOverrides(ctx, js, o.s.subj, o.s.cfg.HASettings().Replicas)
}

// watch follows the bucket, handing the overrides in force to the analyzer
// on each change. It returns once the values present are loaded (so the
// first snapshot after a restart carries them); the rest runs on work
// until ctx ends, with the expiry sweep.
func (o *overrides) watch(ctx context.Context, work *sync.WaitGroup) error {
	if o.kv == nil {
		return nil
	}
	w, err := o.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("serve: watching %s: %w", o.s.subj.BucketOverrides(), err)
	}
	loaded := make(chan struct{})
	work.Go(func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				if initial {
					close(loaded)
				}
				return
			case e, ok := <-w.Updates():
				if !ok {
					if initial {
						close(loaded)
					}
					return
				}
				if e == nil { // the values present are delivered
					initial = false
					o.publishToAnalyzer()
					close(loaded)
					continue
				}
				o.update(e)
				if !initial {
					o.publishToAnalyzer()
				}
			}
		}
	})
	work.Go(func() { o.sweep(ctx) })
	select {
	case <-loaded:
	case <-time.After(10 * time.Second):
		o.s.logf("overrides: the bucket's values did not arrive in 10s: starting without them for now")
	}
	return nil
}

// update applies one bucket entry to byKey.
func (o *overrides) update(e jetstream.KeyValueEntry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(o.byKey, e.Key())
		return
	}
	var bo analyzer.BackendOverride
	if err := json.Unmarshal(e.Value(), &bo); err != nil || bo.Validate() != nil {
		o.s.logf("overrides: ignoring the malformed value of %s", e.Key())
		delete(o.byKey, e.Key())
		return
	}
	o.byKey[e.Key()] = storedOverride{o: bo, rev: e.Revision()}
}

// publishToAnalyzer hands the overrides to the analyzer and asks for an
// evaluation, so the change goes out at once.
func (o *overrides) publishToAnalyzer() {
	o.mu.Lock()
	list := make([]analyzer.BackendOverride, 0, len(o.byKey))
	for _, so := range o.byKey {
		list = append(list, so.o)
	}
	o.mu.Unlock()
	o.s.an.SetOverrides(list)
	o.s.signalUrgent()
}

// active returns the overrides in force at now, sorted by pool and backend.
func (o *overrides) active(now time.Time) []analyzer.BackendOverride {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := []analyzer.BackendOverride{}
	for _, so := range o.byKey {
		if so.o.Active(now) {
			out = append(out, so.o)
		}
	}
	slices.SortFunc(out, func(x, y analyzer.BackendOverride) int {
		return cmp.Or(cmp.Compare(x.Pool, y.Pool), cmp.Compare(x.Backend, y.Backend))
	})
	return out
}

// sweep deletes expired overrides from the bucket every second. The delete
// is conditional on the revision seen, so an override set again meanwhile
// stays, and of several instances sweeping only one succeeds and audits.
// The analyzer ignores an expired override already, sweep or not.
func (o *overrides) sweep(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		o.mu.Lock()
		var expired []storedOverride
		for _, so := range o.byKey {
			if !so.o.Active(now) {
				expired = append(expired, so)
			}
		}
		o.mu.Unlock()
		// A delete and its audit entry are one step: a shutdown that comes
		// between them must not leave an expiry that nobody audited (the
		// watch sees the delete at once), so neither follows ctx's end;
		// each is bounded by its own timeout, and Run waits for work.
		step := context.WithoutCancel(ctx)
		for _, so := range expired {
			dctx, cancel := context.WithTimeout(step, 5*time.Second)
			err := o.kv.Delete(dctx, control.Key(so.o.Pool, so.o.Backend), jetstream.LastRevision(so.rev))
			cancel()
			if err == nil {
				ov := so.o.Override
				o.audit(step, control.AuditEntry{At: fleetwatch.At(now), Action: "expire", Pool: so.o.Pool, Backend: so.o.Backend,
					Who: ov.Who, Reason: ov.Reason, Override: &ov, Via: "expiry"})
			}
		}
	}
}

// apply carries out req for who, arrived via "http" or "nats".
func (o *overrides) apply(ctx context.Context, req control.OverrideRequest, who, via string) (control.OverrideReply, error) {
	if req.Action == control.ActionList {
		return control.OverrideReply{Overrides: replyOverrides(o.active(time.Now()))}, nil
	}
	if o.kv == nil {
		return control.OverrideReply{}, errOverridesNoJetStream
	}
	if err := fleetwatch.ValidatePoolID(req.Pool); err != nil {
		return control.OverrideReply{}, fmt.Errorf("%w: pool: %v", errBadOverride, err)
	}
	if err := fleetwatch.ValidateBackendID(req.Backend); err != nil {
		return control.OverrideReply{}, fmt.Errorf("%w: backend: %v", errBadOverride, err)
	}
	if req.Reason == "" {
		return control.OverrideReply{}, fmt.Errorf("%w: reason is required (it goes to the audit)", errBadOverride)
	}
	if who == "" {
		who = "anonymous"
	}
	now := time.Now()
	key := control.Key(req.Pool, req.Backend)
	if req.Action == control.ActionClear {
		e, err := o.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return control.OverrideReply{}, fmt.Errorf("%w on %s/%s", errNoOverride, req.Pool, req.Backend)
		}
		if err != nil {
			return control.OverrideReply{}, fmt.Errorf("serve: overrides: %w", err)
		}
		var old analyzer.BackendOverride
		json.Unmarshal(e.Value(), &old)
		if err := o.kv.Delete(ctx, key); err != nil {
			return control.OverrideReply{}, fmt.Errorf("serve: overrides: %w", err)
		}
		o.changes.Inc()
		o.audit(ctx, control.AuditEntry{At: fleetwatch.At(now), Action: control.ActionClear, Pool: req.Pool, Backend: req.Backend,
			Who: who, Reason: req.Reason, Override: &old.Override, Via: via})
		return control.OverrideReply{Override: replyOverride(old)}, nil
	}
	switch req.Action {
	case control.ActionDrain, control.ActionForceOpen, control.ActionForceClosed, control.ActionWeight:
	default:
		return control.OverrideReply{}, fmt.Errorf("%w: action %q (want drain, force_open, force_closed, weight or clear)", errBadOverride, req.Action)
	}
	d, err := time.ParseDuration(req.For)
	if err != nil || d <= 0 || d > control.MaxOverrideFor {
		return control.OverrideReply{}, fmt.Errorf("%w: for = %q: want a duration above 0 and at most %v, for example \"30m\"", errBadOverride, req.For, control.MaxOverrideFor)
	}
	bo := analyzer.BackendOverride{Pool: req.Pool, Backend: req.Backend, Override: fleetwatch.Override{
		Kind: fleetwatch.OverrideKind(req.Action), Reason: req.Reason, Who: who,
		Until: fleetwatch.At(now.Add(d)), Weight: req.Weight,
	}}
	if err := bo.Validate(); err != nil {
		return control.OverrideReply{}, fmt.Errorf("%w: %v", errBadOverride, err)
	}
	if !req.Force {
		if err := o.checkKnown(ctx, req.Pool, req.Backend, now); err != nil {
			return control.OverrideReply{}, err
		}
	}
	data, _ := json.Marshal(bo)
	if _, err := o.kv.Put(ctx, key, data); err != nil {
		return control.OverrideReply{}, fmt.Errorf("serve: overrides: %w", err)
	}
	o.changes.Inc()
	o.audit(ctx, control.AuditEntry{At: fleetwatch.At(now), Action: req.Action, Pool: req.Pool, Backend: req.Backend,
		Who: who, Reason: req.Reason, Override: &bo.Override, Via: via})
	return control.OverrideReply{Override: replyOverride(bo)}, nil
}

// maxListedTargets bounds the pools or backends an errUnknownTarget names.
const maxListedTargets = 20

// checkKnown reports, as an errUnknownTarget naming what is unknown and
// what is known, a pool or backend that is neither in the configuration
// nor in a current snapshot. The snapshots are this instance's analyzer's
// and the decisions bucket's: with several instances the one answering
// an override need not own the pool, and the bucket holds the current
// snapshot of every pool, whoever publishes it.
func (o *overrides) checkKnown(ctx context.Context, pool, backend string, now time.Time) error {
	poolKnown := false
	backends := map[string]bool{}
	for _, pc := range o.s.config().Pools {
		if pc.ID == pool {
			poolKnown = true
			for _, b := range pc.Backends {
				backends[b.ID] = true
			}
		}
	}
	addSnapshot := func(snap fleetwatch.Snapshot) {
		poolKnown = true
		for _, b := range snap.Backends {
			backends[b.Backend] = true
		}
	}
	if !backends[backend] {
		if snap, ok := o.s.an.Snapshot(pool, now); ok {
			addSnapshot(snap)
		}
	}
	kv := o.decisions(ctx)
	fromBucket := func() {
		if e, err := kv.Get(ctx, pool); err == nil {
			var snap fleetwatch.Snapshot
			if json.Unmarshal(e.Value(), &snap) == nil {
				addSnapshot(snap)
			}
		}
	}
	if !backends[backend] && kv != nil {
		fromBucket()
	}
	var known []string
	if !backends[backend] && !poolKnown {
		known = o.knownPools(ctx, kv, now)
		if kv != nil && slices.Contains(known, pool) {
			// The pool's first snapshot reached the bucket between the
			// read above and the listing: read it again rather than
			// refuse a pool the error would list as known.
			fromBucket()
		}
	}
	switch {
	case backends[backend]:
		return nil
	case !poolKnown:
		return fmt.Errorf("%w: pool %q is neither configured nor in a current snapshot (known pools: %s); set force for a planned one",
			errUnknownTarget, pool, listed(known))
	}
	return fmt.Errorf("%w: backend %q of pool %q is neither configured nor in a current snapshot (known backends of %s: %s); set force for a planned one",
		errUnknownTarget, backend, pool, pool, listed(slices.Sorted(maps.Keys(backends))))
}

// decisions binds the decisions bucket (nil when it cannot be bound: no
// JetStream, or no snapshot published yet).
func (o *overrides) decisions(ctx context.Context) jetstream.KeyValue {
	if o.s.js == nil {
		return nil
	}
	kv, err := o.s.js.KeyValue(ctx, o.s.subj.BucketDecisions())
	if err != nil {
		return nil
	}
	return kv
}

// knownPools lists the configured pools, this analyzer's and the
// decisions bucket's, sorted.
func (o *overrides) knownPools(ctx context.Context, kv jetstream.KeyValue, now time.Time) []string {
	pools := map[string]bool{}
	for _, pc := range o.s.config().Pools {
		pools[pc.ID] = true
	}
	for _, snap := range o.s.an.Snapshots(now) {
		pools[snap.Pool] = true
	}
	if kv != nil {
		if keys, err := kv.ListKeys(ctx); err == nil {
			for k := range keys.Keys() {
				pools[k] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(pools))
}

// listed joins ids for an error message, at most maxListedTargets of them.
func listed(ids []string) string {
	switch {
	case len(ids) == 0:
		return "none"
	case len(ids) > maxListedTargets:
		return fmt.Sprintf("%s and %d more", strings.Join(ids[:maxListedTargets], ", "), len(ids)-maxListedTargets)
	}
	return strings.Join(ids, ", ")
}

// audit publishes e on the audit subject, into FW_AUDIT; a failure is
// logged (the change itself is made).
func (o *overrides) audit(ctx context.Context, e control.AuditEntry) {
	data, _ := json.Marshal(e)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := o.s.js.Publish(actx, o.s.subj.OverridesAudit(), data); err != nil {
		o.s.logf("overrides: audit of %s %s/%s not stored: %v", e.Action, e.Pool, e.Backend, err)
	}
	o.s.logf("override %s %s/%s by %s: %s", e.Action, e.Pool, e.Backend, e.Who, e.Reason)
}

// subscribe answers requests on Subjects.OverridesSet, in a queue group so
// one instance of a deployment answers each.
func (o *overrides) subscribe(ctx context.Context) (*nats.Subscription, error) {
	return o.s.nc.QueueSubscribe(o.s.subj.OverridesSet(), fleetwatch.QueueOverrides, func(m *nats.Msg) {
		var req control.OverrideRequest
		var reply control.OverrideReply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply.Error = fmt.Sprintf("%v: %v", errBadOverride, err)
		} else {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			r, err := o.apply(rctx, req, req.Who, "nats")
			cancel()
			if reply = r; err != nil {
				reply.Error = err.Error()
			}
		}
		data, _ := json.Marshal(reply)
		m.Respond(data)
	})
}

// handleOverrides serves GET and POST /api/overrides.
func (o *overrides) handleGet(w http.ResponseWriter, _ *http.Request) {
	writeOverrideReply(w, http.StatusOK, control.OverrideReply{Overrides: replyOverrides(o.active(time.Now()))})
}

func (o *overrides) handlePost(w http.ResponseWriter, r *http.Request) {
	var req control.OverrideRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeOverrideReply(w, http.StatusBadRequest, control.OverrideReply{Error: fmt.Sprintf("%v: %v", errBadOverride, err)})
		return
	}
	who := req.Who
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		who = user // the authenticated identity is recorded
	}
	reply, err := o.apply(r.Context(), req, who, "http")
	code := http.StatusOK
	switch {
	case err == nil:
	case errors.Is(err, errBadOverride):
		code = http.StatusBadRequest
	case errors.Is(err, errNoOverride), errors.Is(err, errUnknownTarget):
		code = http.StatusNotFound
	case errors.Is(err, errOverridesNoJetStream):
		code = http.StatusServiceUnavailable
	default:
		code = http.StatusBadGateway
	}
	if err != nil {
		reply.Error = err.Error()
	}
	writeOverrideReply(w, code, reply)
}

func writeOverrideReply(w http.ResponseWriter, code int, reply control.OverrideReply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(reply)
}

// replyOverride is o as a reply names it.
func replyOverride(o analyzer.BackendOverride) *control.BackendOverride {
	c := control.BackendOverride(o)
	return &c
}

// replyOverrides is bs as a reply lists them.
func replyOverrides(bs []analyzer.BackendOverride) []control.BackendOverride {
	out := make([]control.BackendOverride, len(bs))
	for i, o := range bs {
		out[i] = control.BackendOverride(o)
	}
	return out
}
