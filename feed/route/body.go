package route

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// maxMetaScan bounds how much of a non-streaming body is kept to read usage
// and system_fingerprint from.
const maxMetaScan = 1 << 20

// Response bodies on their way through the router: copied untouched
// (flushed per read for SSE), and scanned without decoding for what the
// outcome event needs: the first content-bearing chunk (TTFT), token usage,
// prefix-cache hits and system_fingerprint.

// copyBuffers holds the 32 KiB buffers bodies are copied through.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// responseMeta is what the router learns from a response body on its way
// through.
type responseMeta struct {
	firstContent     time.Time // first content-bearing chunk (streams) or headers
	contentChunks    int64
	promptTokens     int64
	completionTokens int64
	cachedTokens     int64
	fingerprint      string

	// The checks in passing (check.go), when on.
	checks bool
	check  streamCheck
	model  string // the first "model" the body named
	kept   []byte // a non-streaming body's first maxMetaScan bytes
}

// streamCopy copies an SSE stream to w, flushing after every read, and
// records when the first content-bearing event passed. It never changes a
// byte. It returns the error writing to the client and the error reading
// from the backend (io.EOF is not an error).
func streamCopy(w http.ResponseWriter, body io.Reader, meta *responseMeta, now func() time.Time) (writeErr, readErr error) {
	rc := http.NewResponseController(w)
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	// waited is the time blocked on either end since the first content
	// event (checks on): in the backend body's Read, and in the client's
	// Write and Flush. A client that reads slowly holds the router in
	// Write while the backend's next tokens pile up in the connection, so
	// the Reads that follow return at once: without the client's time, a
	// real stream would look buffered (fake_stream).
	var waited time.Duration
	for {
		timed := meta.checks && meta.contentChunks > 0
		var asked time.Time
		if timed {
			asked = now()
		}
		n, err := body.Read(buf)
		if timed {
			waited += now().Sub(asked)
		}
		if n > 0 {
			chunk := buf[:n]
			if c := countContentEvents(chunk); c > 0 {
				if meta.contentChunks == 0 {
					meta.firstContent = now()
				}
				meta.check.contentWait = waited
				meta.contentChunks += int64(c)
			}
			scanMeta(chunk, meta)
			if meta.checks {
				if meta.model == "" {
					meta.model = servedModel(chunk)
				}
				meta.check.scan(chunk)
			}
			var writing time.Time
			if meta.checks && meta.contentChunks > 0 {
				writing = now()
			}
			if _, werr := w.Write(chunk); werr != nil {
				return werr, nil
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr, nil
			}
			if !writing.IsZero() {
				waited += now().Sub(writing)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
	}
}

// plainCopy copies a non-streaming body to w, reading usage and the
// fingerprint from its first maxMetaScan bytes.
func plainCopy(w io.Writer, body io.Reader, meta *responseMeta) (writeErr, readErr error) {
	var kept bytes.Buffer
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if kept.Len() < maxMetaScan {
				kept.Write(buf[:min(n, maxMetaScan-kept.Len())])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr, nil
			}
		}
		if err != nil {
			scanMeta(kept.Bytes(), meta)
			if meta.checks {
				meta.kept = kept.Bytes()
				meta.model = servedModel(meta.kept)
			}
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
	}
}

var (
	keyContent     = []byte(`"content":"`)
	keyText        = []byte(`"text":"`)
	keyPrompt      = []byte(`"prompt_tokens":`)
	keyCompletion  = []byte(`"completion_tokens":`)
	keyCached      = []byte(`"cached_tokens":`)
	keyFingerprint = []byte(`"system_fingerprint":"`)
	keyData        = []byte("data: ")
)

// countContentEvents counts the SSE events in chunk that carry generated
// text: a non-empty "content" (chat) or "text" (completions) string. The
// role-only first chunk of a chat stream does not count, so the first
// counted event is the first token. An event split across two reads may be
// missed; that delays TTFT by one chunk at worst.
func countContentEvents(chunk []byte) int {
	n := 0
	for len(chunk) > 0 {
		i := bytes.Index(chunk, keyData)
		if i < 0 {
			return n
		}
		chunk = chunk[i+len(keyData):]
		end := bytes.IndexByte(chunk, '\n')
		line := chunk
		if end >= 0 {
			line = chunk[:end]
		}
		if nonEmptyString(line, keyContent) || nonEmptyString(line, keyText) {
			n++
		}
		if end < 0 {
			return n
		}
		chunk = chunk[end:]
	}
	return n
}

func nonEmptyString(line, key []byte) bool {
	for {
		i := bytes.Index(line, key)
		if i < 0 {
			return false
		}
		line = line[i+len(key):]
		if len(line) > 0 && line[0] != '"' {
			return true
		}
	}
}

// scanMeta picks usage numbers and system_fingerprint out of JSON bytes
// without decoding them; the last occurrence wins (the usage chunk of a
// stream comes last).
func scanMeta(b []byte, meta *responseMeta) {
	if v, ok := lastInt(b, keyPrompt); ok {
		meta.promptTokens = v
	}
	if v, ok := lastInt(b, keyCompletion); ok {
		meta.completionTokens = v
	}
	if v, ok := lastInt(b, keyCached); ok {
		meta.cachedTokens = v
	}
	if meta.fingerprint == "" {
		if i := bytes.Index(b, keyFingerprint); i >= 0 {
			rest := b[i+len(keyFingerprint):]
			// An escaped fingerprint would be cut at its first escaped
			// quote; real ones are plain tokens, so one with a backslash is
			// left out rather than reported wrong.
			if j := bytes.IndexByte(rest, '"'); j > 0 && j <= fleetwatch.MaxFingerprintLen && bytes.IndexByte(rest[:j], '\\') < 0 {
				meta.fingerprint = string(rest[:j])
			}
		}
	}
}

func lastInt(b, key []byte) (int64, bool) {
	i := bytes.LastIndex(b, key)
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(b[i+len(key):], " ")
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	v, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return v, err == nil
}
