package drift

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Tool-call probes: function-calling prompts with JSON-schema tools in the
// OpenAI chat format (`tools`, `tool_choice`; the answer's
// `choices[0].message.tool_calls[].function.{name,arguments}`), judged on
// whether a call is made when it should be, whether the function name is
// right and whether the arguments parse and validate against the schema.
// Their rates are compared with the backend's baseline and its peers
// (toolsignal.go, toolpeers.go).

// ToolFunction is a function the probe offers: OpenAI's
// `tools[].function`.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`

	schema *Schema // parsed Parameters
}

// Schema is the function's parsed parameter schema (nil before the suite
// was validated).
func (f *ToolFunction) Schema() *Schema { return f.schema }

// Tool prompt choices (OpenAI's tool_choice strings).
const (
	ToolChoiceAuto     = "auto"
	ToolChoiceRequired = "required"
)

// ToolPrompt is one function-calling probe.
type ToolPrompt struct {
	ID   string `json:"id"`
	Text string `json:"text"`
	// Expect is the function that should be called; "" means the prompt
	// should be answered without a call.
	Expect string `json:"expect"`
	// ToolChoice is "auto" (the default) or "required".
	ToolChoice string `json:"tool_choice,omitempty"`
}

// ToolSuite is the function-calling part of a suite: the functions
// offered with every tool prompt, and the prompts.
type ToolSuite struct {
	Functions []ToolFunction `json:"functions"`
	Prompts   []ToolPrompt   `json:"prompts"`
	// MaxTokens bounds each answer. If zero, 128.
	MaxTokens int `json:"max_tokens,omitempty"`
}

// maxToolPrompts caps the tool prompts of a suite.
const maxToolPrompts = 64

