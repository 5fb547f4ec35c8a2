package probes

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/probes/drift"
)

func TestParseToolCalls(t *testing.T) {
	got, err := parseToolCalls([]byte(`{"choices":[{"message":{"content":null,"tool_calls":[
		{"id":"c1","type":"function","function":{"name":"a","arguments":"{\"x\":1}"}},
		{"id":"c2","type":"function","function":{"name":"b","arguments":{"y":2}}}]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []drift.ToolCall{{Name: "a", Arguments: `{"x":1}`}, {Name: "b", Arguments: `{"y":2}`, NotString: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if calls, err := parseToolCalls([]byte(`{"choices":[{"message":{"content":"hi"}}]}`)); err != nil || len(calls) != 0 {
		t.Errorf("text answer: %v %v", calls, err)
	}
	for _, bad := range []string{`{"choices":[]}`, `{"choices":[{}]}`, `nope`} {
		if _, err := parseToolCalls([]byte(bad)); !errors.Is(err, drift.ErrBadResponse) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
