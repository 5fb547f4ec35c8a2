package fakeai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// The OpenAI request and response shapes the fake speaks. Only the fields a
// gateway, a router or a drift probe looks at are modelled; unknown request
// fields are ignored, as real servers do.

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or an array of parts
}

// text returns the message content, joining the text of content parts.
func (m chatMessage) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// generationRequest is the union of the chat and completions request fields.
type generationRequest struct {
	Model         string          `json:"model"`
	Messages      []chatMessage   `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	MaxCompletion *int            `json:"max_completion_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	Seed          *int64          `json:"seed"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Stop          json.RawMessage `json:"stop"`
	Logprobs      json.RawMessage `json:"logprobs"` // chat: bool; completions: int
	TopLogprobs   *int            `json:"top_logprobs"`
	// Echo and PromptLogprobs ask /v1/completions for the prompt's own
	// logprobs (teacher.go).
	Echo           bool            `json:"echo"`
	PromptLogprobs *int            `json:"prompt_logprobs"`
	Tools          json.RawMessage `json:"tools"`       // tool.go
	ToolChoice     json.RawMessage `json:"tool_choice"` // tool.go
}

var errBadRequest = errors.New("fakeai: bad request")

// parseGeneration decodes a chat (chat=true) or completions request into the
// Completer's canonical form. systemPrompt is the first system message of a
// chat request, the shared prefix a prefix cache would hold.
func parseGeneration(r *http.Request, chat bool) (req CompletionRequest, raw generationRequest, systemPrompt string, err error) {
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20)).Decode(&raw); err != nil {
		return req, raw, "", fmt.Errorf("%w: %v", errBadRequest, err)
	}
	req.Model = raw.Model
	if chat {
		if len(raw.Messages) == 0 {
			return req, raw, "", fmt.Errorf("%w: messages is empty", errBadRequest)
		}
		lines := make([]string, len(raw.Messages))
		for i, m := range raw.Messages {
			text := m.text()
			lines[i] = m.Role + ": " + text
			if m.Role == "system" && systemPrompt == "" {
				systemPrompt = text
			}
		}
		req.Prompt = strings.Join(lines, "\n")
	} else {
		var s string
		var list []string
		switch {
		case len(raw.Prompt) == 0:
			return req, raw, "", fmt.Errorf("%w: prompt is missing", errBadRequest)
		case json.Unmarshal(raw.Prompt, &s) == nil:
			req.Prompt = s
		case json.Unmarshal(raw.Prompt, &list) == nil && len(list) > 0:
			req.Prompt = list[0] // one choice per request: the first prompt
		default:
			return req, raw, "", fmt.Errorf("%w: prompt must be a string", errBadRequest)
		}
	}
	switch {
	case raw.MaxCompletion != nil:
		req.MaxTokens = *raw.MaxCompletion
	case raw.MaxTokens != nil:
		req.MaxTokens = *raw.MaxTokens
	}
	if req.MaxTokens < 0 {
		return req, raw, "", fmt.Errorf("%w: max_tokens must be >= 0", errBadRequest)
	}
	if raw.Temperature != nil {
		req.Temperature = *raw.Temperature
	}
	if raw.TopP != nil {
		req.TopP = *raw.TopP
	}
	req.Seed = raw.Seed
	if len(raw.Stop) > 0 && string(raw.Stop) != "null" {
		var one string
		if json.Unmarshal(raw.Stop, &one) == nil {
			req.Stop = []string{one}
		} else if err := json.Unmarshal(raw.Stop, &req.Stop); err != nil {
			return req, raw, "", fmt.Errorf("%w: stop: %v", errBadRequest, err)
		}
	}
	if len(raw.Logprobs) > 0 && string(raw.Logprobs) != "null" {
		if chat {
			var on bool
			if err := json.Unmarshal(raw.Logprobs, &on); err != nil {
				return req, raw, "", fmt.Errorf("%w: logprobs must be a boolean", errBadRequest)
			}
			req.Logprobs = on
			if raw.TopLogprobs != nil {
				req.TopLogprobs = *raw.TopLogprobs
			}
		} else {
			var n int
			if err := json.Unmarshal(raw.Logprobs, &n); err != nil {
				return req, raw, "", fmt.Errorf("%w: logprobs must be an integer", errBadRequest)
			}
			req.Logprobs = true
			req.TopLogprobs = n
		}
	}
	if req.TopLogprobs < 0 || req.TopLogprobs > 20 {
		return req, raw, "", fmt.Errorf("%w: top_logprobs must be in [0, 20]", errBadRequest)
	}
	return req, raw, systemPrompt, nil
}

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails *promptTokenDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

func tokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}

func chatLogprobsOf(toks []TokenLogprob) *chatLogprobs {
	lp := &chatLogprobs{Content: make([]chatTokenLogprob, len(toks))}
	for i, t := range toks {
		top := make([]chatTopLogprob, len(t.Top))
		for k, a := range t.Top {
			top[k] = chatTopLogprob{Token: a.Token, Logprob: a.Logprob, Bytes: tokenBytes(a.Token)}
		}
		lp.Content[i] = chatTokenLogprob{Token: t.Token, Logprob: t.Logprob, Bytes: tokenBytes(t.Token), TopLogprobs: top}
	}
	return lp
}

// completionLogprobs is the legacy completions shape: parallel arrays.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func completionLogprobsOf(toks []TokenLogprob, offset int) *completionLogprobs {
	lp := &completionLogprobs{
		Tokens:        make([]string, len(toks)),
		TokenLogprobs: make([]float64, len(toks)),
		TopLogprobs:   make([]map[string]float64, len(toks)),
		TextOffset:    make([]int, len(toks)),
	}
	for i, t := range toks {
		lp.Tokens[i] = t.Token
		lp.TokenLogprobs[i] = t.Logprob
		top := make(map[string]float64, len(t.Top))
		for _, a := range t.Top {
			top[a.Token] = a.Logprob
		}
		lp.TopLogprobs[i] = top
		lp.TextOffset[i] = offset
		offset += len(t.Token)
	}
	return lp
}

type chatDelta struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content,omitempty"`
	ToolCalls []chatToolCall `json:"tool_calls,omitempty"` // tool.go
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatDelta    `json:"message,omitempty"`
	Delta        *chatDelta    `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// response is a chat.completion, chat.completion.chunk, text_completion or
// a streamed text_completion chunk; Choices holds chatChoice or
// completionChoice values.
type response struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Created           int64  `json:"created"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	Choices           any    `json:"choices"`
	Usage             *usage `json:"usage,omitempty"`
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e errorBody
	e.Error.Message = msg
	e.Error.Type = typ
	e.Error.Code = status
	writeJSON(w, status, e)
}

type embeddingRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Dimensions int             `json:"dimensions"`
}

type embeddingData struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float64 `json:"embedding"`
}

type embeddingResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  usage           `json:"usage"`
}

// embeddingInputs returns the input strings of an embeddings request.
func embeddingInputs(raw json.RawMessage) ([]string, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return nil, fmt.Errorf("%w: input must be a string or an array of strings", errBadRequest)
	}
	return list, nil
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func decodeBody(r *http.Request, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20)).Decode(v); err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	return nil
}
