package fleetwatch

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalidSnapshot is wrapped by every error of Snapshot.Validate. The
// error also wraps the sentinel saying what is wrong: ErrBadVersion,
// ErrInvalidPool, ErrInvalidBackend, ErrMissingField, ErrOutOfRange or
// ErrBadValue.
var ErrInvalidSnapshot = errors.New("fleetwatch: invalid snapshot")

// Validate reports the first way s breaks PROTOCOL.md "Decision snapshot",
// as an error that wraps ErrInvalidSnapshot and names the field, for example
// `fleetwatch: invalid snapshot: backends[2].weight = 1.5: out of range [0, 1]`.
// It checks what can be checked on one snapshot:
//   - v is ProtocolVersion (ErrBadVersion);
//   - pool is a valid pool id (ErrInvalidPool);
//   - epoch and at are present (ErrMissingField);
//   - mode, all_open, shadow, each state and drift are known values
//     (ErrBadValue);
//   - backends are sorted by backend id with no duplicates (ErrBadValue),
//     and each id is a valid backend id (ErrInvalidBackend);
//   - open_until is null unless the backend is open (ErrBadValue);
//   - every number is finite; weight, success_rate and rate_429 are in
//     [0, 1]; ttl_ms, TTFTs, affinity_tolerance, cost_per_mtok, requests and
//     window_ms are not negative; times are representable in RFC 3339
//     (ErrOutOfRange);
//   - an override, when present, passes Override.Validate (ErrBadValue);
//   - backends_total is not negative and, when truncated, not below the
//     number of backends listed (ErrOutOfRange).
//   - p50_tpot_ms and p95_tpot_ms are finite and not negative
//     (ErrOutOfRange), and p50_tpot_ms is not above p95_tpot_ms (ErrBadValue).
//
// It does not reject what the protocol allows: null numbers (p50_ttft_ms
// with no samples), an open backend with a null open_until, an empty
// backends list, a zero ttl_ms. Unknown JSON fields never reach it.
// Whether the snapshot belongs to the subject or key it came from, and
// whether it is newer than the one a router has (NewerThan), are for the
// caller to check.
func (s *Snapshot) Validate() error {
	if s == nil {
		return fmt.Errorf("%w: nil", ErrInvalidSnapshot)
	}
	if s.V != ProtocolVersion {
		return invalidf("v", s.V, ErrBadVersion, " (want %d)", ProtocolVersion)
	}
	if err := ValidatePoolID(s.Pool); err != nil {
		return fmt.Errorf("%w: pool: %w", ErrInvalidSnapshot, err)
	}
	if s.Epoch == "" {
		return missing("epoch")
	}
	if s.At.IsZero() {
		return missing("at")
	}
	if !representable(s.At) {
		return invalid("at", s.At, ErrOutOfRange, yearRange)
	}
	if s.TTLMs < 0 {
		return invalid("ttl_ms", s.TTLMs, ErrOutOfRange, nonNegative)
	}
	if s.Mode != ModeBalance && s.Mode != ModeFailover {
		return invalidq("mode", string(s.Mode), ErrBadValue, ` (want "balance" or "failover")`)
	}
	if s.AllOpen != AllOpenShed && s.AllOpen != AllOpenSpread {
		return invalidq("all_open", string(s.AllOpen), ErrBadValue, ` (want "shed" or "spread")`)
	}
	if !s.Shadow.Valid() {
		return invalidq("shadow", string(s.Shadow), ErrBadValue, ` (want "breakers", "observe" or omitted)`)
	}
	if m := s.MedianEWMATTFTMs; m != nil && !inRange(*m, 0, math.MaxFloat64) {
		return invalid("median_ewma_ttft_ms", *m, ErrOutOfRange, nonNegative)
	}
	if !inRange(s.AffinityTolerance, 0, math.MaxFloat64) {
		return invalid("affinity_tolerance", s.AffinityTolerance, ErrOutOfRange, nonNegative)
	}
	if s.Routers < 0 {
		return invalid("routers", s.Routers, ErrOutOfRange, nonNegative)
	}
	if err := s.RetryBudget.validate(); err != nil {
		return err
	}
	if s.BackendsTotal < 0 || (s.Truncated && s.BackendsTotal < len(s.Backends)) {
		return invalid("backends_total", s.BackendsTotal, ErrOutOfRange, fmt.Sprintf(" (want at least the %d backends listed)", len(s.Backends)))
	}
	for i := range s.Backends {
		b := &s.Backends[i]
		if err := b.validate(); err != nil {
			return fmt.Errorf("%w: backends[%d].%w", ErrInvalidSnapshot, i, err)
		}
		if i > 0 {
			prev := s.Backends[i-1].Backend
			switch {
			case b.Backend == prev:
				return invalidq(backendField(i, "backend"), b.Backend, ErrBadValue, fmt.Sprintf(": duplicate of backends[%d]", i-1))
			case b.Backend < prev:
				return invalidq(backendField(i, "backend"), b.Backend, ErrBadValue, fmt.Sprintf(": not sorted after backends[%d] %q", i-1, truncate(prev, 64)))
			}
		}
	}
	return nil
}

