package drift

import (
	"errors"
	"fmt"
)

// Probe error kinds, the `kind` label of the probe error metric.
const (
	ErrKindTimeout    = "timeout"
	ErrKindTransport  = "transport"
	ErrKindStatus     = "status"
	ErrKindMalformed  = "malformed"
	ErrKindNoLogprobs = "no_logprobs"
	ErrKindOther      = "other"
)

// ProbeError is a failed probe request or cycle. It is never a drift
// verdict.
type ProbeError struct {
	Kind   string // one of the ErrKind constants
	Status int    // HTTP status for ErrKindStatus
	Op     string // what was being done, e.g. "POST /v1/chat/completions"
	Err    error
}

func (e *ProbeError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("probes: %s: HTTP %d: %v", e.Op, e.Status, e.Err)
	}
	return fmt.Sprintf("probes: %s: %s: %v", e.Op, e.Kind, e.Err)
}

func (e *ProbeError) Unwrap() error { return e.Err }

// ErrBadResponse is wrapped by ProbeErrors of kind malformed.
var ErrBadResponse = errors.New("probes: malformed response")

// ErrorKind returns the kind of a probe error (ErrKindOther for others).
func ErrorKind(err error) string {
	var pe *ProbeError
	if errors.As(err, &pe) {
		return pe.Kind
	}
	if errors.Is(err, ErrNoLogprobs) {
		return ErrKindNoLogprobs
	}
	return ErrKindOther
}
