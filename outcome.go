package fleetwatch

import "unicode/utf8"

// Outcome classifies how a request to a backend ended.
type Outcome uint8

// The outcomes of PROTOCOL.md. The zero value, OutcomeUnset, means the event
// did not name one; the decoder then derives it from the status.
const (
	OutcomeUnset Outcome = iota
	OutcomeOK
	OutcomeError
	OutcomeThrottled
	OutcomeTimeout
	OutcomeCanceled
	OutcomeClientError
	// OutcomeStalled: the backend accepted the request and sent no first
	// token within the router's first-token deadline (a protocol extension,
	// docs/PROTOCOL.md "The stalled outcome"). It counts as a failure, like
	// timeout; it is never derived from a status.
	OutcomeStalled
	numOutcomes
)

// NumOutcomes is one more than the largest Outcome value, for arrays indexed
// by outcome.
const NumOutcomes = int(numOutcomes)

var outcomeNames = [...]string{
	OutcomeUnset:       "",
	OutcomeOK:          "ok",
	OutcomeError:       "error",
	OutcomeThrottled:   "throttled",
	OutcomeTimeout:     "timeout",
	OutcomeCanceled:    "canceled",
	OutcomeClientError: "client_error",
	OutcomeStalled:     "stalled",
}

// String returns the wire name of o ("ok", "error", ...), or "" for
// OutcomeUnset and unknown values.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return ""
}

// ParseOutcome returns the Outcome named s, and false when s names none.
func ParseOutcome(s string) (Outcome, bool) { return parseOutcome(s) }

func parseOutcome[T string | []byte](s T) (Outcome, bool) {
	for o := OutcomeOK; o < numOutcomes; o++ {
		if string(s) == outcomeNames[o] {
			return o, true
		}
	}
	return OutcomeUnset, false
}

// OutcomeFromStatus derives an outcome from an HTTP status as PROTOCOL.md
// says: 2xx ok; 429 throttled; 408, 504 and 0 timeout; 499 canceled; other
// 4xx client_error; 5xx and anything else error.
func OutcomeFromStatus(status int) Outcome {
	switch {
	case status >= 200 && status <= 299:
		return OutcomeOK
	case status == 429:
		return OutcomeThrottled
	case status == 408 || status == 504 || status == 0:
		return OutcomeTimeout
	case status == 499:
		return OutcomeCanceled
	case status >= 400 && status <= 499:
		return OutcomeClientError
	default:
		return OutcomeError
	}
}

// IsFailure reports whether o counts against a backend's success rate
// (error, timeout and stalled).
func (o Outcome) IsFailure() bool {
	return o == OutcomeError || o == OutcomeTimeout || o == OutcomeStalled
}

// Counted reports whether o counts for or against a backend at all: ok,
// error, timeout, stalled and throttled do; canceled and client_error are
// visible in metrics only.
func (o Outcome) Counted() bool {
	return o == OutcomeOK || o.IsFailure() || o == OutcomeThrottled
}

func validUTF8[T string | []byte](s T) bool {
	switch v := any(s).(type) {
	case string:
		return utf8.ValidString(v)
	case []byte:
		return utf8.Valid(v)
	}
	return false
}
