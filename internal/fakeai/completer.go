package fakeai

// CompletionRequest is the part of an OpenAI-compatible chat or completions
// request that decides its content. The server canonicalises chat messages
// into Prompt ("role: content" lines joined by "\n") so that a Completer sees
// the same input for both endpoints.
type CompletionRequest struct {
	Model       string
	Prompt      string
	MaxTokens   int      // 0: the server's default (16)
	Temperature float64  // 0: greedy
	TopP        float64  // 0 or 1: no nucleus truncation
	Seed        *int64   // nil when absent
	Logprobs    bool     // the client asked for logprobs
	TopLogprobs int      // 0..20
	Stop        []string // stop sequences
}

// TopLogprob is one alternative token at a position.
type TopLogprob struct {
	Token   string
	Logprob float64
}

// TokenLogprob is one generated token with its logprob and the top
// alternatives at its position (most likely first).
type TokenLogprob struct {
	Token   string
	Logprob float64
	Top     []TopLogprob
}

// Completion is what a Completer produced for one request.
type Completion struct {
	Text             string
	Tokens           []TokenLogprob // one per generated token; Text is their concatenation
	FinishReason     string         // "stop" or "length"
	PromptTokens     int
	CompletionTokens int
	// Fingerprint is reported as system_fingerprint; "" omits it.
	Fingerprint string
	// NoLogprobs makes the server omit logprobs even when asked, like an
	// endpoint that does not support them.
	NoLogprobs bool
}

// Completer produces the content of a completion. It must be safe for
// concurrent use. The fake server handles everything else (latency, errors,
// 429s, streaming, cold starts) around it.
type Completer interface {
	Complete(req CompletionRequest) Completion
}
