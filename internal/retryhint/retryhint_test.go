package retryhint

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseRetryHint(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	h := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	google := `{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},` +
		`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`
	tests := []struct {
		name   string
		status int
		header map[string]string
		body   string
		want   Hint
	}{
		{"nothing", 429, nil, "", Hint{}},
		{"retry-after-ms", 429, h("retry-after-ms", "1500"), "", Hint{Ms: 1500, Source: RetryAfterMs}},
		{"retry-after-ms fraction", 503, h("retry-after-ms", "12.5"), "", Hint{Ms: 12.5, Source: RetryAfterMs}},
		{"retry-after-ms wins over retry-after", 429, h("retry-after-ms", "1500", "retry-after", "2"), "",
			Hint{Ms: 1500, Source: RetryAfterMs}},
		{"retry-after seconds", 429, h("retry-after", "2"), "", Hint{Ms: 2000, Source: RetryAfter}},
		{"retry-after on a 500", 500, h("retry-after", " 7 "), "", Hint{Ms: 7000, Source: RetryAfter}},
		{"retry-after date", 503, h("retry-after", now.Add(3*time.Second).Format(http.TimeFormat)), "",
			Hint{Ms: 3000, Source: RetryAfter}},
		{"retry-after ANSI C date", 503, h("retry-after", now.Add(4*time.Second).Format(time.ANSIC)), "",
			Hint{Ms: 4000, Source: RetryAfter}},
		{"retry-after date past", 429, h("retry-after", now.Add(-time.Minute).Format(http.TimeFormat)), "", Hint{}},
		{"retry-after zero", 429, h("retry-after", "0"), "", Hint{}},
		{"retry-after garbage", 429, h("retry-after", "soon"), "", Hint{Malformed: []string{RetryAfter}}},
		{"retry-after negative", 429, h("retry-after", "-5"), "", Hint{Malformed: []string{RetryAfter}}},
		{"retry-after NaN", 429, h("retry-after", "NaN"), "", Hint{Malformed: []string{RetryAfter}}},
		{"retry-after Inf", 429, h("retry-after", "+Inf"), "", Hint{Malformed: []string{RetryAfter}}},
		{"retry-after capped, a quota", 429, h("retry-after", "99999999"), "", Hint{Ms: MaxMs, Source: RetryAfter, QuotaMs: MaxQuotaMs}},
		{"retry-after-ms capped", 429, h("retry-after-ms", "1e300"), "", Hint{Ms: MaxMs, Source: RetryAfterMs, QuotaMs: MaxQuotaMs}},
		// A spend limit's retry-after-ms, from an Azure OpenAI deployment
		// (kandev #3811): 3.2 days.
		{"retry-after-ms of a spend limit", 429, h("retry-after-ms", "274579000"), "",
			Hint{Ms: MaxMs, Source: RetryAfterMs, QuotaMs: 274_579_000}},
		{"retry-after just over an hour", 429, h("retry-after", "3601"), "", Hint{Ms: MaxMs, Source: RetryAfter, QuotaMs: 3_601_000}},
		{"malformed ms falls back to retry-after", 429, h("retry-after-ms", "x", "retry-after", "3"), "",
			Hint{Ms: 3000, Source: RetryAfter, Malformed: []string{RetryAfterMs}}},

		{"openai requests 2m0s", 429, h("x-ratelimit-reset-requests", "2m0s"), "", Hint{Ms: 120_000, Source: ResetRequests}},
		{"openai 1m30.5s", 429, h("x-ratelimit-reset-tokens", "1m30.5s"), "", Hint{Ms: 90_500, Source: ResetTokens}},
		{"openai 20ms", 429, h("x-ratelimit-reset-tokens", "20ms"), "", Hint{Ms: 20, Source: ResetTokens}},
		{"openai plain seconds", 429, h("x-ratelimit-reset-requests", "0.5"), "", Hint{Ms: 500, Source: ResetRequests}},
		{"openai 6m0s", 429, h("x-ratelimit-reset-requests", "6m0s"), "", Hint{Ms: 360_000, Source: ResetRequests}},
		{"openai both: the larger", 429, h("x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "6m0s"), "",
			Hint{Ms: 360_000, Source: ResetTokens}},
		{"openai both: the exhausted limit", 429, h("x-ratelimit-reset-requests", "1s", "x-ratelimit-remaining-requests", "0",
			"x-ratelimit-reset-tokens", "6m0s", "x-ratelimit-remaining-tokens", "15000"), "",
			Hint{Ms: 1000, Source: ResetRequests}},
		{"openai capped", 429, h("x-ratelimit-reset-requests", "30h"), "", Hint{Ms: MaxMs, Source: ResetRequests, QuotaMs: 30 * 3_600_000}},
		{"openai on a 200 is no wait", 200, h("x-ratelimit-reset-requests", "2m0s"), "", Hint{}},
		{"openai on a 503 is no wait", 503, h("x-ratelimit-reset-requests", "2m0s"), "", Hint{}},
		{"openai malformed", 429, h("x-ratelimit-reset-requests", "2 minutes", "x-ratelimit-reset-tokens", "-1s"), "",
			Hint{Malformed: []string{ResetRequests, ResetTokens}}},
		{"openai malformed, the other taken", 429, h("x-ratelimit-reset-requests", "2 minutes", "x-ratelimit-reset-tokens", "3s"), "",
			Hint{Ms: 3000, Source: ResetTokens, Malformed: []string{ResetRequests}}},
		{"retry-after wins over openai", 429, h("retry-after", "1", "x-ratelimit-reset-requests", "2m0s"), "",
			Hint{Ms: 1000, Source: RetryAfter}},

		{"anthropic requests", 429, h("anthropic-ratelimit-requests-reset", "2026-12-03T08:00:45Z"), "",
			Hint{Ms: 45_000, Source: AnthropicRequests}},
		{"anthropic fraction and zone", 429, h("anthropic-ratelimit-output-tokens-reset", "2026-12-03T09:00:01.5+01:00"), "",
			Hint{Ms: 1500, Source: AnthropicOutput}},
		{"anthropic the larger", 429, h("anthropic-ratelimit-requests-reset", "2026-12-03T08:00:10Z",
			"anthropic-ratelimit-tokens-reset", "2026-12-03T08:01:00Z", "anthropic-ratelimit-input-tokens-reset", "2026-12-03T08:00:20Z"), "",
			Hint{Ms: 60_000, Source: AnthropicTokens}},
		{"anthropic the exhausted", 429, h("anthropic-ratelimit-requests-reset", "2026-12-03T08:00:10Z",
			"anthropic-ratelimit-input-tokens-reset", "2026-12-03T08:00:20Z", "anthropic-ratelimit-input-tokens-remaining", "0",
			"anthropic-ratelimit-tokens-reset", "2026-12-03T08:01:00Z"), "",
			Hint{Ms: 20_000, Source: AnthropicInput}},
		{"anthropic past", 429, h("anthropic-ratelimit-requests-reset", "2026-12-03T07:59:00Z"), "", Hint{}},
		{"anthropic capped", 429, h("anthropic-ratelimit-requests-reset", "2027-01-01T00:00:00Z"), "",
			Hint{Ms: MaxMs, Source: AnthropicRequests, QuotaMs: 2_476_800_000}},
		{"anthropic malformed", 429, h("anthropic-ratelimit-tokens-reset", "in a minute"), "",
			Hint{Malformed: []string{AnthropicTokens}}},
		{"anthropic's retry-after wins", 429, h("retry-after", "5", "anthropic-ratelimit-requests-reset", "2026-12-03T08:00:45Z"), "",
			Hint{Ms: 5000, Source: RetryAfter}},

		{"google RetryInfo", 429, nil, google, Hint{Ms: 30_000, Source: BodyRetryDelay}},
		{"google on a 503", 503, nil, google, Hint{Ms: 30_000, Source: BodyRetryDelay}},
		{"google array and fraction", 429, nil, `[{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay": "1.500s"}]}}]`,
			Hint{Ms: 1500, Source: BodyRetryDelay}},
		{"top-level retryDelay", 429, nil, `{"retryDelay":"180s"}`, Hint{Ms: 180_000, Source: BodyRetryDelay}},
		{"error-level retryDelay", 429, nil, `{"error":{"message":"slow down","retryDelay":"12s"}}`, Hint{Ms: 12_000, Source: BodyRetryDelay}},
		{"litellm passthrough in a message", 429, nil,
			`{"error":{"message":"litellm.RateLimitError: VertexAIException - {\n  \"error\": {\n    \"details\": [{\"@type\": \"type.googleapis.com/google.rpc.RetryInfo\", \"retryDelay\": \"45s\"}]}}","type":null,"code":"429"}}`,
			Hint{Ms: 45_000, Source: BodyRetryDelay}},
		{"prose mention is not a key", 429, nil, `{"error":{"message":"honour retryDelay please"}}`, Hint{}},
		{"body capped", 429, nil, `{"retryDelay":"86400s"}`, Hint{Ms: MaxMs, Source: BodyRetryDelay, QuotaMs: 86_400_000}},
		{"body malformed", 429, nil, `{"retryDelay":"soon"}`, Hint{Malformed: []string{BodyRetryDelay}}},
		{"body not a string", 429, nil, `{"retryDelay":{"seconds":30}}`, Hint{Malformed: []string{BodyRetryDelay}}},
		{"body zero", 429, nil, `{"retryDelay":"0s"}`, Hint{}},
		{"body on a 500 not read", 500, nil, google, Hint{}},
		{"body on a 200 not read", 200, nil, google, Hint{}},
		{"body not json", 429, nil, "Too Many Requests", Hint{}},
		{"body cut short", 429, nil, `{"error":{"details":[{"retryDelay":"3`, Hint{Ms: 3000, Source: BodyRetryDelay}},
		{"header wins over body", 429, h("x-ratelimit-reset-requests", "2s"), google, Hint{Ms: 2000, Source: ResetRequests}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			header := func(k string) string {
				if k != strings.ToLower(k) {
					t.Errorf("header %q asked for in mixed case", k)
				}
				return tc.header[k]
			}
			bodyRead := false
			body := func() []byte { bodyRead = true; return []byte(tc.body) }
			got := Parse(tc.status, header, body, now)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if bodyRead && tc.status != 429 && tc.status != 503 {
				t.Errorf("the body of a %d was read", tc.status)
			}
		})
	}
}

