package drift

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// DefaultSuite is the name of the built-in prompt suite.
const DefaultSuite = "default-v1"

// Prompt kinds of a suite.
const (
	KindStable   = "stable"    // confident greedy outputs: S1 counts these
	KindBorder   = "border"    // near-ties on the first token
	KindOneToken = "one-token" // max_tokens 1
)

// MaxProbeTokens caps max_tokens of a probe request.
const MaxProbeTokens = 20

//go:embed suites/*.json
var builtinSuites embed.FS

// Prompt is one probe request of a suite.
type Prompt struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Text      string `json:"text"`
	MaxTokens int    `json:"max_tokens"`
}

// Suite is a versioned set of probe prompts. Its Hash covers every prompt, so
// an edited suite forces re-enrolment even under the same name.
type Suite struct {
	Name    string   `json:"name"`
	Prompts []Prompt `json:"prompts"`
	// Teacher are the fixed texts scored teacher-forced where the backend
	// returns prompt logprobs (teacher.go); optional.
	Teacher []TeacherText `json:"teacher,omitempty"`
	// Tools are the tool-call probes (tool.go); nil: none.
	Tools *ToolSuite `json:"tools,omitempty"`
	Hash  string     `json:"-"`
}

// ErrSuite reports an unusable prompt suite.
var ErrSuite = errors.New("probes: invalid suite")

// LoadSuite returns the built-in suite of that name, or reads a suite from a
// JSON file when nameOrPath names no built-in suite. "" is DefaultSuite.
func LoadSuite(nameOrPath string) (*Suite, error) {
	if nameOrPath == "" {
		nameOrPath = DefaultSuite
	}
	if base, tools, ok := strings.Cut(nameOrPath, "+"); ok {
		return loadWithTools(base, tools)
	}
	data, err := builtinSuites.ReadFile("suites/" + nameOrPath + ".json")
	if err != nil {
		if data, err = os.ReadFile(nameOrPath); err != nil {
			return nil, fmt.Errorf("%w: %q is neither a built-in suite nor a readable file: %w", ErrSuite, nameOrPath, err)
		}
	}
	return ParseSuite(data)
}

// ParseSuite decodes and validates a suite: a name, 1 to 64 prompts with
// unique ids, known kinds and max_tokens in 1..MaxProbeTokens (0 means
// MaxProbeTokens; one-token prompts always use 1).
func ParseSuite(data []byte) (*Suite, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var s Suite
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSuite, err)
	}
	if s.Name == "" {
		return nil, fmt.Errorf("%w: name is empty", ErrSuite)
	}
	if len(s.Prompts) == 0 || len(s.Prompts) > 64 {
		return nil, fmt.Errorf("%w: %d prompts, want 1 to 64", ErrSuite, len(s.Prompts))
	}
	seen := map[string]bool{}
	for i := range s.Prompts {
		p := &s.Prompts[i]
		switch {
		case p.ID == "" || seen[p.ID]:
			return nil, fmt.Errorf("%w: prompts[%d].id %q is empty or repeated", ErrSuite, i, p.ID)
		case p.Text == "":
			return nil, fmt.Errorf("%w: prompts[%d].text is empty", ErrSuite, i)
		case p.MaxTokens < 0 || p.MaxTokens > MaxProbeTokens:
			return nil, fmt.Errorf("%w: prompts[%d].max_tokens = %d: must be 0..%d", ErrSuite, i, p.MaxTokens, MaxProbeTokens)
		}
		seen[p.ID] = true
		switch p.Kind {
		case KindStable, KindBorder:
			if p.MaxTokens == 0 {
				p.MaxTokens = MaxProbeTokens
			}
		case KindOneToken:
			p.MaxTokens = 1
		default:
			return nil, fmt.Errorf("%w: prompts[%d].kind = %q: want stable, border or one-token", ErrSuite, i, p.Kind)
		}
	}
	if err := validateTeacher(s.Teacher); err != nil {
		return nil, err
	}
	if s.Tools != nil {
		if err := s.Tools.validate(); err != nil {
			return nil, err
		}
	}
	canon, _ := json.Marshal(s) // the normalised suite decides the hash
	sum := sha256.Sum256(canon)
	s.Hash = hex.EncodeToString(sum[:8])
	return &s, nil
}
