package fleetwatch

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// ProtocolVersion is the wire protocol version this package speaks. Payloads
// carry it in their "v" field.
const ProtocolVersion = 1

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "fw"

// QueueCollectors is the NATS queue group collectors subscribe in, so that
// several collectors share the outcome stream instead of each seeing all of it.
const QueueCollectors = "fw-collectors"

// MaxIDLen is the maximum length in bytes of a pool or backend id.
const MaxIDLen = 256

// Subjects names every NATS subject, stream and bucket of one deployment. The
// zero value uses DefaultPrefix.
//
// With the default prefix the JetStream names are exactly those of the
// protocol (FW_OUTCOMES, FW_DRIFT, fw_decisions, fw_probe_baselines). With
// another prefix they are derived from it (prefix "acme.fw" gives
// ACME_FW_OUTCOMES and acme_fw_decisions), so that two deployments with
// different prefixes can share one NATS account without sharing state.
type Subjects struct {
	// Prefix is the first subject token(s). If empty, DefaultPrefix is used.
	Prefix string
}

// ValidatePrefix reports whether p can be used as a subject prefix: one or
// more dot-separated tokens of letters, digits, '-' and '_'.
func ValidatePrefix(p string) error {
	if p == "" {
		return errors.New("fleetwatch: prefix is empty")
	}
	for _, tok := range strings.Split(p, ".") {
		if tok == "" {
			return fmt.Errorf("fleetwatch: prefix %q has an empty token", p)
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("fleetwatch: prefix %q: character %q not allowed", p, c)
			}
		}
	}
	return nil
}

func (s Subjects) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Outcomes is the subject a proxy publishes outcome events on ("fw.outcomes").
func (s Subjects) Outcomes() string { return s.prefix() + ".outcomes" }

// OutcomesWildcard matches the per-publisher outcome subjects ("fw.outcomes.>").
func (s Subjects) OutcomesWildcard() string { return s.prefix() + ".outcomes.>" }

// OutcomesFrom is the per-publisher outcome subject of the publisher named
// source ("fw.outcomes.<source>"), which OutcomesWildcard matches: the
// characters a subject token cannot hold ('.', '*', '>' and white space)
// become '_', and an empty source is "_", so any name makes one token.
func (s Subjects) OutcomesFrom(source string) string {
	if source == "" {
		source = "_"
	}
	return s.Outcomes() + "." + strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, source)
}

// Accepted is the subject the collector republishes validated events on, as
// per-pool NDJSON batches, for the FW_OUTCOMES stream to capture
// ("fw.accepted.<pool>"). It is outside fw.outcomes.> so collectors never
// consume their own output.
func (s Subjects) Accepted(pool string) string { return s.prefix() + ".accepted." + pool }

// AcceptedWildcard matches every pool's accepted batches ("fw.accepted.>").
func (s Subjects) AcceptedWildcard() string { return s.prefix() + ".accepted.>" }

// Partition is the subject the collectors republish one partition's
// accepted events on, as NDJSON batches of the partition's pools, for the
// partition's owner and the FW_OUTCOMES stream ("fw.partition.<n>"; an
// extension for high availability, see PartitionOf).
func (s Subjects) Partition(n int) string { return s.prefix() + ".partition." + strconv.Itoa(n) }

// PartitionWildcard matches every partition's batches ("fw.partition.>").
func (s Subjects) PartitionWildcard() string { return s.prefix() + ".partition.>" }

// Presence is the subject a running fleetwatch serve answers requests on,
// so that a second instance on the same prefix can tell that one runs
// ("fw.presence"; an extension).
func (s Subjects) Presence() string { return s.prefix() + ".presence" }

// PartitionOf returns the partition of pool among n (n >= 1): FNV-1a (32
// bits) of the pool id modulo n. Every instance of a deployment computes
// the same partition for a pool, so exactly one owns it.
func PartitionOf(pool string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(pool))
	return int(h.Sum32() % uint32(n))
}

// Rejects is the subject rejected events are described on ("fw.rejects").
func (s Subjects) Rejects() string { return s.prefix() + ".rejects" }

// Decisions is the subject one pool's snapshots are published on.
func (s Subjects) Decisions(pool string) string { return s.prefix() + ".decisions." + pool }

// DecisionsWildcard matches every pool's snapshots ("fw.decisions.>").
func (s Subjects) DecisionsWildcard() string { return s.prefix() + ".decisions.>" }

// DecisionsPool returns the pool id of a decisions subject, and false when the
// subject is not one.
func (s Subjects) DecisionsPool(subject string) (string, bool) {
	p := s.prefix() + ".decisions."
	if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
		return "", false
	}
	return subject[len(p):], true
}

// Feed is the subject of one pool's compact feed ("fw.feed.<pool>"; an
// extension: docs/PROTOCOL.md "Compact feed (extension)").
func (s Subjects) Feed(pool string) string { return s.prefix() + ".feed." + pool }

// FeedWildcard matches every pool's compact feed ("fw.feed.>").
func (s Subjects) FeedWildcard() string { return s.prefix() + ".feed.>" }

// FeedPool returns the pool id of a compact feed subject, and false when
// the subject is not one.
func (s Subjects) FeedPool(subject string) (string, bool) {
	p := s.prefix() + ".feed."
	if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
		return "", false
	}
	return subject[len(p):], true
}

// Resync is the subject a router asks on for a decision snapshot of pool
// now, after it missed frames of the compact feed ("fw.resync.<pool>"; an
// extension: docs/PROTOCOL.md "Compact feed (extension)").
func (s Subjects) Resync(pool string) string { return s.prefix() + ".resync." + pool }

