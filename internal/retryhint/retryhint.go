// Package retryhint parses provider retry hints: how long a throttled (or
// unavailable) backend says to wait before the next request, from wherever
// its API puts it. The one parser shared by feed/route and the ingest
// adapters, so that a 429 means the same retry_after_ms whichever path
// reports it. A leaf: it imports the standard library only.
package retryhint

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"time"
)

// Provider retry hints: how long a throttled (or unavailable) backend says
// to wait before the next request, from wherever its API puts it. The one
// parser shared by feed/route and the ingest adapters, so that a 429 means
// the same retry_after_ms whichever path reports it.

// MaxMs caps a stated wait: one hour, the longest a throttled
// breaker stays open for a retry-after. A larger value is capped, never
// trusted beyond it.
const MaxMs = 3_600_000

// MaxQuotaMs caps a stated wait beyond MaxMs: 30 days, the bound of an
// event's quota_reset_ms.
const MaxQuotaMs = 30 * 24 * 3_600_000

// Sources of a retry hint, in the order of preference Parse takes
// them: the first that yields a wait wins. They are also the values of the
// malformed-hint metrics' source label, so the set is fixed.
const (
	RetryAfterMs      = "retry-after-ms"             // Azure OpenAI, ms
	RetryAfter        = "retry-after"                // RFC 9110: seconds or an HTTP date
	ResetRequests     = "x-ratelimit-reset-requests" // OpenAI: "6m0s", "20ms", "0.5"
	ResetTokens       = "x-ratelimit-reset-tokens"
	AnthropicRequests = "anthropic-ratelimit-requests-reset" // Anthropic: RFC 3339
	AnthropicTokens   = "anthropic-ratelimit-tokens-reset"
	AnthropicInput    = "anthropic-ratelimit-input-tokens-reset"
	AnthropicOutput   = "anthropic-ratelimit-output-tokens-reset"
	BodyRetryDelay    = "body.retryDelay" // Google RetryInfo.retryDelay in a JSON error body
)

// MaxBody is how much of a body Parse scans; callers
// read at most this much of a response for it.
const MaxBody = 64 << 10

// Sources lists every source, for pre-registering metrics.
var Sources = []string{RetryAfterMs, RetryAfter, ResetRequests, ResetTokens,
	AnthropicRequests, AnthropicTokens, AnthropicInput, AnthropicOutput, BodyRetryDelay}

// Hint is the wait a response states.
type Hint struct {
	// Ms is the wait in milliseconds, in (0, MaxMs]; 0 when the
	// response states none.
	Ms float64
	// Source is where Ms came from (one of Sources), "" when
	// Ms is 0.
	Source string
	// Malformed lists the sources that were present but did not parse (or
	// were negative) and were therefore ignored; a caller counts them.
	Malformed []string
	// QuotaMs is the stated wait when it is longer than MaxMs, in
	// (MaxMs, MaxQuotaMs]: a quota that resets in hours or days (the
	// quota_reset_ms of the event); 0 otherwise.
	QuotaMs float64
}

// rateLimitResets are the per-limit reset headers of one provider with the
// remaining-count header that says which limit ran out.
type rateLimitReset struct{ reset, remaining string }

var (
	openAIResets = []rateLimitReset{
		{ResetRequests, "x-ratelimit-remaining-requests"},
		{ResetTokens, "x-ratelimit-remaining-tokens"},
	}
	anthropicResets = []rateLimitReset{
		{AnthropicRequests, "anthropic-ratelimit-requests-remaining"},
		{AnthropicTokens, "anthropic-ratelimit-tokens-remaining"},
		{AnthropicInput, "anthropic-ratelimit-input-tokens-remaining"},
		{AnthropicOutput, "anthropic-ratelimit-output-tokens-remaining"},
	}
)

// Parse reads the wait a response of the given HTTP status
// states. header returns a response header's value by its (lower-case)
// name, "" when absent; body, which may be nil, returns the start of the
// response body and is only called for a 429 or 503 that no header
// answered (the caller bounds it; at most 64 KiB of it is scanned). now is
// when the answer came, for HTTP dates and RFC 3339 reset times; the zero
// time means unknown, and those forms then state no wait.
//
// Sources, first that yields a wait wins:
//
//  1. retry-after-ms: milliseconds (Azure OpenAI).
//  2. Retry-After: seconds, or an HTTP date (wait = date - now).
//  3. For a 429 only: x-ratelimit-reset-requests and -tokens (OpenAI), Go
//     durations ("6m0s", "1m30.5s", "20ms") or plain seconds ("0.5").
//  4. For a 429 only: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-reset, RFC 3339 times (wait = time - now).
//  5. For a 429 or 503: a "retryDelay" in the body ("30s", protobuf's
//     Duration as JSON): Google's RetryInfo detail, a top-level or
//     error-level retryDelay, or one inside an error message string that
//     embeds the provider's JSON (LiteLLM passes errors on that way).
//
// The reset headers of 3 and 4 come on every answer, so they only say when
// to come back on a 429. Of several reset headers of one provider, the
// larger wait of the limits whose remaining count is 0 is taken, or the
// larger of all when no remaining count says which limit ran out: waiting
// for the longer reset is the one wait after which the request can succeed.
//
// A value above MaxMs is capped in Ms and kept in QuotaMs (at most
// MaxQuotaMs): a spend limit that resets in days; zero, or a time already past,
// states no wait; a negative or unparsable value is ignored and listed in
// Malformed.
func Parse(status int, header func(string) string, body func() []byte, now time.Time) Hint {
	var h Hint
	if v := strings.TrimSpace(header(RetryAfterMs)); v != "" {
		if ms, ok := parseHintNumber(v, 1); !ok {
			h.Malformed = append(h.Malformed, RetryAfterMs)
		} else if ms > 0 {
			return h.with(ms, RetryAfterMs)
		}
	}
	if v := strings.TrimSpace(header(RetryAfter)); v != "" {
		if ms, ok := parseRetryAfter(v, now); !ok {
			h.Malformed = append(h.Malformed, RetryAfter)
		} else if ms > 0 {
			return h.with(ms, RetryAfter)
		}
	}
	if status == 429 {
		if ms, src := h.largestReset(openAIResets, header, parseHintDuration); ms > 0 {
			return h.with(ms, src)
		}
		parseTime := func(v string) (float64, bool) {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return 0, false
			}
			if now.IsZero() {
				return 0, true
			}
			return float64(t.Sub(now)) / float64(time.Millisecond), true // past: <= 0, no wait
		}
		if ms, src := h.largestReset(anthropicResets, header, parseTime); ms > 0 {
			return h.with(ms, src)
		}
	}
	if (status == 429 || status == 503) && body != nil {
		if v, found := findRetryDelay(body()); found {
			if ms, ok := parseHintDuration(v); !ok {
				h.Malformed = append(h.Malformed, BodyRetryDelay)
			} else if ms > 0 {
				return h.with(ms, BodyRetryDelay)
			}
		}
	}
	return h
}

