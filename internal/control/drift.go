package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// This file is the drift control requests that serve's probes answer and
// their client side, with the FW_DRIFT stream: what `fleetwatch drift
// review|status|rebaseline` do, with or without a running serve.

// Control verbs the probes of serve answer (on Subjects.Control(verb)).
const (
	VerbRebaseline  = "rebaseline"
	VerbDriftStatus = "drift-status"
)

// RebaselineRequest is the payload of a re-baseline request.
type RebaselineRequest struct {
	Pool    string `json:"pool"`
	Backend string `json:"backend"`
	By      string `json:"by"`
}

// Reply answers a control request.
type Reply struct {
	OK       bool                   `json:"ok"`
	Error    string                 `json:"error,omitempty"`
	Alert    *fleetwatch.DriftAlert `json:"alert,omitempty"`
	Statuses []probes.BackendStatus `json:"statuses,omitempty"`
}

// RequestTimeout bounds a control request to serve's probes.
const RequestTimeout = 5 * time.Second

// DefaultReviewSpan is how far back a review reaches when there is no
// earlier review digest and no span is asked for.
const DefaultReviewSpan = 7 * 24 * time.Hour

// driftStreamErr explains a missing FW_DRIFT; op names the operation.
func driftStreamErr(op string, subj fleetwatch.Subjects, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%s: no stream %s yet (it is created by serve with JetStream): %w", op, subj.StreamDrift(), err)
	}
	return fmt.Errorf("%s: %s: %w", op, subj.StreamDrift(), err)
}

// AskStatuses asks serve's probes for every backend's drift state; it
// returns nil and no error when no serve answers.
func AskStatuses(nc *nats.Conn, subj fleetwatch.Subjects) ([]probes.BackendStatus, error) {
	m, err := nc.Request(subj.Control(VerbDriftStatus), nil, RequestTimeout)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("drift status reply: %w", err)
	}
	if !r.OK {
		return nil, errors.New(r.Error)
	}
	if r.Statuses == nil {
		r.Statuses = []probes.BackendStatus{}
	}
	return r.Statuses, nil
}

// Review builds the drift review digest at now from the alerts in FW_DRIFT
// and the statuses of a running serve (none when no serve answers). It
// covers since back from now; if since is zero, from the last review
// digest, or DefaultReviewSpan when there is none.
func Review(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj fleetwatch.Subjects, now time.Time, since time.Duration) (fleetwatch.DriftReview, []probes.BackendStatus, error) {
	from := now.Add(-DefaultReviewSpan)
	if since > 0 {
		from = now.Add(-since)
	} else if t, ok, err := LastReview(ctx, js, subj); err != nil {
		return fleetwatch.DriftReview{}, nil, driftStreamErr("drift review", subj, err)
	} else if ok {
		from = t
	}
	alerts, _, err := ReadDrift(ctx, js, subj, from)
	if err != nil {
		return fleetwatch.DriftReview{}, nil, driftStreamErr("drift review", subj, err)
	}
	statuses, err := AskStatuses(nc, subj)
	if err != nil {
		return fleetwatch.DriftReview{}, nil, err
	}
	return probes.BuildReview(now, from, alerts, statuses), statuses, nil
}

