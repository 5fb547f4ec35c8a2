package fakeai

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Function calling. A chat request that offers `tools` (OpenAI's format,
// `{"type":"function","function":{"name","description","parameters"}}`)
// is answered by the server's ToolModel: either with
// choices[0].message.tool_calls (finish_reason "tool_calls") or with the
// Completer's text. Tool calls are served in non-streaming answers only; a
// streaming request with tools gets the text.

// ToolSpec is one function a request offers.
type ToolSpec struct {
	Name        string
	Description string
	Parameters  map[string]any // the JSON schema, decoded
}

// ToolRequest is the function-calling part of a chat request.
type ToolRequest struct {
	Tools []ToolSpec
	// Choice is "auto", "none" or "required"; Forced names the function
	// of a {"type":"function","function":{"name":...}} choice.
	Choice string
	Forced string
}

// ToolCall is one call of an answer: the function's name and its
// arguments as a JSON text.
type ToolCall struct {
	Name      string
	Arguments string
}

// Ways a ToolModel breaks a call (ToolModel.Modes).
const (
	BreakInvalidJSON     = "invalid_json"     // arguments cut short: not JSON
	BreakMissingRequired = "missing_required" // a required field left out
	BreakWrongName       = "wrong_name"       // another function's name
	BreakNoCall          = "no_call"          // text instead of the call
)

// BreakModes are every way a ToolModel can break a call.
var BreakModes = []string{BreakInvalidJSON, BreakMissingRequired, BreakWrongName, BreakNoCall}

// ToolModel answers requests that offer tools. Its reference behaviour is
// deterministic: it calls the function whose name and description share
// the most words with the prompt (none shared: no call under tool_choice
// "auto"), with arguments built from the function's schema and the
// prompt's words, numbers, dates and quoted strings. The artefact makes
// some prompts hard (Hard), where a call goes wrong with probability
// HardError per request, the same way for that artefact every time. Break
// spoils a fraction of the calls the way a broken artefact or chat
// template does. The zero value answers every prompt right. It is safe for
// concurrent use.
type ToolModel struct {
	// Artefact decides which prompts are hard and how they go wrong.
	Artefact uint64
	// Hard is the share of prompts the artefact finds hard; HardError the
	// probability that such a prompt is answered wrongly, per request.
	Hard, HardError float64
	// Break is the fraction of calls broken, per request, by one of Modes
	// (drawn per request; empty: all of BreakModes).
	Break float64
	Modes []string
	// Seed seeds the per-request draws.
	Seed uint64

	calls atomic.Uint64
}

// toolAnswer is the reference answer to one prompt and set of tools, the
// same for every artefact.
type toolAnswer struct {
	best int      // the function to call, -1: none
	args []string // the arguments for each function
}

// answers caches reference answers: the probes ask the same prompts every
// cycle, and building arguments from a schema is the costly part.
var answers struct {
	sync.Mutex // guards m
	m          map[string]toolAnswer
}

// reference returns the reference answer, computed once per prompt and
// tools (told apart by their names, descriptions and choice).
func reference(prompt string, tr ToolRequest) toolAnswer {
	var key strings.Builder
	key.WriteString(tr.Choice + "\x00" + tr.Forced + "\x00" + prompt)
	for _, t := range tr.Tools {
		key.WriteString("\x00" + t.Name + "\x00" + t.Description)
	}
	k := key.String()
	answers.Lock()
	a, ok := answers.m[k]
	answers.Unlock()
	if ok {
		return a
	}
	a = toolAnswer{best: pickTool(prompt, tr)}
	for _, t := range tr.Tools {
		a.args = append(a.args, arguments(t.Parameters, prompt))
	}
	answers.Lock()
	if answers.m == nil || len(answers.m) >= 4096 {
		answers.m = map[string]toolAnswer{} // a crude bound is enough for a fake
	}
	answers.m[k] = a
	answers.Unlock()
	return a
}

// ErrBadTools reports a tools or tool_choice field the fake cannot read.
var ErrBadTools = fmt.Errorf("%w: tools", errBadRequest)

// parseTools reads the tools and tool_choice of a chat request; no tools
// gives a zero ToolRequest.
func parseTools(tools, choice json.RawMessage) (ToolRequest, error) {
	var tr ToolRequest
	if len(tools) == 0 || string(tools) == "null" {
		return tr, nil
	}
	var list []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string         `json:"name"`
			Description string         `json:"description"`
			Parameters  map[string]any `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(tools, &list); err != nil {
		return tr, fmt.Errorf("%w: %v", ErrBadTools, err)
	}
	for i, t := range list {
		if t.Type != "function" || t.Function == nil || t.Function.Name == "" {
			return tr, fmt.Errorf("%w: tools[%d] is not a named function", ErrBadTools, i)
		}
		tr.Tools = append(tr.Tools, ToolSpec{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	tr.Choice = "auto"
	if len(choice) == 0 || string(choice) == "null" {
		return tr, nil
	}
	var s string
	if json.Unmarshal(choice, &s) == nil {
		if s != "auto" && s != "none" && s != "required" {
			return tr, fmt.Errorf("%w: tool_choice %q", ErrBadTools, s)
		}
		tr.Choice = s
		return tr, nil
	}
	var forced struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(choice, &forced); err != nil || forced.Function.Name == "" {
		return tr, fmt.Errorf("%w: tool_choice must be auto, none, required or a function", ErrBadTools)
	}
	tr.Choice, tr.Forced = "required", forced.Function.Name
	return tr, nil
}

// Answer returns the calls that answer prompt (the canonical prompt of a
// CompletionRequest) under tr; none means a text answer.
func (m *ToolModel) Answer(prompt string, tr ToolRequest) []ToolCall {
	if len(tr.Tools) == 0 || tr.Choice == "none" {
		return nil
	}
	n := m.calls.Add(1)
	rng := rand.New(rand.NewPCG(m.Seed, n))
	ref := reference(prompt, tr)
	best := ref.best
	wrong := m.IsHard(prompt) && rng.Float64() < m.HardError
	if best < 0 {
		if wrong { // a hard prompt that needs no call: a spurious call
			i := int(unit(m.Artefact, prompt, "tool") * float64(len(tr.Tools)))
			return []ToolCall{{Name: tr.Tools[i].Name, Arguments: ref.args[i]}}
		}
		return nil
	}
	t := tr.Tools[best]
	call := ToolCall{Name: t.Name, Arguments: ref.args[best]}
	mode := ""
	switch {
	case wrong:
		// how a hard prompt goes wrong is the artefact's, every time
		mode = BreakModes[int(unit(m.Artefact, prompt, "mode")*float64(len(BreakModes)))]
	case m.Break > 0 && rng.Float64() < m.Break:
		modes := m.Modes
		if len(modes) == 0 {
			modes = BreakModes
		}
		mode = modes[rng.IntN(len(modes))]
	}
	if tr.Choice == "required" && mode == BreakNoCall {
		mode = BreakInvalidJSON // a required call cannot be left out
	}
	return breakCall(call, mode, t, tr)
}

// IsHard reports whether the artefact finds prompt hard.
func (m *ToolModel) IsHard(prompt string) bool {
	return m.Hard > 0 && unit(m.Artefact, prompt, "hard") < m.Hard
}

// breakCall spoils a correct call in the given way ("": unchanged).
func breakCall(c ToolCall, mode string, t ToolSpec, tr ToolRequest) []ToolCall {
	switch mode {
	case BreakNoCall:
		return nil
	case BreakInvalidJSON:
		c.Arguments = c.Arguments[:len(c.Arguments)-1]
	case BreakMissingRequired:
		var args map[string]any
		_ = json.Unmarshal([]byte(c.Arguments), &args)
		req := requiredOf(t.Parameters)
		if len(req) == 0 {
			c.Arguments = c.Arguments[:len(c.Arguments)-1]
			break
		}
		delete(args, req[0])
		b, _ := json.Marshal(args)
		c.Arguments = string(b)
	case BreakWrongName:
		i := slices.IndexFunc(tr.Tools, func(s ToolSpec) bool { return s.Name == t.Name })
		if len(tr.Tools) > 1 {
			c.Name = tr.Tools[(i+1)%len(tr.Tools)].Name
		} else {
			c.Name = t.Name + "_v2"
		}
	}
	return []ToolCall{c}
}

// unit is a deterministic draw in [0, 1) of the artefact and prompt.
func unit(artefact uint64, prompt, what string) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%s", artefact, what, prompt)
	return float64(h.Sum64()>>11) / (1 << 53)
}

var wordRE = regexp.MustCompile(`[a-z]+`)

var stopWords = map[string]bool{"what": true, "that": true, "this": true, "with": true, "from": true, "into": true,
	"your": true, "user": true, "please": true, "there": true, "their": true, "have": true, "about": true, "between": true, "another": true}

func words(s string) []string {
	var out []string
	for _, w := range wordRE.FindAllString(strings.ToLower(s), -1) {
		if len(w) >= 4 && !stopWords[w] {
			out = append(out, w)
		}
	}
	return out
}

// pickTool is the index of the function to call, -1 for none: the forced
// one, else the one sharing the most words with the prompt (ties: the
// first), else, under "required", the first.
func pickTool(prompt string, tr ToolRequest) int {
	if tr.Forced != "" {
		return slices.IndexFunc(tr.Tools, func(t ToolSpec) bool { return t.Name == tr.Forced })
	}
	pw := map[string]bool{}
	for _, w := range words(lastUser(prompt)) {
		pw[w] = true
	}
	best, bestScore := -1, 0
	for i, t := range tr.Tools {
		seen := map[string]bool{}
		score := 0
		for _, w := range words(strings.ReplaceAll(t.Name, "_", " ") + " " + t.Description) {
			if pw[w] && !seen[w] {
				seen[w] = true
				score++
			}
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	if best < 0 && tr.Choice == "required" {
		best = 0
	}
	return best
}

// lastUser is the text of the last user message of a canonical chat
// prompt ("role: content" lines).
func lastUser(prompt string) string {
	if i := strings.LastIndex(prompt, "user: "); i >= 0 {
		return prompt[i+len("user: "):]
	}
	return prompt
}

func requiredOf(schema map[string]any) []string {
	var out []string
	if list, ok := schema["required"].([]any); ok {
		for _, x := range list {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

var (
	quotedRE = regexp.MustCompile(`'([^']+)'|"([^"]+)"`)
	emailRE  = regexp.MustCompile(`[\w.+-]+@[\w-]+\.[\w.]+`)
	dateRE   = regexp.MustCompile(`\d{4}-\d{2}-\d{2}`)
	numberRE = regexp.MustCompile(`\d+(\.\d+)?`)
	capsRE   = regexp.MustCompile(`\b[A-Z]{2,5}\b`)
	properRE = regexp.MustCompile(`\b[A-Z][a-z]+\b`)
)