// ResyncWildcard matches every pool's resync subject ("fw.resync.>").
func (s Subjects) ResyncWildcard() string { return s.prefix() + ".resync.>" }

// ResyncPool returns the pool id of a resync subject, and false when the
// subject is not one.
func (s Subjects) ResyncPool(subject string) (string, bool) {
	p := s.prefix() + ".resync."
	if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
		return "", false
	}
	return subject[len(p):], true
}

// Drift is the subject one pool's drift alerts are published on.
func (s Subjects) Drift(pool string) string { return s.prefix() + ".drift." + pool }

// DriftWildcard matches every drift subject, including the review digest
// ("fw.drift.>").
func (s Subjects) DriftWildcard() string { return s.prefix() + ".drift.>" }

// DriftReview is the subject of the scheduled drift review digest. A pool
// named "review" would share it, so ValidatePoolID does not forbid it but the
// digest and alerts are told apart by their fields ("alerts" vs "backend").
func (s Subjects) DriftReview() string { return s.prefix() + ".drift.review" }

// Control is the subject operator actions are requested on
// ("fw.control.<verb>"), for example a drift re-baseline.
func (s Subjects) Control(verb string) string { return s.prefix() + ".control." + verb }

// OverridesSet is the subject operator overrides are requested on
// ("fw.overrides.set"; an extension): a request/reply, answered by one
// running serve instance (queue group QueueOverrides).
func (s Subjects) OverridesSet() string { return s.prefix() + ".overrides.set" }

// OverridesAudit is the subject every override change is published on, as
// JSON with who, what, when and why ("fw.overrides.audit"; an extension).
func (s Subjects) OverridesAudit() string { return s.prefix() + ".overrides.audit" }

// QueueOverrides is the queue group serve instances answer OverridesSet in.
const QueueOverrides = "fw-overrides"

func (s Subjects) jsName() string { return strings.ReplaceAll(s.prefix(), ".", "_") }

// StreamOutcomes is the JetStream stream capturing accepted outcome events
// for replay and audit ("FW_OUTCOMES").
func (s Subjects) StreamOutcomes() string { return strings.ToUpper(s.jsName()) + "_OUTCOMES" }

// StreamIntake is the JetStream work-queue stream that captures outcome
// events as proxies publish them, when the durable intake is on
// ("FW_INTAKE"): events published while no collector runs are kept.
func (s Subjects) StreamIntake() string { return strings.ToUpper(s.jsName()) + "_INTAKE" }

// StreamCapture is the JetStream stream that stores outcome events as
// proxies publish them, by default beside the live core path ("FW_CAPTURE"):
// a collector that starts alone replays what arrived while none ran.
func (s Subjects) StreamCapture() string { return strings.ToUpper(s.jsName()) + "_CAPTURE" }

// StreamDrift is the JetStream stream keeping drift alerts for review
// ("FW_DRIFT").
func (s Subjects) StreamDrift() string { return strings.ToUpper(s.jsName()) + "_DRIFT" }

// BucketDecisions is the JetStream KV bucket holding the last snapshot of
// each pool under the pool id ("fw_decisions").
func (s Subjects) BucketDecisions() string { return strings.ToLower(s.jsName()) + "_decisions" }

// BucketFeed is the JetStream KV bucket holding the last key frame of the
// compact feed of each pool under the pool id ("fw_feed"; an extension).
func (s Subjects) BucketFeed() string { return strings.ToLower(s.jsName()) + "_feed" }

// BucketLeases is the JetStream KV bucket holding the partition leases of
// the serve instances of a deployment ("fw_leases"; an extension).
func (s Subjects) BucketLeases() string { return strings.ToLower(s.jsName()) + "_leases" }

// StreamAudit is the JetStream stream keeping the override audit
// ("FW_AUDIT"; an extension).
func (s Subjects) StreamAudit() string { return strings.ToUpper(s.jsName()) + "_AUDIT" }

// BucketOverrides is the JetStream KV bucket holding the operator
// overrides in force, under "<pool>.<base64url(backend)>" ("fw_overrides";
// an extension).
func (s Subjects) BucketOverrides() string { return strings.ToLower(s.jsName()) + "_overrides" }

// BucketBaselines is the JetStream KV bucket holding drift probe baselines
// ("fw_probe_baselines").
func (s Subjects) BucketBaselines() string { return strings.ToLower(s.jsName()) + "_probe_baselines" }

// ValidatePoolID reports whether id is a valid pool id: it matches
// ^[-/_=.a-zA-Z0-9]{1,256}$, does not start or end with '.', and has no "..".
// These are exactly the keys a JetStream KV bucket accepts.
func ValidatePoolID(id string) error {
	if !validPoolID(id) {
		return fmt.Errorf("%w: %q", ErrInvalidPool, truncate(id, 64))
	}
	return nil
}

func validPoolID[T string | []byte](id T) bool {
	n := len(id)
	if n == 0 || n > MaxIDLen || id[0] == '.' || id[n-1] == '.' {
		return false
	}
	for i := 0; i < n; i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '-', c == '/', c == '_', c == '=':
		case c == '.':
			if id[i+1] == '.' { // i < n-1 because the last byte is not '.'
				return false
			}
		default:
			return false
		}
	}
	return true
}

// ValidateBackendID reports whether id is a valid backend id: 1 to 256 bytes
// of printable characters (no control characters), valid UTF-8.
func ValidateBackendID(id string) error {
	if !validBackendID(id) {
		return fmt.Errorf("%w: %q", ErrInvalidBackend, truncate(id, 64))
	}
	return nil
}

func validBackendID[T string | []byte](id T) bool {
	n := len(id)
	if n == 0 || n > MaxIDLen {
		return false
	}
	for i := 0; i < n; i++ {
		if c := id[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return validUTF8(id)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