// DriftStatuses returns every backend's drift state and where it comes
// from: a running serve's probes; when no serve answers, the drift states
// the last serve stored in the bucket fw_drift (the same statuses, CUSUM,
// cooldown, quarantine and last alert a restarted serve starts from); and
// without that bucket, the latest alert of each backend in FW_DRIFT.
// Sorted by pool and backend when not from serve.
func DriftStatuses(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj fleetwatch.Subjects, now time.Time) (statuses []probes.BackendStatus, source string, err error) {
	statuses, err = AskStatuses(nc, subj)
	if err != nil {
		return nil, "", err
	}
	if statuses != nil {
		return statuses, "serve", nil
	}
	if statuses, err = storedStatuses(ctx, js, subj); err != nil {
		return nil, "", err
	}
	if len(statuses) > 0 {
		return statuses, BucketDriftState(subj) + " (no running serve answered)", nil
	}
	alerts, _, err := ReadDrift(ctx, js, subj, now.Add(-DriftRetention))
	if err != nil {
		return nil, "", driftStreamErr("drift status", subj, err)
	}
	latest := map[[2]string]fleetwatch.DriftAlert{}
	for _, a := range alerts {
		latest[[2]string{a.Pool, a.Backend}] = a
	}
	for _, a := range latest {
		statuses = append(statuses, probes.BackendStatus{Pool: a.Pool, Backend: a.Backend, Status: a.Status, Since: a.At.Time,
			Score: a.Score, Threshold: a.Threshold})
	}
	slices.SortFunc(statuses, func(a, b probes.BackendStatus) int {
		return strings.Compare(a.Pool+"\x00"+a.Backend, b.Pool+"\x00"+b.Backend)
	})
	return statuses, subj.StreamDrift() + " (no running serve answered)", nil
}

// storedStatuses reads the drift states in the bucket fw_drift; none
// without the bucket.
func storedStatuses(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects) ([]probes.BackendStatus, error) {
	kv, err := js.KeyValue(ctx, BucketDriftState(subj))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("drift status: %s: %w", BucketDriftState(subj), err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("drift status: %s: %w", BucketDriftState(subj), err)
	}
	var out []probes.BackendStatus
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil || len(e.Value()) == 0 {
			continue // deleted, or cleared by a re-baseline
		}
		st, err := drift.UnmarshalState(e.Value())
		if err != nil {
			continue
		}
		out = append(out, probes.StoredStatus(st))
	}
	slices.SortFunc(out, func(a, b probes.BackendStatus) int {
		return strings.Compare(a.Pool+"\x00"+a.Backend, b.Pool+"\x00"+b.Backend)
	})
	return out, nil
}

// WriteDriftStatus writes statuses as a table under a line naming their
// source, then a line per backend with a probe budget or probe spend. A
// status whose last cycle skipped tiers for the budget says so beside
// itself ("ok (sampled tier skipped by the probe budget)").
func WriteDriftStatus(w io.Writer, source string, statuses []probes.BackendStatus) error {
	fmt.Fprintf(w, "drift status from %s\n", source)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tBACKEND\tSTATUS\tSINCE\tSCORE/THRESHOLD\tBASELINE\tLAST ERROR\tQUARANTINED")
	for _, s := range statuses {
		since := "-"
		if !s.Since.IsZero() {
			since = fleetwatch.FormatTime(s.Since)
		}
		base := "-"
		switch {
		case s.Enrolling:
			base = fmt.Sprintf("enrolling (%d cycles)", s.EnrolCycles)
		case s.BaselineCycles > 0:
			base = fmt.Sprintf("%d cycles, %s", s.BaselineCycles, fleetwatch.FormatTime(s.BaselineCreated))
		}
		lastErr := "-"
		if s.LastError != "" {
			lastErr = s.LastErrorKind + ": " + s.LastError
		}
		quarantined := "-"
		if s.Quarantined {
			quarantined = "yes (weight 0)"
		}
		status := string(s.Status)
		if note := s.Budget.SkipNote(); note != "" {
			status += " (" + note + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3g/%.3g\t%s\t%s\t%s\n", s.Pool, s.Backend, status, since, s.Score, s.Threshold, base, lastErr, quarantined)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeBudgets(w, statuses)
}

// writeBudgets writes a line per backend with a probe budget or a spend
// in the last 24 hours.
func writeBudgets(w io.Writer, statuses []probes.BackendStatus) error {
	var lines []string
	for _, s := range statuses {
		if b := s.Budget; b != nil && (b.TokensPerDay > 0 || b.SpentTotal > 0) {
			lines = append(lines, s.Pool+"/"+s.Backend+": "+BudgetLine(b))
		}
	}
	if len(lines) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "probe budget (last 24 h):\n  %s\n", strings.Join(lines, "\n  "))
	return err
}

// BudgetLine is a probe budget in words: the spend of the last 24 hours
// against the budget, by tier, in money where the price is known, and the
// tiers skipped.
func BudgetLine(b *probes.BudgetStatus) string {
	var sb strings.Builder
	if b.TokensPerDay > 0 {
		fmt.Fprintf(&sb, "%d of %d tokens", b.SpentTotal, b.TokensPerDay)
	} else {
		fmt.Fprintf(&sb, "%d tokens (no budget)", b.SpentTotal)
	}
	var parts []string
	for _, tier := range []string{probes.TierTeacher, probes.TierSampled, probes.TierTools} {
		if n := b.Spent[tier]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", probes.TierName(tier), n))
		}
	}
	if len(parts) > 0 {
		sb.WriteString(" (" + strings.Join(parts, ", ") + ")")
	}
	if b.CostTotal != nil {
		fmt.Fprintf(&sb, ", cost %.4g at %g per Mtok", *b.CostTotal, *b.CostPerMTok)
	}
	if b.TokensPerDay > 0 {
		fmt.Fprintf(&sb, "; %.0f tokens available", max(b.Available, 0))
	}
	if note := b.SkipNote(); note != "" {
		sb.WriteString("; last cycle: " + note)
	}
	var skips []string
	for _, tier := range []string{probes.TierTeacher, probes.TierSampled, probes.TierTools} {
		if n := b.SkippedTotal[tier]; n > 0 {
			skips = append(skips, fmt.Sprintf("%s %d", probes.TierName(tier), n))
		}
	}
	if len(skips) > 0 {
		sb.WriteString("; skipped so far: " + strings.Join(skips, ", "))
	}
	return sb.String()
}

