package serve

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch/internal/control"
)

// NATS restarts and JetStream elections (DECISIONS.md "NATS restarts and
// elections").
//
// Every JetStream resource serve relies on (the lease bucket, the decisions
// bucket, FW_OUTCOMES and the durable intake, the overrides bucket and its
// audit stream, the drift buckets and stream) is ensured at start and again
// after every reconnect, and whenever an operation gets no answer from a
// stream (the server may have come back without it). Ensuring is
// idempotent: a resource that exists is bound as it is.
//
// The lease bucket (internal/ha's JetStreamStore) is file storage, like
// the others, so that a restart of the server keeps its revisions; should
// it be lost anyway (a server that came back with an empty store, an
// operator who deleted it), it is created again with its first sequence
// above every fence used before (see leaseFloor), so that a new owner's
// fence is still higher than any fence a router has seen and the fences
// keep deciding.

// kickEnsure asks the ensure loop to check the JetStream resources now (a
// reconnect, or an operation that got no answer from a stream).
func (s *Server) kickEnsure() {
	select {
	case s.ensure <- struct{}{}:
	default:
	}
}

// startWait bounds how long serve's start waits for a NATS server that does
// not answer yet, or a JetStream cluster that cannot place its resources
// yet (still forming, or electing its meta leader): past it the start
// fails with the last error.
const startWait = 30 * time.Second

// askJetStream decides whether serve runs with JetStream: with it when the
// server answers an account request, without it when the server says it
// has none (or refuses the request). A server that gives no answer (serve
// started before NATS, whose connection nats.go keeps trying; a cluster
// electing its meta leader) is asked again for up to startWait, and then
// the start fails: deciding "no JetStream" because NATS came up a few
// seconds late would run the process without capture, KV and high
// availability for its whole life, and /healthz would still say ok.
func (s *Server) askJetStream(url string) error {
	err := s.untilPlaced("asking "+redactURLs(url)+" for JetStream", 5*time.Second, func(ctx context.Context) error {
		_, err := s.js.AccountInfo(ctx)
		return err
	})
	switch {
	case err == nil:
		return nil
	case transientJS(err):
		return fmt.Errorf("serve: NATS at %s gave no JetStream answer for %v (last: %w): start NATS first, or set nats.no_jetstream: true to run without JetStream", redactURLs(url), startWait, err)
	}
	s.logf("JetStream not available (%v): running without replay, KV and drift stream", err)
	s.js = nil
	return nil
}

// redactURLs hides the passwords of a comma-separated list of server URLs.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		if u, err := neturl.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// untilPlaced runs do, a step serve's start needs from JetStream, each
// attempt bounded by timeout, and runs it again a second later while it
// fails the way a server not up yet or a forming cluster fails
// (transientJS), for at most startWait from the first attempt. It returns
// the last error. A cluster and its serve started together (a whole
// deployment coming up) must not leave serve exited because its lease
// bucket found two peers of three.
func (s *Server) untilPlaced(what string, timeout time.Duration, do func(context.Context) error) error {
	deadline := time.Now().Add(startWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := do(ctx)
		cancel()
		if err == nil || !transientJS(err) || time.Now().Add(time.Second).After(deadline) {
			return err
		}
		s.logf("jetstream: %s: %v (not ready: trying again in 1s, for up to %v from the start)", what, err, startWait)
		time.Sleep(time.Second)
	}
}

// transientJS reports whether err is what a JetStream cluster answers while
// it forms or elects a leader: no suitable peers for placement (fewer
// peers known than the replicas asked), the system temporarily
// unavailable, no responder or no answer.
func transientJS(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case jsNoSuitablePeers, jsClusterNotAvailable:
			return true
		}
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// The JetStream API's error codes for a cluster not ready (nats-server's
// errors.json: JSClusterNoPeersErrF and JSClusterNotAvailErr).
const (
	jsNoSuitablePeers     jetstream.ErrorCode = 10005
	jsClusterNotAvailable jetstream.ErrorCode = 10008
)

// ensureEvery bounds how often the ensure loop checks the resources.
const ensureEvery = time.Second

// ensureLoop re-ensures every JetStream resource when kicked (a reconnect,
// an operation that got no answer from a stream), at most once a second,
// until ctx ends.
func (s *Server) ensureLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.ensure:
		}
		if wait := ensureEvery - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		if !s.nc.IsConnected() {
			continue // the reconnect kicks again
		}
		s.ensureJetStream(ctx)
	}
}

// ensureJetStream ensures each resource, logging (not failing on) those it
// cannot: the next kick tries again.
func (s *Server) ensureJetStream(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		{"lease bucket", s.leases.EnsureStore},
		{"decisions bucket", s.pub.Ensure},
		{"outcome streams", s.col.Ensure},
		{"overrides", s.ovr.ensure},
		{"drift state", s.ensureDrift},
	}
	failed := false
	for _, step := range steps {
		if err := step.do(c); err != nil {
			failed = true
			s.m.ensureErrors.Inc()
			s.logf("jetstream: ensuring the %s: %v (tried again on the next reconnect or missing answer)", step.what, err)
		}
	}
	if failed {
		s.kickEnsure() // after ensureEvery
	}
}

// ensureDrift creates the drift buckets and stream again when the probes
// run with JetStream (the handles the prober holds stay valid).
func (s *Server) ensureDrift(ctx context.Context) error {
	s.mu.Lock()
	running := s.drift != nil
	s.mu.Unlock()
	if !running || s.js == nil {
		return nil
	}
	if _, err := control.OpenBaselines(ctx, s.js, s.subj); err != nil {
		return fmt.Errorf("baselines bucket: %w", err)
	}
	if _, err := control.OpenDriftStates(ctx, s.js, s.subj); err != nil {
		return fmt.Errorf("drift state bucket: %w", err)
	}
	if _, err := control.EnsureDriftStream(ctx, s.js, s.subj); err != nil {
		return fmt.Errorf("drift stream: %w", err)
	}
	return nil
}