// arguments builds the arguments of a call from the function's schema and
// the prompt: the required properties and the optional ones the prompt
// names, each from what the prompt holds.
func arguments(schema map[string]any, prompt string) string {
	pick := &picker{prompt: lastUser(prompt), used: map[string]bool{}}
	v := pick.object(schema)
	b, _ := json.Marshal(v)
	return string(b)
}

type picker struct {
	prompt string
	used   map[string]bool // strings already given to a property
}

func (p *picker) object(schema map[string]any) map[string]any {
	props, _ := schema["properties"].(map[string]any)
	req := requiredOf(schema)
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	sort.Strings(names)
	out := map[string]any{}
	lower := strings.ToLower(p.prompt)
	for _, name := range names {
		if !slices.Contains(req, name) && !strings.Contains(lower, strings.ToLower(strings.ReplaceAll(name, "_", " "))) {
			continue
		}
		sub, _ := props[name].(map[string]any)
		out[name] = p.value(name, sub)
	}
	return out
}

func (p *picker) value(name string, schema map[string]any) any {
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		for _, e := range enum {
			if s, ok := e.(string); ok && strings.Contains(strings.ToLower(p.prompt), strings.ToLower(s)) {
				return e
			}
		}
		return enum[0]
	}
	typ, _ := schema["type"].(string)
	if list, ok := schema["type"].([]any); ok && len(list) > 0 {
		typ, _ = list[0].(string)
	}
	switch typ {
	case "object":
		return p.object(schema)
	case "array":
		items, _ := schema["items"].(map[string]any)
		return []any{p.value(name, items)}
	case "integer", "number":
		text := dateRE.ReplaceAllString(p.prompt, "")
		for _, m := range numberRE.FindAllString(text, -1) {
			if f, err := strconv.ParseFloat(m, 64); err == nil && !p.used[m] {
				p.used[m] = true
				if typ == "integer" {
					return int64(f)
				}
				return f
			}
		}
		return 1
	case "boolean":
		return strings.Contains(strings.ToLower(p.prompt), strings.ToLower(name))
	}
	return p.text(name)
}