// validate checks one backend; the error starts with the field name, for
// Validate to prefix with the backend's index.
func (b *Backend) validate() error {
	if err := ValidateBackendID(b.Backend); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	switch b.State {
	case StateClosed, StateOpen, StateHalfOpen:
	default:
		return fmt.Errorf("state = %q: %w (want \"closed\", \"open\" or \"half_open\")", b.State, ErrBadValue)
	}
	if !inRange(b.Weight, 0, 1) {
		return fmt.Errorf("weight = %v: %w [0, 1]", b.Weight, ErrOutOfRange)
	}
	for _, n := range [...]struct {
		name    string
		v       *float64
		max     float64
		wantMsg string
	}{
		{"ewma_ttft_ms", b.EWMATTFTMs, math.MaxFloat64, nonNegative},
		{"p50_ttft_ms", b.P50TTFTMs, math.MaxFloat64, nonNegative},
		{"p95_ttft_ms", b.P95TTFTMs, math.MaxFloat64, nonNegative},
		{"success_rate", b.SuccessRate, 1, " [0, 1]"},
		{"rate_429", b.Rate429, 1, " [0, 1]"},
		{"cost_per_mtok", b.CostPerMTok, math.MaxFloat64, nonNegative},
	} {
		if n.v != nil && !inRange(*n.v, 0, n.max) {
			return fmt.Errorf("%s = %v: %w%s", n.name, *n.v, ErrOutOfRange, n.wantMsg)
		}
	}
	if b.Requests < 0 {
		return fmt.Errorf("requests = %d: %w%s", b.Requests, ErrOutOfRange, nonNegative)
	}
	if b.WindowMs < 0 {
		return fmt.Errorf("window_ms = %d: %w%s", b.WindowMs, ErrOutOfRange, nonNegative)
	}
	if b.OpenUntil != nil {
		if b.State != StateOpen {
			return fmt.Errorf("open_until = %v: %w (must be null unless state is \"open\", state is %q)", *b.OpenUntil, ErrBadValue, b.State)
		}
		if !representable(*b.OpenUntil) {
			return fmt.Errorf("open_until = %v: %w%s", *b.OpenUntil, ErrOutOfRange, yearRange)
		}
	}
	switch b.Drift {
	case DriftUnknown, DriftOK, DriftSuspect, DriftDrifted:
	default:
		return fmt.Errorf("drift = %q: %w (want \"ok\", \"suspect\", \"drifted\" or \"unknown\")", b.Drift, ErrBadValue)
	}
	if b.Since != nil && !representable(*b.Since) {
		return fmt.Errorf("since = %v: %w%s", *b.Since, ErrOutOfRange, yearRange)
	}
	if l := b.Load; l != nil {
		switch {
		case !inRange(l.Running, 0, math.MaxFloat64):
			return fmt.Errorf("load.running = %v: %w%s", l.Running, ErrOutOfRange, nonNegative)
		case !inRange(l.Waiting, 0, math.MaxFloat64):
			return fmt.Errorf("load.waiting = %v: %w%s", l.Waiting, ErrOutOfRange, nonNegative)
		case l.KVCacheUsage != nil && !inRange(*l.KVCacheUsage, 0, 1):
			return fmt.Errorf("load.kv_cache_usage = %v: %w [0, 1]", *l.KVCacheUsage, ErrOutOfRange)
		case l.AgeMs < 0:
			return fmt.Errorf("load.age_ms = %d: %w%s", l.AgeMs, ErrOutOfRange, nonNegative)
		}
	}
	if o := b.Override; o != nil {
		if err := o.Validate(); err != nil {
			return fmt.Errorf("override: %w: %w", ErrBadValue, err)
		}
	}
	return validateTPOT(b)
}

// validateTPOT checks the time per output token extension: each quantile
// finite and >= 0, and the median not above the p95.
func validateTPOT(b *Backend) error {
	if b.P50TPOTMs != nil && !inRange(*b.P50TPOTMs, 0, math.MaxFloat64) {
		return fmt.Errorf("p50_tpot_ms = %v: %w%s", *b.P50TPOTMs, ErrOutOfRange, nonNegative)
	}
	if b.P95TPOTMs != nil && !inRange(*b.P95TPOTMs, 0, math.MaxFloat64) {
		return fmt.Errorf("p95_tpot_ms = %v: %w%s", *b.P95TPOTMs, ErrOutOfRange, nonNegative)
	}
	if b.P50TPOTMs != nil && b.P95TPOTMs != nil && *b.P50TPOTMs > *b.P95TPOTMs {
		return fmt.Errorf("p50_tpot_ms = %v: %w (above p95_tpot_ms %v)", *b.P50TPOTMs, ErrBadValue, *b.P95TPOTMs)
	}
	return nil
}

const (
	nonNegative = " (must be finite and >= 0)"
	yearRange   = " (RFC 3339 years are 0000 to 9999)"
)

// inRange reports whether v is finite and in [lo, hi]. NaN is not.
func inRange(v, lo, hi float64) bool { return v >= lo && v <= hi }

// representable reports whether t can be written as an RFC 3339 UTC time,
// as the protocol writes every time.
func representable(t Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

func backendField(i int, name string) string { return fmt.Sprintf("backends[%d].%s", i, name) }

func missing(field string) error {
	return fmt.Errorf("%w: %s: %w", ErrInvalidSnapshot, field, ErrMissingField)
}

func invalid(field string, value any, kind error, detail string) error {
	return fmt.Errorf("%w: %s = %v: %w%s", ErrInvalidSnapshot, field, value, kind, detail)
}

func invalidf(field string, value any, kind error, detailFormat string, args ...any) error {
	return invalid(field, value, kind, fmt.Sprintf(detailFormat, args...))
}

func invalidq(field, value string, kind error, detail string) error {
	return fmt.Errorf("%w: %s = %q: %w%s", ErrInvalidSnapshot, field, truncate(value, 64), kind, detail)
}