// validate checks the tool suite and parses its schemas.
func (t *ToolSuite) validate() error {
	if len(t.Functions) == 0 || len(t.Prompts) == 0 || len(t.Prompts) > maxToolPrompts {
		return fmt.Errorf("%w: tools: %d functions and %d prompts, want at least 1 function and 1 to %d prompts",
			ErrSuite, len(t.Functions), len(t.Prompts), maxToolPrompts)
	}
	if t.MaxTokens == 0 {
		t.MaxTokens = 128
	}
	if t.MaxTokens < 1 || t.MaxTokens > 1024 {
		return fmt.Errorf("%w: tools.max_tokens = %d: must be 1..1024", ErrSuite, t.MaxTokens)
	}
	names := map[string]bool{}
	for i := range t.Functions {
		f := &t.Functions[i]
		if f.Name == "" || names[f.Name] {
			return fmt.Errorf("%w: tools.functions[%d].name %q is empty or repeated", ErrSuite, i, f.Name)
		}
		names[f.Name] = true
		if len(f.Parameters) == 0 {
			f.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		s, err := parseSchema(f.Parameters)
		if err != nil {
			return fmt.Errorf("%w: tools.functions[%d] (%s).parameters: %w", ErrSuite, i, f.Name, err)
		}
		f.schema = s
	}
	ids := map[string]bool{}
	calls := 0
	for i := range t.Prompts {
		p := &t.Prompts[i]
		switch {
		case p.ID == "" || ids[p.ID]:
			return fmt.Errorf("%w: tools.prompts[%d].id %q is empty or repeated", ErrSuite, i, p.ID)
		case p.Text == "":
			return fmt.Errorf("%w: tools.prompts[%d].text is empty", ErrSuite, i)
		case p.Expect != "" && !names[p.Expect]:
			return fmt.Errorf("%w: tools.prompts[%d].expect = %q: no such function", ErrSuite, i, p.Expect)
		}
		ids[p.ID] = true
		switch p.ToolChoice {
		case "":
			p.ToolChoice = ToolChoiceAuto
		case ToolChoiceAuto:
		case ToolChoiceRequired:
			if p.Expect == "" {
				return fmt.Errorf("%w: tools.prompts[%d]: tool_choice required with no expected call", ErrSuite, i)
			}
		default:
			return fmt.Errorf("%w: tools.prompts[%d].tool_choice = %q: want auto or required", ErrSuite, i, p.ToolChoice)
		}
		if p.Expect != "" {
			calls++
		}
	}
	if calls == 0 {
		return fmt.Errorf("%w: tools: no prompt expects a call", ErrSuite)
	}
	return nil
}

func (t *ToolSuite) function(name string) *ToolFunction {
	for i := range t.Functions {
		if t.Functions[i].Name == name {
			return &t.Functions[i]
		}
	}
	return nil
}

// toolAddon is a built-in file holding only a tool suite.
type toolAddon struct {
	Name  string     `json:"name"`
	Tools *ToolSuite `json:"tools"`
}

// loadWithTools is LoadSuite of "BASE+TOOLS": the suite BASE (a built-in
// name or a file) with the tool probes of TOOLS (a built-in tool suite
// such as tools-v1, or a file of the same shape) added. The name is
// "BASE+TOOLS" and the hash covers both, so adding or editing tool probes
// forces re-enrolment.
func loadWithTools(base, tools string) (*Suite, error) {
	s, err := LoadSuite(base)
	if err != nil {
		return nil, err
	}
	data, err := builtinSuites.ReadFile("suites/" + tools + ".json")
	if err != nil {
		if data, err = os.ReadFile(tools); err != nil {
			return nil, fmt.Errorf("%w: %q is neither a built-in tool suite nor a readable file: %w", ErrSuite, tools, err)
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var add toolAddon
	if err := dec.Decode(&add); err != nil {
		return nil, fmt.Errorf("%w: tool suite %q: %w", ErrSuite, tools, err)
	}
	if add.Tools == nil {
		return nil, fmt.Errorf("%w: tool suite %q has no tools", ErrSuite, tools)
	}
	if err := add.Tools.validate(); err != nil {
		return nil, err
	}
	s.Name = strings.TrimSuffix(baseName(base), ".json") + "+" + add.Name
	s.Tools = add.Tools
	s.Hash = suiteHash(s)
	return s, nil
}

func baseName(p string) string {
	if i := strings.LastIndexAny(p, `/\`); i >= 0 {
		return p[i+1:]
	}
	return p
}

// suiteHash is the hash of the normalised suite, as ParseSuite computes it.
func suiteHash(s *Suite) string {
	canon, _ := json.Marshal(s)
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:8])
}

// ToolCall is one call of an answer: the function's name and its
// arguments, the JSON text OpenAI sends as a string.
type ToolCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// NotString is set when arguments came as a JSON value other than a
	// string (not OpenAI's format: an OpenAI client fails on it).
	NotString bool `json:"not_string,omitempty"`
}

// ToolObservation is the judged record of one tool probe's answer.
type ToolObservation struct {
	Prompt string `json:"prompt"`
	Expect string `json:"expect,omitempty"`
	// Rejected is set when the backend answered the request 400: it does
	// not take tools (vLLM without --enable-auto-tool-choice).
	Rejected bool `json:"rejected,omitempty"`
	// Calls is the number of tool calls; Name and Arguments are the first
	// one's (arguments cut to 300 bytes).
	Calls     int    `json:"calls,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	// NameOK: the first call names the expected function. ArgsParse: its
	// arguments are a JSON string holding JSON. ArgsValid: they validate
	// against the function's schema.
	NameOK    bool `json:"name_ok,omitempty"`
	ArgsParse bool `json:"args_parse,omitempty"`
	ArgsValid bool `json:"args_valid,omitempty"`
	// Correct: a valid call of the expected function, or no call when none
	// was expected.
	Correct bool `json:"correct"`
	// Problem says what was wrong ("" when Correct).
	Problem string `json:"problem,omitempty"`
}

// JudgeTool judges the answer to tool prompt i of t: its tool calls, or
// that the backend rejected the request.
func JudgeTool(t *ToolSuite, i int, calls []ToolCall, rejected bool) ToolObservation {
	p := &t.Prompts[i]
	o := ToolObservation{Prompt: p.ID, Expect: p.Expect, Rejected: rejected, Calls: len(calls)}
	if rejected {
		o.Problem = "the backend rejected the request with tools (HTTP 400)"
		return o
	}
	if len(calls) == 0 {
		o.Correct = p.Expect == ""
		if !o.Correct {
			o.Problem = fmt.Sprintf("no call; %s was expected", p.Expect)
		}
		return o
	}
	c := calls[0]
	o.Name, o.Arguments = c.Name, cut(c.Arguments, 300)
	if p.Expect == "" {
		o.Problem = fmt.Sprintf("called %s when no call was expected", c.Name)
		return o
	}
	o.NameOK = c.Name == p.Expect
	f := t.function(c.Name)
	var err error
	switch {
	case c.NotString:
		err = fmt.Errorf("%w: arguments are not a JSON string", ErrToolArgs)
	case !json.Valid([]byte(c.Arguments)):
		_, err = decodeJSONValue([]byte(c.Arguments))
		err = fmt.Errorf("%w: arguments are not JSON: %v", ErrToolArgs, err)
	default:
		o.ArgsParse = true
		if f != nil && f.schema != nil {
			err = f.schema.ValidateArguments(c.Arguments)
		}
	}
	o.ArgsValid = o.ArgsParse && err == nil && f != nil
	o.Correct = o.NameOK && o.ArgsValid
	switch {
	case !o.NameOK:
		o.Problem = fmt.Sprintf("called %s; %s was expected", c.Name, p.Expect)
		if f == nil {
			o.Problem += " (no such function was offered)"
		}
	case err != nil:
		o.Problem = strings.TrimPrefix(err.Error(), ErrToolArgs.Error()+": ")
	}
	return o
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ToolCounts are the counts of one cycle's (or a baseline's) tool probes.
type ToolCounts struct {
	// Of the prompts that should be answered with a call: how many were
	// asked, answered with a call, with the expected name, with arguments
	// that parse, and with valid arguments (a valid call: all four).
	ShouldCall int `json:"should_call"`
	Called     int `json:"called"`
	RightName  int `json:"right_name"`
	ArgsParse  int `json:"args_parse"`
	ArgsValid  int `json:"valid_calls"`
	// Of the prompts that should be answered without a call: how many,
	// and how many were.
	ShouldNotCall int `json:"should_not_call"`
	NoCall        int `json:"no_call"`
	// Rejected counts requests answered 400.
	Rejected int `json:"rejected"`
}

// CountTools counts judged observations.
func CountTools(obs []ToolObservation) ToolCounts {
	var c ToolCounts
	for _, o := range obs {
		if o.Rejected {
			c.Rejected++
		}
		if o.Expect == "" {
			c.ShouldNotCall++
			if o.Calls == 0 && !o.Rejected {
				c.NoCall++
			}
			continue
		}
		c.ShouldCall++
		if o.Calls > 0 {
			c.Called++
		}
		if o.NameOK {
			c.RightName++
		}
		if o.NameOK && o.ArgsParse {
			c.ArgsParse++
		}
		if o.Correct {
			c.ArgsValid++
		}
	}
	return c
}

func (c *ToolCounts) add(o ToolCounts) {
	c.ShouldCall += o.ShouldCall
	c.Called += o.Called
	c.RightName += o.RightName
	c.ArgsParse += o.ArgsParse
	c.ArgsValid += o.ArgsValid
	c.ShouldNotCall += o.ShouldNotCall
	c.NoCall += o.NoCall
	c.Rejected += o.Rejected
}

// ValidRate is the share of should-call prompts answered with a valid call
// of the expected function (NaN without such prompts).
func (c ToolCounts) ValidRate() float64 { return ratio(c.ArgsValid, c.ShouldCall) }

// NoCallRate is the share of should-not-call prompts answered without a
// call (NaN without such prompts).
func (c ToolCounts) NoCallRate() float64 { return ratio(c.NoCall, c.ShouldNotCall) }

func ratio(k, n int) float64 {
	if n == 0 {
		return nan()
	}
	return float64(k) / float64(n)
}

// ToolBaseline is the tool-call picture of a backend's enrolment.
type ToolBaseline struct {
	Cycles int        `json:"cycles"`
	Counts ToolCounts `json:"counts"` // summed over the enrolment cycles
	// Supported is false when every tool request of the enrolment was
	// rejected: the tool tier is then not judged for this backend.
	Supported bool `json:"supported"`
	// Correct counts, per tool prompt, the enrolment cycles that answered
	// it correctly.
	Correct []int `json:"correct"`
}

// buildToolBaseline sums the enrolment cycles' tool observations; nil when
// the suite has no tool probes or a cycle lacks them.
func buildToolBaseline(s *Suite, cycles []*Cycle) *ToolBaseline {
	if s.Tools == nil {
		return nil
	}
	tb := &ToolBaseline{Correct: make([]int, len(s.Tools.Prompts))}
	for _, c := range cycles {
		if len(c.Tools) != len(s.Tools.Prompts) {
			return nil
		}
		tb.Cycles++
		tb.Counts.add(CountTools(c.Tools))
		for i, o := range c.Tools {
			if o.Correct {
				tb.Correct[i]++
			}
		}
	}
	n := tb.Cycles * len(s.Tools.Prompts)
	tb.Supported = tb.Counts.Rejected < n
	return tb
}
