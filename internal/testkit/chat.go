package testkit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// ChatClient sends OpenAI-style requests to a router (or a backend) under
// test and reads the answers, streamed or not.
type ChatClient struct {
	Base string
	HTTP *http.Client
}

// ChatReply is what a ChatClient read.
type ChatReply struct {
	Status  int
	Backend string // X-Fleetwatch-Backend
	Text    string // content (non-streaming) or the concatenated deltas
	Body    []byte
	Header  http.Header
}

// NewChatClient is a ChatClient for base with a 30 s timeout.
func NewChatClient(base string) *ChatClient {
	return &ChatClient{Base: base, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// Chat posts a chat completion for model llama-3.1-70b, with a system
// message when system is not empty.
func (c *ChatClient) Chat(system, user string, stream bool) (ChatReply, error) {
	msgs := []map[string]string{{"role": "user", "content": user}}
	if system != "" {
		msgs = append([]map[string]string{{"role": "system", "content": system}}, msgs...)
	}
	return c.Post("/v1/chat/completions", map[string]any{
		"model": "llama-3.1-70b", "messages": msgs, "max_tokens": 4, "stream": stream,
		"stream_options": map[string]any{"include_usage": stream},
	})
}

// Post posts body as JSON to path and reads the answer. A body cut off is
// returned as far as it came, with the read error.
func (c *ChatClient) Post(path string, body any) (ChatReply, error) {
	b, _ := json.Marshal(body)
	resp, err := c.HTTP.Post(c.Base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return ChatReply{}, err
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(resp.Body)
	r := ChatReply{Status: resp.StatusCode, Backend: resp.Header.Get("X-Fleetwatch-Backend"), Body: data, Header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var chunk struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &chunk) == nil {
				for _, ch := range chunk.Choices {
					r.Text += ch.Delta.Content
				}
			}
		}
	} else {
		var full struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &full) == nil && len(full.Choices) > 0 {
			r.Text = full.Choices[0].Message.Content
		}
	}
	return r, readErr
}
