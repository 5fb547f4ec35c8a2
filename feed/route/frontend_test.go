package route

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// BodyHints hashes a body's system prompt exactly as the router's own
// pick does, so that another front end keeps a prefix on the same sticky
// backend.
func TestBodyHintsMatchTheRouter(t *testing.T) {
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"u"},{"role":"system","content":"be brief"}]}`)
	model, prefix, has, ok := BodyHints(body)
	var info requestInfo
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	if !ok || !has || model != "llama" || prefix != prefixHash(info.systemPrompt()) {
		t.Errorf("BodyHints: %q %x %v %v; want llama and the router's hash %x", model, prefix, has, ok, prefixHash(info.systemPrompt()))
	}
	if _, _, has, ok := BodyHints([]byte(`{"model":"m","prompt":"x"}`)); has || !ok {
		t.Errorf("no system message: has %v ok %v", has, ok)
	}
	if _, _, _, ok := BodyHints([]byte("not json")); ok {
		t.Error("a body that is not JSON reads as ok")
	}
}

// StreamCheck is the router's check in passing over chunks: a finished
// stream passes, a cut one and one with an error event fail, whatever the
// chunk boundaries.
func TestStreamCheckOverChunks(t *testing.T) {
	for _, c := range []struct {
		name   string
		chunks []string
		want   string
		events int64
	}{
		{"finished", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DO", "NE]\n\n"}, "", 1},
		{"cut", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"}, fleetwatch.StreamCut, 1},
		{"error event", []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "event: error\ndata: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n"}, fleetwatch.StreamErrorEvent, 1},
		{"nothing", nil, fleetwatch.StreamCut, 0},
	} {
		var s StreamCheck
		for _, ch := range c.chunks {
			s.Scan([]byte(ch))
		}
		if got := s.Error(); got != c.want || s.ContentEvents() != c.events {
			t.Errorf("%s: Error %q, %d content events; want %q, %d", c.name, got, s.ContentEvents(), c.want, c.events)
		}
	}
}

func TestPoolsBackends(t *testing.T) {
	ps, err := NewPools([]Pool{{ID: "p", Backends: []Backend{{ID: "b", URL: "http://10.0.0.2:80"}, {ID: "a", URL: "https://10.0.0.1"}}}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, ps.Backends("p")); diff != "" || ps.Backends("q") != nil {
		t.Errorf("Backends (-want +got):\n%s", diff)
	}
	if ps.Address("p", "a") != "10.0.0.1:443" {
		t.Errorf("Address %q", ps.Address("p", "a"))
	}
}
