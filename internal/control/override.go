package control

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
)

// Operator overrides (docs/OPERATIONS.md "Taking a backend out"): the
// requests and replies of POST /api/overrides and Subjects.OverridesSet,
// the audit entries on Subjects.OverridesAudit, and the bucket and stream
// that keep them. serve applies the requests; `fleetwatch override` sends
// them.

// Override actions: the four kinds, and clear.
const (
	ActionDrain       = string(fleetwatch.OverrideDrain)
	ActionForceOpen   = string(fleetwatch.OverrideForceOpen)
	ActionForceClosed = string(fleetwatch.OverrideForceClosed)
	ActionWeight      = string(fleetwatch.OverrideWeight)
	ActionClear       = "clear"
	// ActionList answers the overrides in force (NATS only; HTTP has GET).
	ActionList = "list"
)

// MaxOverrideFor is the longest an override may last: an override is an
// incident tool, and one forgotten must end on its own.
const MaxOverrideFor = 7 * 24 * time.Hour

// AuditRetention is how long FW_AUDIT keeps override changes.
const AuditRetention = 90 * 24 * time.Hour

// OverrideRequest is the body of POST /api/overrides and of a request on
// Subjects.OverridesSet.
type OverrideRequest struct {
	// Action is "drain", "force_open", "force_closed", "weight" or
	// "clear" ("list" too on NATS).
	Action  string `json:"action"`
	Pool    string `json:"pool"`
	Backend string `json:"backend"`
	// Reason says why, for the audit; required.
	Reason string `json:"reason"`
	// For is how long the override lasts, a Go duration ("30m"), at
	// most MaxOverrideFor; required but for clear.
	For string `json:"for,omitempty"`
	// Weight is the weight of a "weight" override, in [0, 1].
	Weight *float64 `json:"weight,omitempty"`
	// Who names the operator. Over HTTP with basic authentication the
	// authenticated user is recorded instead.
	Who string `json:"who,omitempty"`
	// Force sets the override even when the pool or backend is neither
	// configured nor in a current snapshot (a planned backend, before its
	// first event). Without it such a request is refused
	// (an unknown override target). Clear never needs it.
	Force bool `json:"force,omitempty"`
}

// OverrideReply is the answer to an override request.
type OverrideReply struct {
	Error string `json:"error,omitempty"`
	// Override is what was set, or what a clear removed.
	Override *BackendOverride `json:"override,omitempty"`
	// Overrides are the overrides in force (GET and list).
	Overrides []BackendOverride `json:"overrides,omitempty"`
}

// AuditEntry is one override change on Subjects.OverridesAudit.
type AuditEntry struct {
	At      fleetwatch.Time `json:"at"`
	Action  string          `json:"action"` // an Action*, or "expire"
	Pool    string          `json:"pool"`
	Backend string          `json:"backend"`
	Who     string          `json:"who"`
	Reason  string          `json:"reason"`
	// Override is the override set, or the one cleared or expired.
	Override *fleetwatch.Override `json:"override,omitempty"`
	Via      string               `json:"via"` // "http", "nats" or "expiry"
}

// BackendOverride is an override of one backend as a reply names it: the
// JSON of analyzer.BackendOverride (serve converts one into the other).
type BackendOverride struct {
	Pool    string `json:"pool"`
	Backend string `json:"backend"`
	fleetwatch.Override
}

// OpenOverrides creates or opens the overrides bucket (the latest value per
// key, under Key(pool, backend)) and the audit stream FW_AUDIT, both with
// replicas copies.
func OpenOverrides(ctx context.Context, js jetstream.JetStream, subj fleetwatch.Subjects, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      subj.BucketOverrides(),
		Description: "fleetwatch operator overrides in force, per pool and backend",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("serve: overrides bucket %s: %w", subj.BucketOverrides(), err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        subj.StreamAudit(),
		Description: "fleetwatch operator override changes (who, what, when, why)",
		Subjects:    []string{subj.OverridesAudit()},
		MaxAge:      AuditRetention,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}); err != nil {
		return nil, fmt.Errorf("serve: audit stream %s: %w", subj.StreamAudit(), err)
	}
	return kv, nil
}

// WriteOverrides writes the overrides in force, one a line (`fleetwatch
// override list`).
func WriteOverrides(w io.Writer, overrides []BackendOverride) error {
	var b strings.Builder
	for _, o := range overrides {
		weight := ""
		if o.Weight != nil {
			weight = fmt.Sprintf(" %.4g", *o.Weight)
		}
		fmt.Fprintf(&b, "%s / %s: %s%s until %s by %s: %s\n", o.Pool, o.Backend, o.Kind, weight, o.Until.Format(time.RFC3339), o.Who, o.Reason)
	}
	if len(overrides) == 0 {
		b.WriteString("no override in force\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteOverrideDone writes what an override request of action did to o:
// what was set, or what a clear removed (`fleetwatch override ACTION`).
func WriteOverrideDone(w io.Writer, action string, o *BackendOverride) error {
	var err error
	if action == ActionClear {
		_, err = fmt.Fprintf(w, "cleared %s on %s / %s\n", o.Kind, o.Pool, o.Backend)
	} else {
		_, err = fmt.Fprintf(w, "%s %s / %s until %s\n", o.Kind, o.Pool, o.Backend, o.Until.Format(time.RFC3339))
	}
	return err
}
