package route

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Responses checked in passing (docs/PROTOCOL.md "Responses checked in
// passing (extension)"). A backend can answer 200 and still fail: a stream
// that carries an error event after its first tokens and then ends
// politely, or one that just stops; an answer from another model than the
// one asked for; a required tool call left out or sent with arguments that
// are not JSON; a "stream" that arrives all at once after the wait. The
// response has gone to the client by the time any of this is known, so
// nothing is retried: only the published outcome event says so, and a
// counter per backend.
//
// The stream checks run on the reads streamCopy already makes, with
// bytes.Index for a handful of markers; no chunk is JSON-decoded, except
// the lines carrying tool calls of a request that offered tools.

// Thresholds of the fake-stream check: at least fakeStreamChunks content
// events for which the router waited on its two ends for at most
// fakeStreamSpread in all between the first and the last, after a
// first-token wait of at least fakeStreamWait. 32 tokens in 10ms is 3200
// tokens/s for one stream, after a wait that shows the backend was not
// simply fast: the tokens were generated before the first was sent. The
// wait counts the time blocked in the backend body's Read and in the
// client's Write and Flush, not the router's own work between them
// (scanning each read), so a router slowed down by its machine does not
// hide a buffered stream. The client's time counts because while a slow
// client holds the router in Write, a real stream's next tokens pile up in
// the backend connection and the following Reads return at once: the
// router cannot tell them from a buffered stream's, so such a stream is
// not judged (never flagged).
const (
	fakeStreamChunks = 32
	fakeStreamSpread = 10 * time.Millisecond
	fakeStreamWait   = 100 * time.Millisecond
)

// markerOverlap is how much of the previous read is scanned again with the
// start of the next, so that a marker split across two reads is found.
// The line markers (event: error, data: [DONE]) are matched with the
// newline before them, because generated text may hold the same words but
// never a raw newline (JSON escapes it); the stream's start counts as a
// newline (streamCheck.start).
const markerOverlap = 32

var (
	keyDone            = []byte("[DONE]")
	keyDataLine        = []byte("\ndata: ")
	keyDataLineCompact = []byte("\ndata:")
	keyReason          = []byte(`_reason":`) // "finish_reason": (OpenAI), "stop_reason": (Anthropic)
	keyError           = []byte("error")
	keyErrorObject     = []byte(`{"error"`)
	keyObjectError     = []byte(`"object":"error"`)
	keyEventError      = []byte("\nevent: error")
	keyModel           = []byte(`"model":"`)
	keyToolCalls       = []byte(`"tool_calls"`)
	keyEmptyToolArr    = []byte(`[]`)
)

// toolDemand is what a request asked of tool calls.
type toolDemand struct {
	offered  bool   // the request offered tools
	required bool   // tool_choice "required" or a named function
	name     string // the function a named tool_choice forces
}

// demandOf reads the tool demand of a request's tools and tool_choice.
func demandOf(tools, choice json.RawMessage) toolDemand {
	var d toolDemand
	t := bytes.TrimSpace(tools)
	d.offered = len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(t, keyEmptyToolArr)
	if !d.offered {
		return d
	}
	var s string
	if json.Unmarshal(choice, &s) == nil {
		d.required = s == "required"
		return d
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(choice, &named) == nil && named.Function.Name != "" {
		d.required, d.name = true, named.Function.Name
	}
	return d
}

// streamCheck is what the stream checks learned so far.
type streamCheck struct {
	errorEvent  bool          // an error event passed
	finished    bool          // a non-null finish_reason (OpenAI) or stop_reason (Anthropic)
	done        bool          // data: [DONE]
	contentWait time.Duration // time blocked on the backend's reads and the client's writes, first to last content event
	tail        [markerOverlap]byte
	tailLen     int

	tools toolDemand
	calls toolCalls // assembled from the deltas when tools.offered
	line  []byte    // a tool-call line split across reads
}

// start readies c for a stream: its start counts as a line start.
func (c *streamCheck) start(tools toolDemand) {
	c.tools = tools
	c.tail[0], c.tailLen = '\n', 1
}

// scan looks for the markers in one read of a stream.
func (c *streamCheck) scan(chunk []byte) {
	if c.tailLen > 0 {
		var joint [2 * markerOverlap]byte
		n := copy(joint[:], c.tail[:c.tailLen])
		n += copy(joint[n:], chunk[:min(len(chunk), markerOverlap)])
		c.markers(joint[:n])
	}
	c.markers(chunk)
	if len(chunk) >= markerOverlap {
		c.tailLen = copy(c.tail[:], chunk[len(chunk)-markerOverlap:])
	} else {
		keep := min(markerOverlap-len(chunk), c.tailLen)
		copy(c.tail[:], c.tail[c.tailLen-keep:c.tailLen])
		c.tailLen = keep + copy(c.tail[keep:], chunk)
	}
	if c.tools.offered {
		c.toolLines(chunk)
	}
}

// markers looks for the markers in b with one bytes.Index per kind:
// "[DONE]", `_reason":` and "error", and only around a hit for the exact
// marker, so that a typical chunk (`"finish_reason":null`, no error) costs
// three passes.
func (c *streamCheck) markers(b []byte) {
	for rest := b; !c.done; {
		i := bytes.Index(rest, keyDone)
		if i < 0 {
			break
		}
		before := rest[:i]
		c.done = bytes.HasSuffix(before, keyDataLine) || bytes.HasSuffix(before, keyDataLineCompact)
		rest = rest[i+len(keyDone):]
	}
	if !c.finished {
		c.finished = nonNull(b, keyReason)
	}
	if !c.errorEvent && bytes.Contains(b, keyError) {
		c.errorEvent = bytes.Contains(b, keyErrorObject) || bytes.Contains(b, keyObjectError) ||
			bytes.Contains(b, keyEventError)
	}
}

// nonNull reports whether some key in b is followed by a string value
// (spaces after the colon allowed): `"finish_reason":"stop"`, not
// `"finish_reason":null`.
func nonNull(b, key []byte) bool {
	for {
		i := bytes.Index(b, key)
		if i < 0 {
			return false
		}
		b = bytes.TrimLeft(b[i+len(key):], " ")
		if len(b) > 0 && b[0] == '"' {
			return true
		}
	}
}

// streamError is the stream_error of a 2xx stream that ended without a
// read error: StreamErrorEvent, StreamCut or "".
func (c *streamCheck) streamError() string {
	switch {
	case c.errorEvent:
		return fleetwatch.StreamErrorEvent
	case !c.finished && !c.done:
		return fleetwatch.StreamCut
	}
	return ""
}

// toolCalls assembles the calls of an answer.
type toolCalls struct {
	names []string
	args  [][]byte
}

func (t *toolCalls) add(index int, name, args string) {
	for len(t.names) <= index && index < 128 {
		t.names = append(t.names, "")
		t.args = append(t.args, nil)
	}
	if index >= len(t.names) || index < 0 {
		return
	}
	if name != "" {
		t.names[index] = name
	}
	t.args[index] = append(t.args[index], args...)
}

// broken reports whether the calls fail the demand: none where one was
// required, another function than the one forced, or arguments that are
// not JSON.
func (t *toolCalls) broken(d toolDemand) bool {
	if !d.offered {
		return false
	}
	if d.required && len(t.names) == 0 {
		return true
	}
	for i, name := range t.names {
		if d.name != "" && name != d.name {
			return true
		}
		if !json.Valid(t.args[i]) {
			return true
		}
	}
	return false
}

// toolLines decodes the data lines of chunk that carry tool calls (a
// request that offered tools only), keeping a line split across reads.
func (c *streamCheck) toolLines(chunk []byte) {
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			if len(c.line)+len(chunk) <= maxMetaScan {
				c.line = append(c.line, chunk...)
			}
			return
		}
		line := chunk[:i]
		if len(c.line) > 0 {
			line = append(c.line, line...)
			c.line = c.line[:0]
		}
		chunk = chunk[i+1:]
		if !bytes.Contains(line, keyToolCalls) {
			continue
		}
		payload, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Index    int `json:"index"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(payload, &ev) != nil {
			continue
		}
		for _, ch := range ev.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				c.calls.add(tc.Index, tc.Function.Name, tc.Function.Arguments)
			}
		}
	}
}

// plainToolCalls reads the tool calls of a non-streaming chat answer.
func plainToolCalls(body []byte) (toolCalls, bool) {
	var resp struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	var t toolCalls
	if json.Unmarshal(body, &resp) != nil || len(resp.Choices) == 0 {
		return t, false
	}
	for i, tc := range resp.Choices[0].Message.ToolCalls {
		t.add(i, tc.Function.Name, tc.Function.Arguments)
	}
	return t, true
}

// servedModel returns the first "model" string of b ("" when none, or
// when it is escaped or too long to be a plain model id).
func servedModel(b []byte) string {
	i := bytes.Index(b, keyModel)
	if i < 0 {
		return ""
	}
	rest := b[i+len(keyModel):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 || j > fleetwatch.MaxModelLen || bytes.IndexByte(rest[:j], '\\') >= 0 {
		return ""
	}
	return string(rest[:j])
}

// modelMatches reports whether served is a name of what was asked for:
// the request's model, or any model of the pool (its id and Models), as
// is or as a dated snapshot of it: followed by "-" and digits and dashes
// only ("gpt-4o" asked, "gpt-4o-2024-08-06" served, as OpenAI answers;
// "llama-3.1-8b" is not a snapshot of "llama").
func modelMatches(served, requested string, models []string) bool {
	match := func(m string) bool {
		if m == "" {
			return false
		}
		if served == m {
			return true
		}
		suffix, ok := strings.CutPrefix(served, m+"-")
		return ok && suffix != "" && strings.Trim(suffix, "0123456789-") == ""
	}
	if match(requested) {
		return true
	}
	for _, m := range models {
		if match(m) {
			return true
		}
	}
	return false
}

// checkPassing fills ev's checked-in-passing fields for a delivered 2xx
// answer whose body was read to its end, counts what it found, and
// reports whether the attempt failed after all (a stream error).
func (rt *Router) checkPassing(a *attempt, meta *responseMeta, streaming bool, ev *fleetwatch.Event) bool {
	pool, be := a.pool.id, a.backend.id
	failed := false
	if streaming {
		if ev.StreamError = meta.check.streamError(); ev.StreamError != "" {
			rt.metrics.streamError(pool, be, ev.StreamError).Inc()
			failed = true
		}
		first := meta.firstContent
		if meta.contentChunks >= fakeStreamChunks && !first.IsZero() &&
			meta.check.contentWait <= fakeStreamSpread && first.Sub(a.sent) >= fakeStreamWait {
			ev.FakeStream = true
			rt.metrics.fakeStream(pool, be).Inc()
		}
	}
	if meta.model != "" && !modelMatches(meta.model, a.model, a.pool.models) {
		ev.ModelMismatch = meta.model
		rt.metrics.modelMismatch(pool, be).Inc()
	}
	if d := a.tools; d.offered {
		calls := meta.check.calls
		ok := true
		if !streaming {
			calls, ok = plainToolCalls(meta.kept)
		}
		if ok && calls.broken(d) {
			ev.ToolCallBroken = true
			rt.metrics.toolCallBroken(pool, be).Inc()
		}
	}
	return failed
}
