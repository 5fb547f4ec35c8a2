package drift

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultSuite(t *testing.T) {
	s, err := LoadSuite("")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, p := range s.Prompts {
		kinds[p.Kind]++
		if p.MaxTokens < 1 || p.MaxTokens > MaxProbeTokens {
			t.Errorf("%s: max_tokens %d", p.ID, p.MaxTokens)
		}
	}
	if diff := cmp.Diff(map[string]int{KindStable: 8, KindBorder: 4, KindOneToken: 4}, kinds); diff != "" || s.Name != DefaultSuite || len(s.Hash) != 16 {
		t.Errorf("default suite %s %s, kinds (-want +got):\n%s", s.Name, s.Hash, diff)
	}
	again, _ := LoadSuite(DefaultSuite)
	if again.Hash != s.Hash {
		t.Error("the same suite hashed twice differently")
	}
}

func TestSuiteFromFileForcesANewHash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.json")
	body := `{"name":"default-v1","prompts":[{"id":"a","kind":"stable","text":"Say hi."}]}`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := LoadSuite(path)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := LoadSuite("")
	if s.Hash == def.Hash || s.Prompts[0].MaxTokens != MaxProbeTokens {
		t.Errorf("a different suite under the default name: hash %s (default %s), max_tokens %d", s.Hash, def.Hash, s.Prompts[0].MaxTokens)
	}
}

func TestParseSuiteRejects(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":      `{`,
		"unknown field": `{"name":"x","prompts":[{"id":"a","kind":"stable","text":"t"}],"extra":1}`,
		"no name":       `{"prompts":[{"id":"a","kind":"stable","text":"t"}]}`,
		"no prompts":    `{"name":"x","prompts":[]}`,
		"repeated id":   `{"name":"x","prompts":[{"id":"a","kind":"stable","text":"t"},{"id":"a","kind":"stable","text":"u"}]}`,
		"empty text":    `{"name":"x","prompts":[{"id":"a","kind":"stable","text":""}]}`,
		"unknown kind":  `{"name":"x","prompts":[{"id":"a","kind":"weird","text":"t"}]}`,
		"too many toks": `{"name":"x","prompts":[{"id":"a","kind":"stable","text":"t","max_tokens":21}]}`,
		"negative toks": `{"name":"x","prompts":[{"id":"a","kind":"stable","text":"t","max_tokens":-1}]}`,
	} {
		if _, err := ParseSuite([]byte(body)); !errors.Is(err, ErrSuite) {
			t.Errorf("%s: err %v, want ErrSuite", name, err)
		}
	}
	if _, err := LoadSuite("no-such-suite"); !errors.Is(err, ErrSuite) {
		t.Errorf("missing suite: %v", err)
	}
}
