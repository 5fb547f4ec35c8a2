package serve

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/collector"
)

// Health: /healthz answers 200 only while this instance does its part:
// connected to NATS, and with JetStream either publishing every pool of
// the partitions it holds or a standby beside instances that hold them.
// fleetwatch_pool_publish_age_seconds says, per pool it decides, how long
// ago its last snapshot went out. While it does its part but its ingest
// would lose events that the configuration says are kept (the capture
// cannot be created), it answers 200 with "status":"degraded" and the
// reason: readiness is about deciding and publishing, which it does, and
// the cause is in JetStream, shared by every instance, so a 503 would
// take them all out of a load balancer at once (DECISIONS.md "No silent
// loss").

// publishStaleAfter is how old a held pool's last publish may be before
// /healthz says serve is not publishing: three heartbeats, at least 3 s.
func (s *Server) publishStaleAfter() time.Duration {
	hb := s.cfg.AnalyzerSettings(s.seed).Settings.WithDefaults().Heartbeat
	return max(3*hb, 3*time.Second)
}

// publishTimes are when each pool's last snapshot was published.
type publishTimes struct {
	mu   sync.Mutex // guards last
	last map[string]time.Time
}

// notePublished records when pools were last sent on their subjects.
func (s *Server) notePublished(pools []string, at time.Time) {
	if len(pools) == 0 {
		return
	}
	s.published.mu.Lock()
	defer s.published.mu.Unlock()
	if s.published.last == nil {
		s.published.last = map[string]time.Time{}
	}
	for _, p := range pools {
		s.published.last[p] = at
	}
}

// publishAges returns, per pool this instance holds, how long ago its last
// snapshot was published, sorted by pool; pools it no longer holds are
// forgotten.
func (s *Server) publishAges(now time.Time) (pools []string, ages []time.Duration) {
	s.published.mu.Lock()
	defer s.published.mu.Unlock()
	for p := range s.published.last {
		if _, _, held := s.leases.Owns(p, now); !held {
			delete(s.published.last, p)
			continue
		}
		pools = append(pools, p)
	}
	slices.Sort(pools)
	for _, p := range pools {
		ages = append(ages, now.Sub(s.published.last[p]))
	}
	return pools, ages
}

func (s *Server) registerHealthMetrics() {
	s.metrics.RegisterMetricsWriter(func(w io.Writer) {
		pools, ages := s.publishAges(time.Now())
		for i, p := range pools {
			metrics.WriteGaugeFloat64(w, fmt.Sprintf(`fleetwatch_pool_publish_age_seconds{pool=%q}`, p), ages[i].Seconds())
		}
	})
}

// health is /healthz's answer: the HTTP code, a one-line status and the
// details that explain it.
func (s *Server) health(now time.Time) (int, map[string]any) {
	connected := s.nc != nil && s.nc.IsConnected()
	body := map[string]any{"nats": connected, "jetstream": s.js != nil}
	ingest, degraded := s.ingestHealth()
	body["ingest"] = ingest
	fail := func(why string) (int, map[string]any) {
		body["status"] = why
		return http.StatusServiceUnavailable, body
	}
	if !connected {
		return fail("nats disconnected")
	}
	if !s.leases.Standalone() {
		held, instances, lastAnswer := s.leases.Summary()
		body["partitions_owned"] = held
		body["instances"] = instances
		if held == 0 && instances <= 1 {
			if lastAnswer.IsZero() || now.Sub(lastAnswer) > s.leases.TTL() {
				return fail(fmt.Sprintf("no partition lease: JetStream has not answered a lease request for %v", sinceOr(now, lastAnswer)))
			}
			return fail("no partition lease held and no other instance alive")
		}
		if held == 0 {
			body["role"] = "standby"
		}
	}
	pools, ages := s.publishAges(now)
	limit := s.publishStaleAfter()
	var stale []string
	for i, p := range pools {
		if ages[i] > limit {
			stale = append(stale, fmt.Sprintf("%s (%.1fs)", p, ages[i].Seconds()))
		}
	}
	if len(stale) > 0 {
		body["stale_pools"] = stale
		return fail(fmt.Sprintf("not publishing: %d pools without a snapshot for more than %v", len(stale), limit))
	}
	if degraded != "" {
		body["status"] = "degraded"
		body["reason"] = degraded
		return http.StatusOK, body
	}
	body["status"] = "ok"
	return http.StatusOK, body
}

func sinceOr(now, t time.Time) string {
	if t.IsZero() {
		return "ever"
	}
	return now.Sub(t).Round(100 * time.Millisecond).String()
}

// ingestHealth is the ingest part of /healthz (ingestHealthOf).
func (s *Server) ingestHealth() (ingest map[string]any, degraded string) {
	return ingestHealthOf(s.col.Stats(), s.subj)
}

// ingestHealthOf is the ingest part of /healthz: how events reach the
// collectors, what was lost on the way where that can be counted, and
// what is lost uncounted. degraded, when not empty, is why events that
// the configuration says are kept would be lost now.
func ingestHealthOf(st collector.Stats, subj fleetwatch.Subjects) (ingest map[string]any, degraded string) {
	m := map[string]any{
		"mode":           "core",
		"dropped":        st.Dropped,
		"publish_errors": st.StreamPublishErrors,
	}
	if st.CaptureWanted || st.CaptureReplayed > 0 {
		// Also what a takeover of a leftover capture replayed.
		m["capture_replayed"] = st.CaptureReplayed
		m["capture_unreplayed"] = st.CaptureUnreplayed
		m["capture_deduplicated"] = st.CaptureDeduplicated
	}
	if st.CatchUpErr != nil {
		m["catch_up_error"] = st.CatchUpErr.Error()
	}
	switch {
	case st.Intake:
		m["mode"] = "durable intake"
		m["intake_lost"] = st.IntakeLost
		m["loss"] = "events published while no serve runs are kept in " + subj.StreamIntake() + " up to its bounds; what the bounds discard is counted in intake_lost"
	case st.Capture:
		m["mode"] = "core + capture"
		m["capture_uncovered_seconds"] = st.CaptureUncoveredSeconds
		m["loss"] = "events published while no serve runs are kept in " + subj.StreamCapture() + " up to its bounds and replayed at start; a period the bounds discarded is counted in capture_uncovered_seconds, and what a catch-up that ended early did not replay in capture_unreplayed"
	case st.CaptureWanted:
		m["mode"] = "core, capture missing"
		why := "not created yet"
		if st.CaptureErr != nil {
			why = st.CaptureErr.Error()
		}
		m["capture_error"] = why
		m["loss"] = subj.StreamCapture() + " is missing (capture_error) and tried again until it exists: meanwhile events published while no serve runs are lost, uncounted"
		degraded = "ingest: " + subj.StreamCapture() + " is missing, so events published while no serve runs would be lost, uncounted: " + why
	case st.JetStream:
		m["loss"] = "ingest.durable is false: events published while no serve runs are lost, uncounted"
	default:
		m["loss"] = "no JetStream: events published while no serve runs are lost, uncounted"
	}
	return m, degraded
}