// text picks a string for property name: a date for dates, an address for
// recipients, else the first unused quoted string, code or proper noun.
func (p *picker) text(name string) string {
	var candidates []string
	switch {
	case strings.Contains(name, "date"):
		candidates = dateRE.FindAllString(p.prompt, -1)
	case name == "to" && emailRE.MatchString(p.prompt):
		candidates = emailRE.FindAllString(p.prompt, -1)
	}
	for _, m := range quotedRE.FindAllStringSubmatch(p.prompt, -1) {
		candidates = append(candidates, m[1]+m[2])
	}
	candidates = append(candidates, capsRE.FindAllString(p.prompt, -1)...)
	proper := properRE.FindAllString(p.prompt, -1)
	if len(proper) > 0 {
		candidates = append(candidates, proper[1:]...) // the first word starts the sentence
	}
	for _, c := range candidates {
		if !p.used[c] {
			p.used[c] = true
			return c
		}
	}
	return "unspecified"
}

// chatToolCall is OpenAI's choices[].message.tool_calls[] entry.
type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatToolFunction `json:"function"`
}

type chatToolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // a JSON text, sent as a string
}

// withToolCalls turns a chat choice into a tool-call answer: content null,
// the calls, finish_reason "tool_calls", no logprobs; the usage counts the
// arguments as the completion. No calls leave it unchanged.
func withToolCalls(ch *chatChoice, calls []ToolCall, id string, u *usage) {
	if len(calls) == 0 {
		return
	}
	ch.Message.Content = nil
	ch.Logprobs = nil
	tokens := 0
	for i, c := range calls {
		ch.Message.ToolCalls = append(ch.Message.ToolCalls, chatToolCall{ID: fmt.Sprintf("call_%s_%d", id, i), Type: "function",
			Function: chatToolFunction{Name: c.Name, Arguments: c.Arguments}})
		tokens += CountTokens(c.Name + " " + c.Arguments)
	}
	finish := "tool_calls"
	ch.FinishReason = &finish
	u.CompletionTokens = tokens
	u.TotalTokens = u.PromptTokens + tokens
}

