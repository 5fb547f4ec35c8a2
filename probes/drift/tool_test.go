package drift

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func loadToolSuite(t *testing.T) *Suite {
	t.Helper()
	s, err := LoadSuite("default-v1+tools-v1")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestToolSuiteLoads(t *testing.T) {
	s := loadToolSuite(t)
	def, err := LoadSuite("")
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "default-v1+tools-v1" || len(s.Prompts) != len(def.Prompts) || len(s.Tools.Prompts) != 48 || len(s.Tools.Functions) != 6 {
		t.Fatalf("suite %s: %d prompts, %d tool prompts, %d functions", s.Name, len(s.Prompts), len(s.Tools.Prompts), len(s.Tools.Functions))
	}
	if s.Hash == def.Hash {
		t.Error("adding tool probes kept the hash: baselines without them would be reused")
	}
	for _, f := range s.Tools.Functions {
		if f.Schema() == nil {
			t.Errorf("%s: schema not parsed", f.Name)
		}
	}
	again := loadToolSuite(t)
	if again.Hash != s.Hash {
		t.Error("the hash is not stable")
	}
}

func TestToolSuiteErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fn := `{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}`
	for name, body := range map[string]string{
		"no tools":         `{"name":"x"}`,
		"unknown field":    `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":"f"}],"extra":1}}`,
		"no function":      `{"name":"x","tools":{"functions":[],"prompts":[{"id":"a","text":"t","expect":"f"}]}}`,
		"unknown expected": `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":"g"}]}}`,
		"no call expected": `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":""}]}}`,
		"repeated id":      `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":"f"},{"id":"a","text":"u","expect":"f"}]}}`,
		"bad choice":       `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":"f","tool_choice":"none"}]}}`,
		"required no call": `{"name":"x","tools":{"functions":[` + fn + `],"prompts":[{"id":"a","text":"t","expect":"f"},{"id":"b","text":"t","tool_choice":"required"}]}}`,
		"bad schema":       `{"name":"x","tools":{"functions":[{"name":"f","parameters":{"type":"string","pattern":"a"}}],"prompts":[{"id":"a","text":"t","expect":"f"}]}}`,
	} {
		p := write(strings.ReplaceAll(name, " ", "-")+".json", body)
		if _, err := LoadSuite("default-v1+" + p); !errors.Is(err, ErrSuite) {
			t.Errorf("%s: err %v, want ErrSuite", name, err)
		}
	}
	ok := write("ok.json", `{"name":"mine","tools":{"functions":[`+fn+`],"prompts":[{"id":"a","text":"t","expect":"f"}]}}`)
	s, err := LoadSuite("default-v1+" + ok)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "default-v1+mine" || s.Tools.MaxTokens != 128 || s.Tools.Prompts[0].ToolChoice != ToolChoiceAuto {
		t.Errorf("suite %s, max_tokens %d, choice %q", s.Name, s.Tools.MaxTokens, s.Tools.Prompts[0].ToolChoice)
	}
	if _, err := LoadSuite("default-v1+nope-v9"); !errors.Is(err, ErrSuite) {
		t.Errorf("missing tool suite: %v", err)
	}
}

