package route

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// The first-token deadline. A stalled backend accepts a request and never
// sends a first token; without a deadline the router learns of it only
// when the client gives up (typically after 30s), and every request sent
// there in the meantime is lost. So every attempt gets a deadline for its
// first token (the response headers of a non-streaming answer, the first
// content-bearing event of a stream):
//
//	max(StallFloor, StallMultiple x the pool's p95 TTFT)
//
// where the pool's p95 TTFT is the largest p95_ttft_ms of its backends that
// are not open in the decision applied (PoolP95TTFT). When
// it passes, the attempt is ended and reported with the outcome stalled,
// and retried on another backend like a 5xx, as long as nothing reached the
// client: a stream's first bytes are held back until its first content
// event (or until stallPeekMax bytes), so that a backend that sends headers
// and then nothing is retried too.

// Defaults of Settings.StallFloor and Settings.StallMultiple.
const (
	DefaultStallFloor    = 10 * time.Second
	DefaultStallMultiple = 8.0
)

// ErrStalled is the error of an attempt whose backend sent no first token
// within the first-token deadline (a *BackendError wraps it; its Timeout
// reports true, so the default ErrorHandler answers 504).
var ErrStalled = errors.New("route: no first token within the first-token deadline")

// stallPeekMax bounds the bytes of a stream held back while waiting for
// its first content event; past it the stream is passed on and the
// deadline no longer applies.
const stallPeekMax = 64 << 10

// stallDeadline returns the first-token deadline for an attempt in pool p,
// or 0 when the deadline is off.
func (rt *Router) stallDeadline(p *pool) time.Duration {
	if rt.stallFloor <= 0 {
		return 0
	}
	d := rt.stallFloor
	if p95, ok := p.p95TTFT(); ok {
		if scaled := time.Duration(rt.stallMultiple * p95 * float64(time.Millisecond)); scaled > d {
			d = scaled
		}
	}
	return d
}

// p95TTFT is the pool's p95 TTFT in the decision applied (PoolP95TTFT).
func (p *pool) p95TTFT() (float64, bool) { return PoolP95TTFT(p.applied.Load()) }

// PoolP95TTFT is the p95 TTFT a first-token deadline scales with: the
// largest p95_ttft_ms of snap's backends that are not open, and false when
// none has one. The largest, because the deadline is there to catch
// backends that never answer, not slow ones (the slow rule's business): a
// slow backend's long queue waits must not read as stalls. Open backends
// are left out, so a stalled backend's stretched numbers never count.
func PoolP95TTFT(snap *fleetwatch.Snapshot) (float64, bool) {
	best := 0.0
	if snap == nil {
		return 0, false
	}
	for _, b := range snap.Backends {
		if b.P95TTFTMs != nil && *b.P95TTFTMs > best && b.State != fleetwatch.StateOpen {
			best = *b.P95TTFTMs
		}
	}
	return best, best > 0
}

// stallWatch is one attempt's first-token deadline: a context canceled
// with ErrStalled as its cause when the deadline passes before firstToken.
type stallWatch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	d      time.Duration // 0 when the deadline is off
	timer  *time.Timer   // nil until armed, and when the deadline is off
}

// watchStall prepares the deadline of an attempt: its requests use w.ctx,
// arm starts the deadline when the request is sent, and w.end must be
// called once the attempt's body is done with.
func (rt *Router) watchStall(parent context.Context, p *pool) *stallWatch {
	ctx, cancel := context.WithCancelCause(parent)
	return &stallWatch{ctx: ctx, cancel: cancel, d: rt.stallDeadline(p)}
}

// arm starts the deadline. It is called as the request is sent, after its
// send time is read, so that a stalled attempt's duration (from that time)
// is never shorter than the deadline: the time the router spends building
// the request is not the backend's.
func (w *stallWatch) arm() {
	if w.d > 0 && w.timer == nil {
		w.timer = time.AfterFunc(w.d, func() { w.cancel(ErrStalled) })
	}
}

// firstToken stops the deadline, and reports false when it had already
// passed (the attempt is stalled, whatever arrived since).
func (w *stallWatch) firstToken() bool {
	if w.timer == nil || w.timer.Stop() {
		return true
	}
	return !w.stalled()
}

// stalled reports whether the deadline passed.
func (w *stallWatch) stalled() bool { return errors.Is(context.Cause(w.ctx), ErrStalled) }

// end releases the attempt's context.
func (w *stallWatch) end() {
	if w.timer != nil {
		w.timer.Stop()
	}
	w.cancel(context.Canceled)
}

// awaitFirstToken runs the deadline's second half on a response that has
// its headers: a non-streaming 2xx has its first token (the headers); a
// streaming 2xx is read, and held back, until its first content event. It
// returns the error ErrStalled when the deadline passed first; otherwise
// resp's body again yields every byte read, and a.firstToken is when the
// first content event came (zero if the stream ended or the peek limit was
// reached without one). Anything but a 2xx is left alone.
func (rt *Router) awaitFirstToken(resp *http.Response, a *attempt, w *stallWatch) error {
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		w.firstToken()
		return nil
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || w.timer == nil {
		if !w.firstToken() {
			return ErrStalled
		}
		return nil
	}
	var held bytes.Buffer
	buf := make([]byte, 4<<10)
	var readErr error
	for held.Len() < stallPeekMax {
		n, err := resp.Body.Read(buf)
		held.Write(buf[:n])
		if n > 0 && countContentEvents(held.Bytes()) > 0 {
			a.firstToken = rt.now()
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	if !w.firstToken() {
		return ErrStalled
	}
	rest := io.Reader(resp.Body)
	if readErr != nil {
		rest = errReader{readErr}
	}
	resp.Body = &heldBody{r: io.MultiReader(&held, rest), body: resp.Body}
	return nil
}

// heldBody is a response body whose first bytes were read ahead.
type heldBody struct {
	r    io.Reader
	body io.ReadCloser
}

func (h *heldBody) Read(p []byte) (int, error) { return h.r.Read(p) }
func (h *heldBody) Close() error               { return h.body.Close() }

// errReader ends a read-ahead body with the error the read-ahead met
// (io.EOF included).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
