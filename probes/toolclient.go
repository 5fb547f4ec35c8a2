package probes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// canonicalToolChat is the request body of a tool probe; fields in a fixed
// order so that the same prompt always gives the same bytes.
type canonicalToolChat struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Tools       []toolEntry   `json:"tools"`
	ToolChoice  string        `json:"tool_choice"`
	Temperature float64       `json:"temperature"`
	TopP        float64       `json:"top_p"`
	MaxTokens   int           `json:"max_tokens"`
	Seed        int           `json:"seed"`
}

type toolEntry struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// ToolRequestBody is the canonical request of tool prompt i of t: every
// function of the suite offered in OpenAI's `tools` format, the prompt's
// tool_choice, temperature 0, top_p 1, seed 1.
func ToolRequestBody(model string, t *drift.ToolSuite, i int) []byte {
	p := t.Prompts[i]
	tools := make([]toolEntry, len(t.Functions))
	for k, f := range t.Functions {
		tools[k] = toolEntry{Type: "function", Function: toolFunction{Name: f.Name, Description: f.Description, Parameters: f.Parameters}}
	}
	choice := p.ToolChoice
	if choice == "" {
		choice = drift.ToolChoiceAuto
	}
	b, _ := json.Marshal(canonicalToolChat{Model: model, Messages: []chatMessage{{Role: "user", Content: p.Text}},
		Tools: tools, ToolChoice: choice, TopP: 1, MaxTokens: t.MaxTokens, Seed: 1})
	return b
}

// toolChatResponse decodes the part of a chat answer a tool probe judges.
type toolChatResponse struct {
	Choices []struct {
		Message *struct {
			ToolCalls []struct {
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
}

// parseToolCalls reads the tool calls of a chat completion body:
// choices[0].message.tool_calls[].function.{name,arguments}. Arguments
// that are a JSON string are unquoted; any other JSON value is kept as its
// text with NotString set.
func parseToolCalls(body []byte) ([]drift.ToolCall, error) {
	var r toolChatResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", drift.ErrBadResponse, err)
	}
	if len(r.Choices) == 0 || r.Choices[0].Message == nil {
		return nil, fmt.Errorf("%w: no choices[0].message", drift.ErrBadResponse)
	}
	var calls []drift.ToolCall
	for _, tc := range r.Choices[0].Message.ToolCalls {
		c := drift.ToolCall{Name: tc.Function.Name}
		var s string
		if err := json.Unmarshal(tc.Function.Arguments, &s); err == nil {
			c.Arguments = s
		} else {
			c.Arguments, c.NotString = string(tc.Function.Arguments), true
		}
		calls = append(calls, c)
	}
	return calls, nil
}

// ProbeTool sends tool prompt i of t and judges the answer. A 400 answer
// (a backend that does not take tools) is recorded as rejected, not an
// error; any other failure is a probe error.
func (c *Client) ProbeTool(ctx context.Context, model string, t *drift.ToolSuite, i int) (drift.ToolObservation, error) {
	const path = "/v1/chat/completions"
	data, err := c.do(ctx, http.MethodPost, path, ToolRequestBody(model, t, i))
	var pe *drift.ProbeError
	if errors.As(err, &pe) && pe.Kind == drift.ErrKindStatus && pe.Status == http.StatusBadRequest {
		return drift.JudgeTool(t, i, nil, true), nil
	}
	if err != nil {
		return drift.ToolObservation{}, err
	}
	calls, err := parseToolCalls(data)
	if err != nil {
		return drift.ToolObservation{}, &drift.ProbeError{Kind: drift.ErrKindMalformed, Op: "POST " + path, Err: err}
	}
	return drift.JudgeTool(t, i, calls, false), nil
}

// runTools probes every tool prompt once, in order.
func (c *Client) runTools(ctx context.Context, call func() (context.Context, context.CancelFunc), model string, t *drift.ToolSuite) ([]drift.ToolObservation, error) {
	out := make([]drift.ToolObservation, 0, len(t.Prompts))
	for i := range t.Prompts {
		cctx, cancel := call()
		o, err := c.ProbeTool(cctx, model, t, i)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}
