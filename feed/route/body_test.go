package route

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/retryhint"
)

func TestCountContentEvents(t *testing.T) {
	tests := []struct {
		name  string
		chunk string
		want  int
	}{
		{"role chunk", `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n", 0},
		{"chat token", `data: {"choices":[{"delta":{"content":"hi"}}]}` + "\n\n", 1},
		{"completions token", `data: {"choices":[{"text":" x","index":0}]}` + "\n\n", 1},
		{"finish chunk", `data: {"choices":[{"delta":{},"finish_reason":"stop"}]}` + "\n\n", 0},
		{"done", "data: [DONE]\n\n", 0},
		{"three events", `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":""}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":"b"}}]}` + "\n\n", 2},
		{"no newline", `data: {"choices":[{"delta":{"content":"a"}}]}`, 1},
	}
	for _, tc := range tests {
		if got := countContentEvents([]byte(tc.chunk)); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestScanMeta(t *testing.T) {
	body := `{"id":"x","system_fingerprint":"fp_44709d6fcb","choices":[],` +
		`"usage":{"prompt_tokens":1200,"completion_tokens":350,"total_tokens":1550,"prompt_tokens_details":{"cached_tokens":1024}}}`
	var got responseMeta
	scanMeta([]byte(body), &got)
	want := responseMeta{promptTokens: 1200, completionTokens: 350, cachedTokens: 1024, fingerprint: "fp_44709d6fcb"}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(responseMeta{}, streamCheck{}, toolCalls{}, toolDemand{})); diff != "" {
		t.Errorf("meta (-want +got):\n%s", diff)
	}
}

// sseStream is an OpenAI chat stream with one chunk per content (an empty
// one is a role-only chunk), then a usage chunk and [DONE].
func sseStream(contents []string, prompt, completion int64) []byte {
	var b bytes.Buffer
	for _, c := range contents {
		chunk, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"delta": map[string]any{"content": c}}}})
		b.WriteString("data: ")
		b.Write(chunk)
		b.WriteString("\n\n")
	}
	usage, _ := json.Marshal(map[string]any{"choices": []any{}, "usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion}})
	b.WriteString("data: ")
	b.Write(usage)
	b.WriteString("\n\ndata: [DONE]\n\n")
	return b.Bytes()
}

// FuzzCountContentEvents: arbitrary bytes never panic and never count more
// events than there are "data: " prefixes; a stream built from contents
// counts exactly the non-empty ones.
func FuzzCountContentEvents(f *testing.F) {
	f.Add([]byte(`data: {"choices":[{"delta":{"content":"hi"}}]}`+"\n\n"), "a|b||c")
	f.Add([]byte("data: data: \"content\":\"\n"), "")
	f.Add([]byte(`"text":"x" data: "text":"`), `"content":"x|\"`)
	f.Fuzz(func(t *testing.T, raw []byte, joined string) {
		if n := countContentEvents(raw); n < 0 || n > bytes.Count(raw, keyData) {
			t.Fatalf("%d events in %q", n, raw)
		}
		contents := strings.Split(joined, "|")
		want := 0
		for _, c := range contents {
			if c != "" {
				want++
			}
		}
		stream := sseStream(contents, 0, 0)
		if got := countContentEvents(stream); got != want {
			t.Fatalf("%d content events in %q, want %d", got, stream, want)
		}
	})
}

// FuzzScanMeta: arbitrary bytes never panic and give sane values; usage and
// a fingerprint written as JSON are read back.
func FuzzScanMeta(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":3}}`), uint32(12), uint32(3), uint32(1), "fp_44709d6fcb")
	f.Add([]byte(`"prompt_tokens": 99999999999999999999999 "system_fingerprint":"`), uint32(0), uint32(0), uint32(0), "")
	f.Add([]byte(`"cached_tokens":-1,"system_fingerprint":"a"b"`), uint32(1), uint32(2), uint32(3), "fp\"x")
	f.Fuzz(func(t *testing.T, raw []byte, prompt, completion, cached uint32, fp string) {
		var m responseMeta
		scanMeta(raw, &m)
		if m.promptTokens < 0 || m.completionTokens < 0 || m.cachedTokens < 0 ||
			len(m.fingerprint) > fleetwatch.MaxFingerprintLen || strings.Contains(m.fingerprint, `"`) {
			t.Fatalf("scanMeta(%q) = %+v", raw, m)
		}
		body, _ := json.Marshal(map[string]any{
			"system_fingerprint": fp,
			"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion,
				"prompt_tokens_details": map[string]any{"cached_tokens": cached}},
		})
		var got responseMeta
		scanMeta(body, &got)
		want := responseMeta{promptTokens: int64(prompt), completionTokens: int64(completion), cachedTokens: int64(cached)}
		if plainToken(fp) {
			want.fingerprint = fp
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(responseMeta{}, streamCheck{}, toolCalls{}, toolDemand{})); diff != "" {
			t.Fatalf("scanMeta(%s) (-want +got):\n%s", body, diff)
		}
	})
}

