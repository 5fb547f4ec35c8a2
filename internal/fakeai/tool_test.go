package fakeai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const testTools = `[
 {"type":"function","function":{"name":"get_weather","description":"Get the current weather in a city.",
  "parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},
  "required":["city","unit"],"additionalProperties":false}}},
 {"type":"function","function":{"name":"get_stock_price","description":"Get the latest stock price of a ticker symbol.",
  "parameters":{"type":"object","properties":{"ticker":{"type":"string"}},"required":["ticker"]}}}]`

func testToolRequest(t *testing.T, choice string) ToolRequest {
	t.Helper()
	var raw json.RawMessage
	if choice != "" {
		raw = json.RawMessage(choice)
	}
	tr, err := parseTools(json.RawMessage(testTools), raw)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestParseTools(t *testing.T) {
	tr := testToolRequest(t, "")
	if len(tr.Tools) != 2 || tr.Choice != "auto" || tr.Tools[0].Name != "get_weather" || tr.Tools[0].Parameters["type"] != "object" {
		t.Errorf("tools %+v", tr)
	}
	if tr := testToolRequest(t, `{"type":"function","function":{"name":"get_stock_price"}}`); tr.Choice != "required" || tr.Forced != "get_stock_price" {
		t.Errorf("forced choice %+v", tr)
	}
	if tr := testToolRequest(t, `"none"`); tr.Choice != "none" {
		t.Errorf("none: %+v", tr)
	}
	if tr, err := parseTools(nil, nil); err != nil || len(tr.Tools) != 0 {
		t.Errorf("no tools: %+v %v", tr, err)
	}
	for _, tc := range []struct{ tools, choice string }{
		{`{"type":"function"}`, ``},
		{`[{"type":"code_interpreter"}]`, ``},
		{`[{"type":"function","function":{"description":"no name"}}]`, ``},
		{testTools, `"sometimes"`},
		{testTools, `{"type":"function"}`},
		{testTools, `7`},
	} {
		var choice json.RawMessage
		if tc.choice != "" {
			choice = json.RawMessage(tc.choice)
		}
		if _, err := parseTools(json.RawMessage(tc.tools), choice); !errors.Is(err, ErrBadTools) {
			t.Errorf("%s %s: err %v, want ErrBadTools", tc.tools, tc.choice, err)
		}
	}
}

func TestToolModelAnswers(t *testing.T) {
	m := &ToolModel{}
	tr := testToolRequest(t, "")
	got := m.Answer("user: What is the weather in Paris? Use celsius.", tr)
	want := []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("weather (-want +got):\n%s", diff)
	}
	got = m.Answer("system: be brief\nuser: What is the latest stock price of AAPL?", tr)
	want = []ToolCall{{Name: "get_stock_price", Arguments: `{"ticker":"AAPL"}`}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stock (-want +got):\n%s", diff)
	}
	if got := m.Answer("user: Write a haiku about autumn leaves.", tr); got != nil {
		t.Errorf("a prompt without a matching function got %+v", got)
	}
	if got := m.Answer("user: What is the weather in Paris?", testToolRequest(t, `"none"`)); got != nil {
		t.Errorf("tool_choice none got %+v", got)
	}
	if got := m.Answer("user: Write a haiku.", testToolRequest(t, `"required"`)); len(got) != 1 || got[0].Name != "get_weather" {
		t.Errorf("tool_choice required got %+v, want the first function", got)
	}
	forced := testToolRequest(t, `{"type":"function","function":{"name":"get_stock_price"}}`)
	if got := m.Answer("user: What is the weather in Paris?", forced); len(got) != 1 || got[0].Name != "get_stock_price" {
		t.Errorf("forced function got %+v", got)
	}
}

func TestToolModelBreaks(t *testing.T) {
	tr := testToolRequest(t, "")
	const prompt = "user: What is the weather in Paris? Use celsius."
	for _, tc := range []struct {
		mode string
		want []ToolCall
	}{
		{BreakInvalidJSON, []ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"`}}},
		{BreakMissingRequired, []ToolCall{{Name: "get_weather", Arguments: `{"unit":"celsius"}`}}},
		{BreakWrongName, []ToolCall{{Name: "get_stock_price", Arguments: `{"city":"Paris","unit":"celsius"}`}}},
		{BreakNoCall, nil},
	} {
		m := &ToolModel{Break: 1, Modes: []string{tc.mode}}
		if diff := cmp.Diff(tc.want, m.Answer(prompt, tr)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.mode, diff)
		}
	}
	// no_call cannot break a required call: the arguments are broken instead
	m := &ToolModel{Break: 1, Modes: []string{BreakNoCall}}
	if got := m.Answer(prompt, testToolRequest(t, `"required"`)); len(got) != 1 || json.Valid([]byte(got[0].Arguments)) {
		t.Errorf("required call broken by no_call: %+v", got)
	}
	// a fraction: about Break of the calls, seeded
	m = &ToolModel{Break: 0.3, Seed: 7}
	broken := 0
	for range 1000 {
		c := m.Answer(prompt, tr)
		if len(c) == 0 || c[0].Name != "get_weather" || c[0].Arguments != `{"city":"Paris","unit":"celsius"}` {
			broken++
		}
	}
	if broken < 250 || broken > 350 {
		t.Errorf("%d of 1000 calls broken, want about 300", broken)
	}
}

