// Package shed tells a request refused in front of a backend (by a
// gateway or a scheduler) from the backend's own answer, so that the
// outcome event carries shed and never counts against the backend
// (docs/PROTOCOL.md "Quotas and sheds"). A leaf: it imports the standard
// library only.
//
// The markers, each from its source:
//   - the header x-llm-d-request-dropped-reason on a 429 or 503: llm-d's
//     endpoint picker names why it dropped a request (llm-d/llm-d-router,
//     its request handling; the value is the reason);
//   - status 529: NVIDIA Dynamo's frontend answers 529 when its workers are
//     overloaded, before any worker sees the request;
//   - the header x-fleetwatch-shed on a 429 or 503: fleetwatch's own front
//     ends (the endpoint picker and the pick endpoint) mark what they shed.
package shed

import "strings"

// Header names.
const (
	// DroppedReason is llm-d's endpoint picker's header.
	DroppedReason = "x-llm-d-request-dropped-reason"
	// Fleetwatch is the header fleetwatch's front ends set on a shed.
	Fleetwatch = "x-fleetwatch-shed"
)

// StatusOverloaded is Dynamo's 529.
const StatusOverloaded = 529

// maxLen bounds a reason (the event's shed field takes 64 bytes).
const maxLen = 64

// Reason returns why an answer with status and headers (header looks one
// up by name) was a shed in front of the backend, "" when it was not.
func Reason(status int, header func(string) string) string {
	if status == 429 || status == 503 {
		for _, h := range []string{DroppedReason, Fleetwatch} {
			if v := strings.TrimSpace(header(h)); v != "" {
				return clip(v)
			}
		}
	}
	if status == StatusOverloaded {
		return "overloaded_529"
	}
	return ""
}

// clip keeps a reason printable and within maxLen bytes.
func clip(v string) string {
	v = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, v)
	for len(v) > maxLen {
		_, size := lastRune(v)
		v = v[:len(v)-size]
	}
	return v
}

func lastRune(s string) (rune, int) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i]&0xC0 != 0x80 {
			return rune(s[i]), len(s) - i
		}
	}
	return 0, 1
}
