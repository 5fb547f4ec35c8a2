package epp

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestNewChecksSettings(t *testing.T) {
	one, err := route.NewPools([]route.Pool{llama.routePool()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	two, err := route.NewPools([]route.Pool{llama.routePool(), {ID: "qwen", Backends: []route.Backend{{ID: "q", URL: "http://10.0.0.9:8000"}}}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		s    Settings
		ok   bool
	}{
		{"no pools", Settings{}, false},
		{"the only pool", Settings{Pools: one}, true},
		{"several pools, none named", Settings{Pools: two}, false},
		{"several pools, one named", Settings{Pools: two, Pool: "qwen"}, true},
		{"several pools by header", Settings{Pools: two, PoolHeader: "x-ai-eg-model"}, true},
		{"an unknown pool", Settings{Pools: one, Pool: "nope"}, false},
		{"bad prefix_from", Settings{Pools: one, PrefixFrom: "user"}, false},
		{"bad body mode", Settings{Pools: one, BodyMode: "duplex"}, false},
		{"bad visibility", Settings{Pools: one, Visibility: "all"}, false},
		{"negative fallbacks", Settings{Pools: one, Fallbacks: -1}, false},
	} {
		_, err := New(c.s)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrConfig)) {
			t.Errorf("%s: New: %v, want ok %v (or ErrConfig)", c.name, err, c.ok)
		}
	}
}

// A header-only request (end_of_stream on the headers, GIE's "simple GET")
// is answered at once: one endpoint, the same in the header and in the
// envoy.lb metadata, and nothing else; the stream then ends without an
// outcome (no response phase: counted unreported, nothing left in flight).
func TestHeaderOnlyPick(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{})
	rs, err := pk.exchange(t, reqHeaders(map[string]string{":method": "GET", ":path": "/v1/models"}, true))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d answers, want 1: %v", len(rs), rs)
	}
	header, meta := destination(rs[0])
	if header != meta || !slices.Contains(llama.addrs, header) {
		t.Errorf("destination header %q, metadata %q: want one endpoint of the pool, the same in both", header, meta)
	}
	if !rs[0].GetRequestHeaders().GetResponse().GetClearRouteCache() {
		t.Error("the answer does not clear the route cache: a data plane that routes on the header would keep its first route")
	}
	testkit.Eventually(t, 5*time.Second, "the pick to be released", func() bool { return pk.inFlight("llama") == 0 })
	if !strings.Contains(pk.metricsText(), `fleetwatch_epp_unreported_total{pool="llama"} 1`) {
		t.Errorf("metrics lack the unreported pick:\n%s", pk.metricsText())
	}
}

// A full-duplex request: the answer to the headers comes at once (the
// pick is at the headers), each body chunk is echoed back unchanged, the
// response passes through, and its end publishes one outcome event for the
// picked backend with the status, TTFT (first content event, from the
// pick) and duration, and releases the pick.
func TestFullDuplexRequestAndStreamedAnswer(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{Source: "fd"})
	body := `{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	sse := []string{
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
	}
	rs, err := pk.exchange(t,
		reqHeaders(map[string]string{":method": "POST", ":path": "/v1/chat/completions"}, false),
		reqBody(body[:20], false), reqBody(body[20:], true),
		respHeaders(map[string]string{":status": "200", "content-type": "text/event-stream"}, false),
		respBody(sse[0], false), respBody(sse[1], false), respBody(sse[2], true),
	)
	if err != nil {
		t.Fatal(err)
	}
	header, _ := destination(rs[0])
	if got, ended, _ := echoed(rs, true); got != body || !ended {
		t.Errorf("request body echoed %q (ended %v), want %q", got, ended, body)
	}
	if got, ended, _ := echoed(rs, false); got != strings.Join(sse, "") || !ended {
		t.Errorf("response body echoed %q (ended %v)", got, ended)
	}
	if rs[len(rs)-4].GetResponseHeaders() == nil {
		t.Errorf("the response headers were not answered in order: %v", rs)
	}
	evs := eventsOf(t, n, "fd", 1)
	ev := evs[0]
	if ev.Pool != "llama" || ev.Backend != header || ev.Status != 200 || ev.Outcome != fleetwatch.OutcomeOK ||
		!ev.HasTTFT || !ev.HasDuration || ev.TTFTMs > ev.DurationMs || ev.StreamError != "" {
		t.Errorf("event %+v: want pool llama, backend %s, 200 ok with ttft <= duration", ev, header)
	}
	testkit.Eventually(t, 5*time.Second, "the pick to be released", func() bool { return pk.inFlight("llama") == 0 })
}

// The decisions steer the picks: an open breaker is never picked, a
// backend the decisions weigh 0 neither; when every backend is open the
// pool sheds (429, rejected-saturated, Retry-After until the first breaker
// half-opens).
func TestPicksFollowTheDecisions(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{})
	now := time.Now()
	pk.publish(t, n, feedtest.Snapshot("llama", "e1", 1, now,
		feedtest.Open(llama.addrs[0], now.Add(time.Minute), "error rate 0.9"),
		feedtest.Closed(llama.addrs[1]),
		feedtest.Closed(llama.addrs[2])))
	seen := map[string]int{}
	for range 60 {
		rs, err := pk.exchange(t, reqHeaders(nil, true))
		if err != nil || len(rs) != 1 {
			t.Fatalf("pick: %v %v", rs, err)
		}
		h, _ := destination(rs[0])
		seen[h]++
	}
	if seen[llama.addrs[0]] > 0 || seen[llama.addrs[1]] == 0 || seen[llama.addrs[2]] == 0 {
		t.Errorf("picks %v: the open breaker %s was picked, or a healthy backend never", seen, llama.addrs[0])
	}
	pk.publish(t, n, feedtest.Snapshot("llama", "e1", 2, now,
		feedtest.Open(llama.addrs[0], now.Add(time.Minute), "x"),
		feedtest.Open(llama.addrs[1], now.Add(90*time.Second), "x"),
		feedtest.Open(llama.addrs[2], now.Add(2*time.Minute), "x")))
	rs, err := pk.exchange(t, reqHeaders(nil, true))
	if err != nil || len(rs) != 1 {
		t.Fatalf("shed: %v %v", rs, err)
	}
	code, reason, retry := immediate(rs[0])
	if code != 429 || reason != DroppedSaturated || retry == "" || retry == "0" {
		t.Errorf("every backend open: status %d, reason %q, retry-after %q; want 429, %s and a wait", code, reason, retry, DroppedSaturated)
	}
	if want := `fleetwatch_epp_sheds_total{pool="llama",reason="rejected-saturated"} 1`; !strings.Contains(pk.metricsText(), want) {
		t.Errorf("metrics lack %s", want)
	}
}

func TestDestinationAnswerShape(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{Fallbacks: 2})
	rs, err := pk.exchange(t, reqHeaders(nil, true))
	if err != nil || len(rs) != 1 {
		t.Fatalf("%v %v", rs, err)
	}
	header, meta := destination(rs[0])
	list := strings.Split(header, ",")
	slices.Sort(list)
	if header != meta || !cmp.Equal(list, llama.addrs) {
		t.Errorf("with 2 fallbacks: header %q, metadata %q: want all three endpoints, the same list in both", header, meta)
	}
	hs := rs[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(hs) != 1 || hs[0].GetAppendAction().String() != "OVERWRITE_IF_EXISTS_OR_ADD" {
		t.Errorf("header mutation %v: want one header that replaces a client's own", hs)
	}
}