func TestToolModelHardPromptsAreTheArtefacts(t *testing.T) {
	tr := testToolRequest(t, "")
	prompts := []string{"user: weather in Oslo, celsius", "user: weather in Rome, celsius", "user: stock price of IBM",
		"user: stock price of SAP", "user: weather in Lima, fahrenheit", "user: a haiku please"}
	answers := func(artefact uint64) []string {
		m := &ToolModel{Artefact: artefact, Hard: 0.5, HardError: 1}
		var out []string
		for _, p := range prompts {
			b, _ := json.Marshal(m.Answer(p, tr))
			out = append(out, string(b))
		}
		return out
	}
	a1, a1again, a2 := answers(1), answers(1), answers(2)
	if diff := cmp.Diff(a1, a1again); diff != "" {
		t.Errorf("the same artefact answered differently (-first +second):\n%s", diff)
	}
	if cmp.Equal(a1, a2) {
		t.Errorf("two artefacts found the same prompts hard in the same way: %v", a1)
	}
	ref := (&ToolModel{}).Answer(prompts[0], tr)
	hard := 0
	for _, p := range prompts {
		if (&ToolModel{Artefact: 1, Hard: 0.5}).IsHard(p) {
			hard++
		}
	}
	if hard == 0 || hard == len(prompts) || ref == nil {
		t.Errorf("%d of %d prompts hard; reference %+v", hard, len(prompts), ref)
	}
}

func postChat(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return resp.StatusCode, v
}

func TestToolCallsOverHTTP(t *testing.T) {
	srv := start(t, Settings{})
	body := `{"model":"m","messages":[{"role":"user","content":"What is the weather in Paris? Use celsius."}],"tools":` + testTools + `,"tool_choice":"auto"}`
	code, v := postChat(t, srv.URL(), body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %v", code, v)
	}
	choice := v["choices"].([]any)[0].(map[string]any)
	msg := choice["message"].(map[string]any)
	if choice["finish_reason"] != "tool_calls" || msg["content"] != nil {
		t.Errorf("choice %v, want finish_reason tool_calls and no content", choice)
	}
	calls := msg["tool_calls"].([]any)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	if len(calls) != 1 || fn["name"] != "get_weather" || fn["arguments"] != `{"city":"Paris","unit":"celsius"}` || calls[0].(map[string]any)["type"] != "function" {
		t.Errorf("tool_calls %v", calls)
	}
	// no matching function: text
	_, v = postChat(t, srv.URL(), `{"model":"m","messages":[{"role":"user","content":"Write a haiku."}],"tools":`+testTools+`}`)
	if msg := v["choices"].([]any)[0].(map[string]any)["message"].(map[string]any); msg["content"] == nil || msg["tool_calls"] != nil {
		t.Errorf("text answer expected: %v", msg)
	}
	// bad tools: 400
	if code, _ := postChat(t, srv.URL(), `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"x"}]}`); code != http.StatusBadRequest {
		t.Errorf("bad tools answered %d", code)
	}
	// the admin endpoint breaks every call
	resp, err := http.Post(srv.URL()+"/admin/tools", "application/json", bytes.NewReader([]byte(`{"break":1,"modes":["wrong_name"]}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || srv.ToolModel().Break != 1 {
		t.Fatalf("admin tools: %d, %+v", resp.StatusCode, srv.ToolModel().Settings())
	}
	_, v = postChat(t, srv.URL(), body)
	fn = v["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	if fn["name"] != "get_stock_price" {
		t.Errorf("after break wrong_name: %v", fn)
	}
	for _, bad := range []string{`{"break":2}`, `{"modes":["melt"]}`, `{"brake":1}`} {
		resp, err := http.Post(srv.URL()+"/admin/tools", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s answered %d", bad, resp.StatusCode)
		}
	}
	resp, err = http.Get(srv.URL() + "/admin/tools")
	if err != nil {
		t.Fatal(err)
	}
	var got ToolSettings
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if diff := cmp.Diff(ToolSettings{Break: 1, Modes: []string{"wrong_name"}}, got); diff != "" {
		t.Errorf("GET /admin/tools (-want +got):\n%s", diff)
	}
}

// The admin listener of `fleetwatch fake` reaches a backend's tool model.
func TestToolsThroughTheFleetAdmin(t *testing.T) {
	srv := start(t, Settings{Name: "b1"})
	admin := httptest.NewServer(AdminHandler([]*Server{srv}, nil))
	t.Cleanup(admin.Close)
	resp, err := http.Post(admin.URL+"/admin/b1/tools", "application/json", strings.NewReader(`{"break":0.25,"modes":["no_call"]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := srv.ToolModel().Settings(); resp.StatusCode != http.StatusOK || got.Break != 0.25 || len(got.Modes) != 1 {
		t.Errorf("status %d, tool model %+v", resp.StatusCode, got)
	}
}