// plainToken reports whether fingerprint s is written by json.Marshal as
// is (no escapes) and is short enough to be kept.
func plainToken(s string) bool {
	b, _ := json.Marshal(s)
	return s != "" && len(s) <= fleetwatch.MaxFingerprintLen && string(b) == `"`+s+`"`
}

// FuzzCopy: both copies pass any body through byte for byte, whatever the
// read sizes, and report the stream's usage when it is well formed.
func FuzzCopy(f *testing.F) {
	f.Add(sseStream([]string{"", "hel", "lo"}, 7, 2), uint8(3))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"x\"}]}\n\n"), uint8(1))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, step uint8) {
		read := func() io.Reader {
			if step == 0 {
				return bytes.NewReader(body)
			}
			return iotest.HalfReader(bytes.NewReader(body)) // short reads
		}
		w := httptest.NewRecorder()
		var meta responseMeta
		werr, rerr := streamCopy(w, read(), &meta, time.Now)
		if werr != nil || rerr != nil || !bytes.Equal(w.Body.Bytes(), body) {
			t.Fatalf("streamCopy: %v %v, copied %q of %q", werr, rerr, w.Body.Bytes(), body)
		}
		if meta.contentChunks > 0 && meta.firstContent.IsZero() {
			t.Fatalf("content without a first-content time: %+v", meta)
		}
		var out bytes.Buffer
		var plain responseMeta
		werr, rerr = plainCopy(&out, read(), &plain)
		if werr != nil || rerr != nil || !bytes.Equal(out.Bytes(), body) {
			t.Fatalf("plainCopy: %v %v, copied %q of %q", werr, rerr, out.Bytes(), body)
		}
	})
}

// A body that breaks off is reported as a read error, after what came.
func TestCopyReportsABrokenBody(t *testing.T) {
	body := sseStream([]string{"a"}, 1, 1)
	w := httptest.NewRecorder()
	var meta responseMeta
	werr, rerr := streamCopy(w, io.MultiReader(bytes.NewReader(body), iotest.ErrReader(io.ErrUnexpectedEOF)), &meta, time.Now)
	if werr != nil || rerr != io.ErrUnexpectedEOF || !bytes.Equal(w.Body.Bytes(), body) || meta.contentChunks != 1 {
		t.Errorf("streamCopy: %v %v %+v", werr, rerr, meta)
	}
}

// FuzzRequestInfo: the router's read of a request body never panics, and
// the prefix hash of a system prompt depends on its bytes alone.
func FuzzRequestInfo(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"x"}]}`))
	f.Add([]byte(`{"messages":[{"role":"developer","content":[{"type":"text","text":"x"}]}]}`))
	f.Add([]byte(`{"messages":null}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var info requestInfo
		if json.Unmarshal(raw, &info) != nil {
			return
		}
		sys := info.systemPrompt()
		if prefixHash(sys) != prefixHash(bytes.Clone(sys)) {
			t.Fatal("prefixHash is not a function of the bytes")
		}
	})
}

// FuzzRetryAfterMs: any header values and body give a delay in
// [0, one hour], and the body still reads back whole.
func FuzzRetryAfterMs(f *testing.F) {
	f.Add("2", "", "")
	f.Add("Wed, 02 Dec 2026 08:00:03 GMT", "1500", `{"retryDelay":"3s"}`)
	f.Add("-1", "NaN", `{"retryDelay":"`)
	f.Add("1e400", "+Inf", "")
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	rt, err := New(Settings{Pools: []Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: "http://127.0.0.1:1"}}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, retryAfter, retryAfterMsValue, body string) {
		resp := &http.Response{StatusCode: 429, Body: io.NopCloser(strings.NewReader(body)),
			Header: http.Header{"Retry-After": {retryAfter}, "Retry-After-Ms": {retryAfterMsValue}}}
		if v := rt.retryHint("p", resp, now).Ms; !(v >= 0 && v <= retryhint.MaxMs) {
			t.Fatalf("retryHint(%q, %q) = %v", retryAfter, retryAfterMsValue, v)
		}
		if got, _ := io.ReadAll(resp.Body); string(got) != body {
			t.Fatalf("body read back %q, want %q", got, body)
		}
	})
}

