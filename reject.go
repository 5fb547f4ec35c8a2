package fleetwatch

import (
	"errors"
	"fmt"
)

// Sentinel errors for the ways an outcome event can break the protocol.
// A *DecodeError wraps exactly one of them; branch with errors.Is.
var (
	ErrBadJSON        = errors.New("bad json")
	ErrMissingField   = errors.New("missing field")
	ErrInvalidPool    = errors.New("invalid pool id")
	ErrInvalidBackend = errors.New("invalid backend id")
	ErrWrongType      = errors.New("wrong type")
	ErrOutOfRange     = errors.New("out of range")
	ErrTooLong        = errors.New("too long")
	ErrBadValue       = errors.New("bad value")
	ErrBadVersion     = errors.New("unknown version")
	// ErrTooManyPools and ErrTooManyBackends are not decode errors: the
	// event is valid, but it names a pool (or a backend) that the analyzer
	// does not track because its limits are reached (an extension of the
	// protocol's reject reasons).
	ErrTooManyPools    = errors.New("too many pools")
	ErrTooManyBackends = errors.New("too many backends")
)

// Reason is a short, bounded-cardinality code for why an event was rejected,
// used as a metric label ("bad_json", "out_of_range", ...).
type Reason string

// Reject reasons, one per sentinel error.
const (
	ReasonBadJSON        Reason = "bad_json"
	ReasonMissingField   Reason = "missing_field"
	ReasonInvalidPool    Reason = "invalid_pool"
	ReasonInvalidBackend Reason = "invalid_backend"
	ReasonWrongType      Reason = "wrong_type"
	ReasonOutOfRange     Reason = "out_of_range"
	ReasonTooLong        Reason = "too_long"
	ReasonBadValue       Reason = "bad_value"
	ReasonBadVersion     Reason = "bad_version"
	// ReasonTooManyPools: a new pool beyond the analyzer's max_pools.
	ReasonTooManyPools Reason = "too_many_pools"
	// ReasonTooManyBackends: a new backend beyond max_backends_per_pool or
	// max_backends.
	ReasonTooManyBackends Reason = "too_many_backends"
)

// Reasons lists every Reason, for pre-registering metrics.
var Reasons = []Reason{
	ReasonBadJSON, ReasonMissingField, ReasonInvalidPool, ReasonInvalidBackend,
	ReasonWrongType, ReasonOutOfRange, ReasonTooLong, ReasonBadValue, ReasonBadVersion,
	ReasonTooManyPools, ReasonTooManyBackends,
}

var reasonErrs = map[error]Reason{
	ErrBadJSON: ReasonBadJSON, ErrMissingField: ReasonMissingField,
	ErrInvalidPool: ReasonInvalidPool, ErrInvalidBackend: ReasonInvalidBackend,
	ErrWrongType: ReasonWrongType, ErrOutOfRange: ReasonOutOfRange,
	ErrTooLong: ReasonTooLong, ErrBadValue: ReasonBadValue, ErrBadVersion: ReasonBadVersion,
	ErrTooManyPools: ReasonTooManyPools, ErrTooManyBackends: ReasonTooManyBackends,
}

// Refusal is a valid event that a sink did not count, with the reason: the
// analyzer refuses events for pools and backends beyond its limits
// (ReasonTooManyPools, ReasonTooManyBackends), and the collector rejects
// them like events that break the protocol.
type Refusal struct {
	Index  int    // the event's index in the batch
	Reason Reason // why it was not counted
}

// DecodeError describes why an outcome event was rejected.
type DecodeError struct {
	Err    error  // one of the sentinel errors above
	Field  string // the offending field, "" when not about one field (ErrBadJSON)
	Offset int    // byte offset in the input where the problem was found
	// Source is the event's source when it could be read before the
	// problem was found, else "", for the reject notice.
	Source string
}

// Error reads like the protocol's reject reasons: "ttft_ms out of range",
// "missing field pool", "invalid backend id", "bad json at offset 17".
func (e *DecodeError) Error() string {
	switch {
	case e.Field == "":
		return fmt.Sprintf("%v at offset %d", e.Err, e.Offset)
	case e.Err == ErrMissingField:
		return fmt.Sprintf("%v %s", e.Err, e.Field)
	case e.Err == ErrInvalidPool || e.Err == ErrInvalidBackend:
		return e.Err.Error() // the sentinel names the field
	}
	return fmt.Sprintf("%s %v", e.Field, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Reason returns the bounded-cardinality code of e.
func (e *DecodeError) Reason() Reason { return reasonErrs[e.Err] }

// ReasonOf returns the reject reason of err, and "" when err is not a
// decode error.
func ReasonOf(err error) Reason {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason()
	}
	return ""
}

// Reject describes a rejected outcome event on fw.rejects.
type Reject struct {
	V       int    `json:"v"`
	At      Time   `json:"at"`
	Reason  string `json:"reason"` // human, e.g. "ttft_ms out of range"
	Code    Reason `json:"code"`   // bounded code, e.g. "out_of_range" (extension)
	Subject string `json:"subject"`
	Source  string `json:"source"` // the event's source when it could be read, else ""
	Sample  string `json:"sample"` // the first 256 bytes of the offending event
	// Suppressed counts rejects of the same code not described since the
	// previous notice, because of the rate limit (extension).
	Suppressed int64 `json:"suppressed,omitempty"`
}

// MaxSampleLen bounds Reject.Sample.
const MaxSampleLen = 256