// A header answer never reads the body: route reads it only when needed.
func TestParseRetryHintReadsTheBodyLast(t *testing.T) {
	header := http.Header{"Retry-After": {"3"}}
	got := Parse(429, header.Get, func() []byte { t.Fatal("body read"); return nil }, time.Now())
	if got.Ms != 3000 {
		t.Errorf("Ms = %v, want 3000", got.Ms)
	}
	if got := Parse(429, header.Get, nil, time.Now()); got.Ms != 3000 {
		t.Errorf("nil body: Ms = %v, want 3000", got.Ms)
	}
}

// A body longer than MaxBody is scanned only that far.
func TestParseRetryHintBodyBound(t *testing.T) {
	long := `{"error":{"message":"` + strings.Repeat("x", MaxBody) + `","retryDelay":"30s"}}`
	got := Parse(429, func(string) string { return "" }, func() []byte { return []byte(long) }, time.Now())
	if diff := cmp.Diff(Hint{}, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// Without a clock the time forms state no wait (and are not malformed);
// the relative forms still do.
func TestParseRetryHintUnknownNow(t *testing.T) {
	header := http.Header{
		"Retry-After":                      {"Wed, 02 Dec 2026 08:00:03 GMT"},
		"Anthropic-Ratelimit-Tokens-Reset": {"2026-12-03T08:00:45Z"},
		"X-Ratelimit-Reset-Tokens":         {"1s"},
	}
	got := Parse(429, header.Get, nil, time.Time{})
	if diff := cmp.Diff(Hint{Ms: 1000, Source: ResetTokens}, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	header.Del("X-Ratelimit-Reset-Tokens")
	if got := Parse(429, header.Get, nil, time.Time{}); got.Ms != 0 || len(got.Malformed) != 0 {
		t.Errorf("time forms without a clock: %+v, want no wait", got)
	}
}

func FuzzParseRetryHint(f *testing.F) {
	f.Add(429, "2m0s", "2026-12-03T08:00:45Z", `{"retryDelay":"30s"}`)
	f.Add(503, "x", "", `{"error":{"message":"\"retryDelay\\\": \\\"`)
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, reset, anthropic, body string) {
		header := func(k string) string {
			switch k {
			case ResetRequests, RetryAfter, RetryAfterMs:
				return reset
			case AnthropicTokens:
				return anthropic
			}
			return ""
		}
		got := Parse(status, header, func() []byte { return []byte(body) }, now)
		if !(got.Ms >= 0 && got.Ms <= MaxMs) || (got.Ms > 0) != (got.Source != "") {
			t.Fatalf("hint %+v out of range", got)
		}
	})
}