// clockedEvents returns one SSE event per Read, advancing *clock by wait
// first (the time the router spends blocked on the backend), and by tail
// before the events that carry no content after the last that does.
type clockedEvents struct {
	events     [][]byte
	clock      *time.Time
	wait, tail time.Duration
}

func (r *clockedEvents) Read(p []byte) (int, error) {
	if len(r.events) == 0 {
		return 0, io.EOF
	}
	e := r.events[0]
	r.events = r.events[1:]
	if countContentEvents(e) > 0 {
		*r.clock = r.clock.Add(r.wait)
	} else {
		*r.clock = r.clock.Add(r.tail)
	}
	return copy(p, e), nil
}

// slowWriter advances *clock by each write: a client that reads slowly
// holds the router in Write.
type slowWriter struct {
	*httptest.ResponseRecorder
	clock *time.Time
	per   time.Duration
}

func (w slowWriter) Write(b []byte) (int, error) {
	*w.clock = w.clock.Add(w.per)
	return w.ResponseRecorder.Write(b)
}

// pacedEvents is a backend streaming in real time: its i-th SSE event is
// sent at start + i x every, and a Read returns the next event, blocking
// (advancing *clock) only until it has been sent. A router that comes back
// late finds it waiting.
type pacedEvents struct {
	events [][]byte
	clock  *time.Time
	start  time.Time
	every  time.Duration
	next   int
}

func (r *pacedEvents) Read(p []byte) (int, error) {
	if r.next == len(r.events) {
		return 0, io.EOF
	}
	if sent := r.start.Add(time.Duration(r.next) * r.every); r.clock.Before(sent) {
		*r.clock = sent
	}
	e := r.events[r.next]
	r.next++
	return copy(p, e), nil
}

// TestCopyTimesBothEnds: the fake-stream check's wait is the time the
// router spent blocked on its two ends, the backend's Read and the
// client's Write, between the first and the last content event. A
// buffered stream copied to a fast client waited nothing (fake); a real
// stream waited for each token; a real stream to a client that reads
// slowly finds each next token already there, and would look buffered if
// the client's time were left out (it was, before: fake_stream flagged
// it); the wait for the usage chunk and [DONE] after the last token is not
// counted.
func TestCopyTimesBothEnds(t *testing.T) {
	tokens := make([]string, 40)
	for i := range tokens {
		tokens[i] = "tok"
	}
	events := func() [][]byte {
		var out [][]byte
		for _, e := range bytes.SplitAfter(sseStream(tokens, 10, 40), []byte("\n\n")) {
			if len(e) > 0 {
				out = append(out, e)
			}
		}
		return out
	}
	for _, tt := range []struct {
		name string
		body func(clock *time.Time) io.Reader
		slow time.Duration // per client write
		want time.Duration
		fake bool
	}{
		{"buffered, fast client", func(c *time.Time) io.Reader { return &clockedEvents{events: events(), clock: c} }, 0, 0, true},
		{"buffered, slow end", func(c *time.Time) io.Reader {
			return &clockedEvents{events: events(), clock: c, tail: time.Second}
		}, 0, 0, true},
		{"streamed, fast client", func(c *time.Time) io.Reader {
			return &clockedEvents{events: events(), clock: c, wait: 2 * time.Millisecond}
		}, 0, 39 * 2 * time.Millisecond, false},
		{"streamed, slow client", func(c *time.Time) io.Reader {
			return &pacedEvents{events: events(), clock: c, start: *c, every: 2 * time.Millisecond}
		}, 5 * time.Millisecond, 39 * 5 * time.Millisecond, false},
		{"buffered, slow client", func(c *time.Time) io.Reader { return &clockedEvents{events: events(), clock: c} },
			2 * time.Millisecond, 39 * 2 * time.Millisecond, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := time.Unix(1_800_000_000, 0)
			now := func() time.Time { return clock }
			w := slowWriter{httptest.NewRecorder(), &clock, tt.slow}
			meta := responseMeta{checks: true}
			start := clock
			werr, rerr := streamCopy(w, tt.body(&clock), &meta, now)
			if werr != nil || rerr != nil || meta.contentChunks != 40 {
				t.Fatalf("streamCopy: %v %v, %d content events", werr, rerr, meta.contentChunks)
			}
			if meta.check.contentWait != tt.want {
				t.Errorf("waited %v on the backend and the client between the first and last token, want %v (copy took %v)",
					meta.check.contentWait, tt.want, clock.Sub(start))
			}
			if fake := meta.check.contentWait <= fakeStreamSpread; fake != tt.fake {
				t.Errorf("judged fake %v (waited %v, the line at %v), want %v", fake, meta.check.contentWait, fakeStreamSpread, tt.fake)
			}
		})
	}
}