func (h Hint) with(ms float64, source string) Hint {
	h.Ms, h.Source = min(ms, MaxMs), source
	if ms > MaxMs {
		h.QuotaMs = min(ms, MaxQuotaMs)
	}
	return h
}

// largestReset reads a provider's reset headers (see Parse).
func (h *Hint) largestReset(resets []rateLimitReset, header func(string) string,
	parse func(string) (float64, bool)) (ms float64, source string) {
	var exhaustedMs, anyMs float64
	var exhaustedSrc, anySrc string
	for _, r := range resets {
		v := strings.TrimSpace(header(r.reset))
		if v == "" {
			continue
		}
		wait, ok := parse(v)
		if !ok || math.IsNaN(wait) {
			h.Malformed = append(h.Malformed, r.reset)
			continue
		}
		if wait <= 0 {
			continue
		}
		if wait > anyMs {
			anyMs, anySrc = wait, r.reset
		}
		if strings.TrimSpace(header(r.remaining)) == "0" && wait > exhaustedMs {
			exhaustedMs, exhaustedSrc = wait, r.reset
		}
	}
	if exhaustedMs > 0 {
		return exhaustedMs, exhaustedSrc
	}
	return anyMs, anySrc
}

// parseHintNumber parses a non-negative finite number times unit (ms per
// unit); false for anything else.
func parseHintNumber(v string, unit float64) (float64, bool) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0) || math.IsInf(f, 0) {
		return 0, false
	}
	return f * unit, true
}

// parseHintDuration parses a Go-style duration ("6m0s", "1m30.5s", "20ms",
// protobuf's "30s") or plain seconds, in ms; false for negative or
// unparsable values.
func parseHintDuration(v string) (float64, bool) {
	if ms, ok := parseHintNumber(v, 1000); ok {
		return ms, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false
	}
	return float64(d) / float64(time.Millisecond), true
}

// httpDateLayouts are the HTTP-date forms of RFC 9110 section 5.6.7, as
// net/http.ParseTime accepts them.
var httpDateLayouts = []string{"Mon, 02 Jan 2006 15:04:05 GMT", "Monday, 02-Jan-06 15:04:05 GMT", time.ANSIC}

// parseRetryAfter parses Retry-After: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (float64, bool) {
	if ms, ok := parseHintNumber(v, 1000); ok {
		return ms, true
	}
	for _, layout := range httpDateLayouts {
		if t, err := time.Parse(layout, v); err == nil {
			if now.IsZero() {
				return 0, true
			}
			return float64(t.Sub(now)) / float64(time.Millisecond), true // past: no wait
		}
	}
	return 0, false
}

var keyRetryDelay = []byte("retryDelay")

// findRetryDelay finds the first "retryDelay" key of a JSON body and
// returns its string value. It scans rather than decodes, so that the same
// code reads Google's RetryInfo detail, a top-level or error-level field,
// one escaped inside an error message string ({"error":{"message":
// "... {\"retryDelay\": \"30s\"} ..."}}), and a body cut short by the
// caller's read limit. found is false when there is no such key; a key
// followed by no string yields found with an empty (malformed) value.
func findRetryDelay(body []byte) (value string, found bool) {
	body = body[:min(len(body), MaxBody)]
	for {
		i := bytes.Index(body, keyRetryDelay)
		if i < 0 {
			return "", false
		}
		rest := body[i+len(keyRetryDelay):]
		body = rest
		// The key ends with a quote (escaped or not) and a colon follows.
		j := 0
		for j < len(rest) && (rest[j] == '\\' || rest[j] == '"') {
			j++
		}
		if j == 0 {
			continue // retryDelayX, or the word in prose
		}
		for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\r' || rest[j] == '\n') {
			j++
		}
		if j >= len(rest) || rest[j] != ':' {
			continue
		}
		j++
		for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\r' || rest[j] == '\n' || rest[j] == '\\' || rest[j] == '"') {
			j++
		}
		k := j
		for k < len(rest) && rest[k] != '"' && rest[k] != '\\' && rest[k] != ',' && rest[k] != '}' && rest[k] != ' ' {
			k++
		}
		return string(rest[j:k]), true
	}
}
