package fleetwatch

import "time"

// Limits of the outcome event fields (PROTOCOL.md "Outcome event").
const (
	// MaxDurationMs bounds ttft_ms and duration_ms: one hour.
	MaxDurationMs = 3_600_000
	// MaxPrefixLen bounds the prefix hash.
	MaxPrefixLen = 128
	// MaxFingerprintLen bounds the fingerprint.
	MaxFingerprintLen = 256
	// MaxSourceLen bounds the source id.
	MaxSourceLen = 256
	// MaxStreamErrorLen bounds stream_error.
	MaxStreamErrorLen = 64
	// MaxShedLen bounds shed.
	MaxShedLen = 64
	// MaxQuotaResetMs bounds quota_reset_ms: 30 days.
	MaxQuotaResetMs = 30 * 24 * 3_600_000
	// MaxModelLen bounds model_mismatch.
	MaxModelLen = 256
	// MaxSkew is how far ts may be from the collector's clock before it is
	// replaced by the arrival time and counted as skewed.
	MaxSkew = 5 * time.Minute
)

// Event is one outcome event: how one request to one backend ended.
//
// Optional numeric fields that may legitimately be zero carry a Has flag, so
// that "absent" and "0" stay distinct through decode and encode. A non-zero
// value is present whatever its flag says (Event{TTFTMs: 120} carries its
// TTFT): the flag only tells a zero that was sent from one that was not.
// Read presence with the Known methods.
type Event struct {
	Pool    string // required; a valid pool id
	Backend string // required; a valid backend id

	// TS is when the outcome became known. The zero time means absent; the
	// collector then uses the arrival time. Decode returns it in UTC,
	// truncated to the millisecond, the protocol's precision.
	TS time.Time

	Status    int     // HTTP status; 0 when no answer came
	HasStatus bool    // the event carried "status"
	Outcome   Outcome // never OutcomeUnset after Decode: derived from Status when absent

	TTFTMs      float64 // time to first token, ms, in [0, MaxDurationMs]
	HasTTFT     bool
	DurationMs  float64 // time to the last byte, ms, in [0, MaxDurationMs]
	HasDuration bool

	InputTokens  int64 // >= 0; 0 when absent
	OutputTokens int64 // >= 0; 0 when absent

	Cold         bool    // the proxy knows this request hit a cold backend
	RetryAfterMs float64 // the wait the backend's answer stated, ms (internal/retryhint.Parse); 0 when absent
	Prefix       string  // hash of the request's shared prefix; "" when absent
	CacheHit     bool    // the backend reported a prefix-cache hit
	Fingerprint  string  // artefact id the backend reported; "" when absent
	Source       string  // the publishing proxy's id; "" when absent

	// The backend's load when it answered (an extension of the protocol:
	// from an ORCA load report, the backend's metrics or the proxy's own
	// knowledge). Each has a Has flag, because 0 is a meaningful load.
	Running      int64   // requests the backend was running, >= 0
	HasRunning   bool    // the event carried "running"
	Waiting      int64   // requests waiting in the backend's queue, >= 0
	HasWaiting   bool    // the event carried "waiting"
	KVCacheUsage float64 // fraction of the backend's KV cache in use, in [0, 1]
	HasKVCache   bool    // the event carried "kv_cache_usage"

	// Responses checked in passing (an extension of the protocol,
	// docs/PROTOCOL.md "Responses checked in passing (extension)"): what a
	// proxy noticed in the answer's body on its way through.
	StreamError    string // why a 2xx stream failed: StreamErrorEvent or StreamCut; "" when absent
	ModelMismatch  string // the model the answer named, when it is not the one asked for; "" when absent
	ToolCallBroken bool   // a required tool call is missing, or its arguments are not JSON
	FakeStream     bool   // the stream's content arrived all at once, after the first-token wait

	// QuotaResetMs is the wait a quota's retry hint stated when it is
	// longer than retry_after_ms may say (an hour): a spend limit that
	// resets in days. In (MaxDurationMs, MaxQuotaResetMs]; 0 when absent.
	// An extension (docs/PROTOCOL.md "Quotas and sheds"): the analyzer
	// keeps the backend out of quota until then.
	QuotaResetMs float64
	// Shed is set when the request was refused in front of the backend,
	// by a gateway or a scheduler (the reason it gave: an endpoint
	// picker's x-llm-d-request-dropped-reason, a proxy's own 503 with no
	// upstream); such an event never counts for or against the backend.
	// "" when absent. An extension, like QuotaResetMs.
	Shed string
}

// Values of Event.StreamError. Decode accepts any other short string too
// (a newer proxy's reason), so consumers compare against these.
const (
	// StreamErrorEvent: the stream carried an error event after it had
	// started (an OpenAI-style `data: {"error": ...}` line, or Anthropic's
	// `event: error`).
	StreamErrorEvent = "error_event"
	// StreamCut: the stream ended cleanly at the transport level but
	// without a finish reason and without `data: [DONE]`.
	StreamCut = "cut"
)

// HasLoad reports whether e carries any of the load fields.
func (e *Event) HasLoad() bool { return e.RunningKnown() || e.WaitingKnown() || e.KVCacheKnown() }

// StatusKnown, TTFTKnown, DurationKnown, RunningKnown, WaitingKnown and
// KVCacheKnown report whether the field is present: its flag is set or its
// value is not zero.
func (e *Event) StatusKnown() bool   { return e.HasStatus || e.Status != 0 }
func (e *Event) TTFTKnown() bool     { return e.HasTTFT || e.TTFTMs != 0 }
func (e *Event) DurationKnown() bool { return e.HasDuration || e.DurationMs != 0 }
func (e *Event) RunningKnown() bool  { return e.HasRunning || e.Running != 0 }
func (e *Event) WaitingKnown() bool  { return e.HasWaiting || e.Waiting != 0 }
func (e *Event) KVCacheKnown() bool  { return e.HasKVCache || e.KVCacheUsage != 0 }

// Latency reports whether e may contribute a latency sample by its own
// fields: an ok outcome with a TTFT that is not marked cold. The analyzer
// additionally discounts the first event of a new or idle backend.
func (e *Event) Latency() bool { return e.Outcome == OutcomeOK && e.TTFTKnown() && !e.Cold }