// Rebaseline asks a running serve to drop a backend's baseline and enrol
// it again; it returns the re-baseline alert and whether serve did it.
// When no serve answers, it clears the stored baseline itself and records
// a re-baseline alert (of the suite named suite, see drift.LoadSuite) in
// FW_DRIFT.
func Rebaseline(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj fleetwatch.Subjects, req RebaselineRequest, suite string, now time.Time) (alert fleetwatch.DriftAlert, byServe bool, err error) {
	data, _ := json.Marshal(req)
	m, err := nc.Request(subj.Control(VerbRebaseline), data, RequestTimeout)
	switch {
	case err == nil:
		var r Reply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return fleetwatch.DriftAlert{}, false, fmt.Errorf("drift rebaseline reply: %w", err)
		}
		if !r.OK {
			return fleetwatch.DriftAlert{}, false, fmt.Errorf("drift rebaseline: %s", r.Error)
		}
		if r.Alert != nil {
			alert = *r.Alert
		}
		return alert, true, nil
	case errors.Is(err, nats.ErrNoResponders):
		// no serve running: clear the stored baseline and record it here
		kv, err := OpenBaselines(ctx, js, subj)
		if err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		if err := (KVBaselines{KV: kv}).Save(ctx, req.Pool, req.Backend, nil); err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		// the drift state belonged to the dropped baseline
		skv, err := OpenDriftStates(ctx, js, subj)
		if err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		if err := (KVStates{KV: skv}).Save(ctx, req.Pool, req.Backend, nil); err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		if _, err := EnsureDriftStream(ctx, js, subj); err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		s, err := drift.LoadSuite(suite)
		if err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		a := probes.RebaselineAlert(req.Pool, req.Backend, s, fleetwatch.DriftUnknown, req.By, now)
		data, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, subj.Drift(req.Pool), data); err != nil {
			return fleetwatch.DriftAlert{}, false, err
		}
		return a, false, nil
	default:
		return fleetwatch.DriftAlert{}, false, fmt.Errorf("drift rebaseline: %w", err)
	}
}
