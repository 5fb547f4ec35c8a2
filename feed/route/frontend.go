package route

import (
	"encoding/json"
	"slices"
)

// What the other front ends of the same decisions (feed/epp's endpoint
// picker, which sees a request and its answer as messages of a data plane
// rather than as an http.Request) reuse of the router, so that a request
// is hashed, and an answer checked in passing, the same way whichever front
// end it went through: the same prefix lands on the same sticky backend,
// and a stream that failed on its way counts the same.

// Backends returns the ids of pool's configured backends, sorted (nil for
// an unknown pool): with Address, what a front end matches the endpoints
// its data plane names against.
func (ps *Pools) Backends(pool string) []string {
	if p := ps.pools[pool]; p != nil {
		return slices.Clone(p.order)
	}
	return nil
}

// BodyHints reads what the router reads from an OpenAI-compatible request
// body for the pick: its model and the affinity prefix, the hash of its
// first system (or developer) message's content as PrefixSystem computes
// it. ok is false when the body is not a JSON object; hasPrefix when it has
// no such message.
func BodyHints(body []byte) (model string, prefix uint64, hasPrefix, ok bool) {
	var info requestInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return "", 0, false, false
	}
	if sys := info.systemPrompt(); len(sys) > 0 {
		return info.Model, prefixHash(sys), true, true
	}
	return info.Model, 0, false, true
}

// StreamCheck is the check in passing of one SSE answer (check.go), for a
// front end that sees the answer's body chunk by chunk: Scan each chunk in
// order, then Error says why a 2xx stream failed on its way (an error
// event after it started, or an end with neither a finish reason nor
// [DONE]). The zero value is ready to use; it is not safe for concurrent
// use.
type StreamCheck struct {
	check   streamCheck
	started bool
	events  int64
}

// Scan checks the next chunk of the stream and returns how many of its
// events carry generated text (the first such event is the first token).
func (s *StreamCheck) Scan(chunk []byte) (contentEvents int) {
	if !s.started {
		s.check.start(toolDemand{})
		s.started = true
	}
	n := countContentEvents(chunk)
	s.events += int64(n)
	s.check.scan(chunk)
	return n
}

// ContentEvents is how many events carrying generated text the chunks
// scanned so far held.
func (s *StreamCheck) ContentEvents() int64 { return s.events }

// Error is the stream_error of the stream scanned so far, read once it
// ended without a read error: fleetwatch.StreamErrorEvent,
// fleetwatch.StreamCut or "" (it did not fail).
func (s *StreamCheck) Error() string {
	if !s.started {
		s.Scan(nil)
	}
	return s.check.streamError()
}