func TestJudgeTool(t *testing.T) {
	s := loadToolSuite(t)
	ts := s.Tools
	idx := func(id string) int {
		for i, p := range ts.Prompts {
			if p.ID == id {
				return i
			}
		}
		t.Fatalf("no prompt %s", id)
		return -1
	}
	call := idx("weather-paris")
	none := idx("none-capital")
	for _, tc := range []struct {
		name     string
		prompt   int
		calls    []ToolCall
		rejected bool
		want     ToolObservation
	}{
		{"valid call", call, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`,
				NameOK: true, ArgsParse: true, ArgsValid: true, Correct: true}},
		{"no call", call, nil, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Problem: "no call; get_weather was expected"}},
		{"wrong name", call, []ToolCall{{Name: "get_stock_price", Arguments: `{"ticker":"X"}`}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "get_stock_price", Arguments: `{"ticker":"X"}`,
				ArgsParse: true, ArgsValid: true, Problem: "called get_stock_price; get_weather was expected"}},
		{"unknown name", call, []ToolCall{{Name: "weather", Arguments: `{}`}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "weather", Arguments: `{}`,
				ArgsParse: true, Problem: "called weather; get_weather was expected (no such function was offered)"}},
		{"invalid JSON", call, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"`}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"`,
				NameOK: true, Problem: "arguments are not JSON: unexpected EOF"}},
		{"missing required", call, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "get_weather", Arguments: `{"city":"Paris"}`,
				NameOK: true, ArgsParse: true, Problem: `(root): missing required field "unit"`}},
		{"arguments not a string", call, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`, NotString: true}}, false,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Calls: 1, Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`,
				NameOK: true, Problem: "arguments are not a JSON string"}},
		{"rejected", call, nil, true,
			ToolObservation{Prompt: "weather-paris", Expect: "get_weather", Rejected: true, Problem: "the backend rejected the request with tools (HTTP 400)"}},
		{"no call when none expected", none, nil, false,
			ToolObservation{Prompt: "none-capital", Correct: true}},
		{"spurious call", none, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Tokyo","unit":"celsius"}`}}, false,
			ToolObservation{Prompt: "none-capital", Calls: 1, Name: "get_weather", Arguments: `{"city":"Tokyo","unit":"celsius"}`,
				Problem: "called get_weather when no call was expected"}},
	} {
		got := JudgeTool(ts, tc.prompt, tc.calls, tc.rejected)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestBinomialUpper(t *testing.T) {
	// against the direct sum of the probability mass function
	direct := func(k, n int, q float64) float64 {
		sum := 0.0
		for j := k; j <= n; j++ {
			c := 1.0
			for i := range j {
				c = c * float64(n-i) / float64(i+1)
			}
			sum += c * math.Pow(q, float64(j)) * math.Pow(1-q, float64(n-j))
		}
		return sum
	}
	for _, tc := range []struct {
		k, n int
		q    float64
	}{{0, 10, 0.1}, {1, 10, 0.1}, {3, 24, 0.05}, {10, 40, 0.0625}, {40, 40, 0.5}, {5, 48, 0.01}} {
		got, want := binomialUpper(tc.k, tc.n, tc.q), direct(tc.k, tc.n, tc.q)
		if math.Abs(got-want) > 1e-12*max(1, want) && math.Abs(got-want)/want > 1e-9 {
			t.Errorf("P(X >= %d | n %d, q %g) = %g, want %g", tc.k, tc.n, tc.q, got, want)
		}
	}
	if binomialUpper(11, 10, 0.5) != 0 || binomialUpper(3, 10, 0) != 0 || binomialUpper(3, 10, 1) != 1 {
		t.Error("edge cases")
	}
	if z := probit(0.001); math.Abs(z-3.0902) > 1e-3 {
		t.Errorf("probit(0.001) = %v", z)
	}
	if probit(1) != -10 || probit(0) != 40 {
		t.Error("probit bounds")
	}
}

func toolCounts(valid, calls, noCall, none int) ToolCounts {
	return ToolCounts{ShouldCall: calls, Called: calls, RightName: calls, ArgsParse: calls, ArgsValid: valid, ShouldNotCall: none, NoCall: noCall}
}

func TestToolSignalRules(t *testing.T) {
	p := Params{}.WithDefaults()
	base := toolCounts(16*38, 16*40, 16*8, 16*8) // 95% valid, every no-call right
	for _, tc := range []struct {
		name                string
		now                 []ToolCounts
		gross, alarm, quiet bool // of the last cycle
	}{
		{"unchanged", []ToolCounts{toolCounts(38, 40, 8, 8)}, false, false, true},
		{"a fall of 30 points is gross at once", []ToolCounts{toolCounts(26, 40, 8, 8)}, true, true, false},
		{"spurious calls on no-call prompts are gross", []ToolCounts{toolCounts(38, 40, 4, 8)}, true, true, false},
		{"a fall of 12 points is not gross", []ToolCounts{toolCounts(33, 40, 8, 8)}, false, false, true},
		{"a fall of 12 points accumulates", []ToolCounts{toolCounts(33, 40, 8, 8), toolCounts(33, 40, 8, 8)}, false, true, true},
		{"a rise is never an alarm", []ToolCounts{toolCounts(40, 40, 8, 8), toolCounts(40, 40, 8, 8), toolCounts(40, 40, 8, 8)}, false, false, true},
	} {
		var cu CUSUM
		var s Signal
		var st ToolStats
		for _, c := range tc.now {
			st = compareCounts(base, c, p.Tools)
			s = toolSignal(st, &cu, p)
		}
		if s.Gross != tc.gross || s.Alarm != tc.alarm || s.Quiet != tc.quiet {
			t.Errorf("%s: gross %v alarm %v quiet %v (z %.2f, fall %.2f, CUSUM %.2f), want %v %v %v: %s",
				tc.name, s.Gross, s.Alarm, s.Quiet, st.Z, st.Fall, cu.C, tc.gross, tc.alarm, tc.quiet, s.Reason)
		}
	}
}

func TestCompareToolPeers(t *testing.T) {
	b := func(valid int) *Baseline {
		return &Baseline{SuiteHash: "h", Tools: &ToolBaseline{Supported: true, Cycles: 16, Counts: toolCounts(valid, 16*40, 16*8, 16*8)}}
	}
	v := CompareToolPeers(map[string]*Baseline{"a": b(16 * 39), "b": b(16 * 38), "c": b(16 * 26)}, Params{})
	if v.Outlier != "c" || !strings.Contains(v.Reason, "tool-call outlier") {
		t.Errorf("verdict %+v, want c named", v)
	}
	v = CompareToolPeers(map[string]*Baseline{"a": b(16 * 39), "b": b(16 * 38), "c": b(16 * 37)}, Params{})
	if v.Outlier != "" || v.PairDiffers {
		t.Errorf("verdict %+v, want none named", v)
	}
	v = CompareToolPeers(map[string]*Baseline{"a": b(16 * 39), "b": b(16 * 26)}, Params{})
	if v.Outlier != "" || !v.PairDiffers || v.Pair != [2]string{"a", "b"} {
		t.Errorf("verdict %+v, want the pair to differ without blame", v)
	}
	unsupported := b(0)
	unsupported.Tools.Supported = false
	v = CompareToolPeers(map[string]*Baseline{"a": b(16 * 39), "b": b(16 * 38), "c": unsupported}, Params{})
	if v.Outlier != "" || v.PairDiffers {
		t.Errorf("a backend without tools was compared: %+v", v)
	}
}

// A suite without should-not-call prompts has no no-call rate: the stats
// stay finite, so that they encode as JSON.
func TestToolStatsWithoutNoCallPrompts(t *testing.T) {
	st := compareCounts(toolCounts(16*40, 16*40, 0, 0), toolCounts(30, 40, 0, 0), ToolParams{})
	if _, err := json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if st.NoCallRate != 0 || st.BaseNoCall != 0 || math.Abs(st.Fall-0.25) > 1e-9 || st.PNoCall != 1 {
		t.Errorf("stats %+v", st)
	}
}