// answerTools reads the request's tools and asks the ToolModel; no tools:
// no calls. An answer with calls takes as long to generate as the calls'
// tokens, not the text's: c's tokens are cut to that many.
func (s *Server) answerTools(raw generationRequest, req CompletionRequest, c *Completion) ([]ToolCall, error) {
	tr, err := parseTools(raw.Tools, raw.ToolChoice)
	if err != nil || len(tr.Tools) == 0 {
		return nil, err
	}
	calls := s.ToolModel().Answer(req.Prompt, tr)
	if len(calls) > 0 {
		n := 0
		for _, call := range calls {
			n += CountTokens(call.Name + " " + call.Arguments)
		}
		c.Tokens = c.Tokens[:min(len(c.Tokens), max(n, 1))]
	}
	return calls, nil
}

// zeroTools answers requests with tools while no ToolModel was set.
var zeroTools = &ToolModel{}

// ToolModel returns the model answering requests with tools.
func (s *Server) ToolModel() *ToolModel {
	s.toolMu.Lock()
	defer s.toolMu.Unlock()
	if s.tools == nil {
		return zeroTools
	}
	return s.tools
}

// SetToolModel replaces the model answering requests with tools (nil: the
// zero ToolModel, every call right).
func (s *Server) SetToolModel(m *ToolModel) {
	s.toolMu.Lock()
	s.tools = m
	s.toolMu.Unlock()
}

// ToolSettings is the JSON of GET and POST /admin/tools: a ToolModel's
// settings.
//
//	{"break": 0.4, "modes": ["invalid_json", "missing_required"]}
type ToolSettings struct {
	Artefact  uint64   `json:"artefact"`
	Hard      float64  `json:"hard"`
	HardError float64  `json:"hard_error"`
	Break     float64  `json:"break"`
	Modes     []string `json:"modes"`
	Seed      uint64   `json:"seed"`
}

// Model returns a new ToolModel of the settings, or an error naming the
// first invalid field.
func (t ToolSettings) Model() (*ToolModel, error) {
	for name, v := range map[string]float64{"hard": t.Hard, "hard_error": t.HardError, "break": t.Break} {
		if !(v >= 0 && v <= 1) {
			return nil, fmt.Errorf("%w: %s = %v: must be in [0, 1]", ErrBadBehavior, name, v)
		}
	}
	for _, m := range t.Modes {
		if !slices.Contains(BreakModes, m) {
			return nil, fmt.Errorf("%w: modes: %q: want one of %s", ErrBadBehavior, m, strings.Join(BreakModes, ", "))
		}
	}
	return &ToolModel{Artefact: t.Artefact, Hard: t.Hard, HardError: t.HardError, Break: t.Break,
		Modes: slices.Clone(t.Modes), Seed: t.Seed}, nil
}

// Settings returns m's settings.
func (m *ToolModel) Settings() ToolSettings {
	return ToolSettings{Artefact: m.Artefact, Hard: m.Hard, HardError: m.HardError, Break: m.Break,
		Modes: slices.Clone(m.Modes), Seed: m.Seed}
}

func (s *Server) toolAdmin(mux *http.ServeMux) {
	mux.HandleFunc("GET /admin/tools", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.ToolModel().Settings())
	})
	mux.HandleFunc("POST /admin/tools", func(w http.ResponseWriter, r *http.Request) {
		var t ToolSettings
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		m, err := t.Model()
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		s.SetToolModel(m)
		writeJSON(w, http.StatusOK, m.Settings())
	})
}
