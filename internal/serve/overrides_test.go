package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/router"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// postOverride POSTs req to /api/overrides and returns the status and the
// decoded reply.
func postOverride(t *testing.T, base string, req any) (int, control.OverrideReply) {
	t.Helper()
	var body []byte
	switch r := req.(type) {
	case string:
		body = []byte(r)
	default:
		body, _ = json.Marshal(r)
	}
	resp, err := http.Post(base+"/api/overrides", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var reply control.OverrideReply
	if err := json.Unmarshal(data, &reply); err != nil {
		t.Fatalf("reply does not parse: %v: %s", err, data)
	}
	return resp.StatusCode, reply
}

// appliedLog records the snapshots a router applied.
type appliedLog struct {
	mu   sync.Mutex
	last map[string]fleetwatch.Backend
}

func (l *appliedLog) record(s *fleetwatch.Snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]fleetwatch.Backend{}
	}
	for _, b := range s.Backends {
		l.last[b.Backend] = b
	}
}

func (l *appliedLog) backend(id string) fleetwatch.Backend {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[id]
}

// startRouter runs `fleetwatch route` (internal/router) as source edge-1
// over pool p of backends (b0, b1, ... by their names), following the
// decisions on natsURL and recording what it applied in applied. It stops
// in t.Cleanup.
func startRouter(t *testing.T, natsURL string, backends []*fakeai.Server, applied *appliedLog) *router.Router {
	t.Helper()
	cfg := config.Default()
	cfg.NATS.URL = natsURL
	pool := config.PoolConfig{ID: "p"}
	for _, b := range backends {
		pool.Backends = append(pool.Backends, config.BackendConfig{ID: b.Name(), URL: b.URL() + "/v1"})
	}
	cfg.Pools = []config.PoolConfig{pool}
	rt, err := router.New(cfg, router.Options{Source: "edge-1", OnApply: applied.record, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rt
}

// TestOverridesEndToEnd drives overrides through a real serve, NATS,
// router and fake backends: a drain over HTTP reaches the snapshot and the
// router sends the backend nothing; a force_open over NATS expires on its
// own; the drain survives a restart of serve; clear returns to the
// analyzer's verdict; malformed requests are refused; FW_AUDIT keeps every
// change.
func TestOverridesEndToEnd(t *testing.T) {
	t.Parallel() // a long test of its own servers: it overlaps the rest of the package
	url, _ := feedtest.NewServer(t)
	// The slow rule is out of reach: on a loaded machine (and under -race)
	// a fake backend's 1 ms TTFT can spike past 5x the median, and an
	// opened b1 with b0 drained leaves no candidate (the picker then
	// spreads over both), which is not what this test is about.
	yaml := "nats: {url: \"" + url + "\"}\nprobes: {disabled: true}\nanalyzer: {slow_factor: 50}\n"
	srv := startServer(t, yaml, Options{})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)

	// A real router over two fake backends, reporting outcomes and
	// following the decisions.
	backends := testkit.StartFakeBackends(t, 2)
	var applied appliedLog
	rt := startRouter(t, url, backends, &applied)
	chat := testkit.NewChatClient(rt.URL())
	send := func(n int) map[string]int {
		got := map[string]int{}
		for i := range n {
			r, err := chat.Post("/v1/completions", map[string]any{"model": "p", "prompt": "x" + string(rune('a'+i%26))})
			if err != nil || r.Status != 200 {
				t.Fatalf("request %d: %v status %d", i, err, r.Status)
			}
			got[r.Backend]++
		}
		return got
	}
	testkit.Eventually(t, 20*time.Second, "both backends in a snapshot", func() bool {
		send(4)
		_, ok0 := snaps.Backend("p", "b0")
		_, ok1 := snaps.Backend("p", "b1")
		return ok0 && ok1
	})

	// Malformed requests are refused, each with a clear error.
	for _, tc := range []struct {
		name string
		req  any
		code int
		want string
	}{
		{"not JSON", `{"action":`, 400, "bad override request"},
		{"unknown action", control.OverrideRequest{Action: "pause", Pool: "p", Backend: "b0", Reason: "x", For: "1m"}, 400, "action \"pause\""},
		{"no reason", control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0", For: "1m"}, 400, "reason is required"},
		{"no duration", control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0", Reason: "x"}, 400, "for = \"\""},
		{"too long", control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0", Reason: "x", For: "8760h"}, 400, "at most"},
		{"weight without a weight", control.OverrideRequest{Action: "weight", Pool: "p", Backend: "b0", Reason: "x", For: "1m"}, 400, "weight in [0, 1]"},
		{"bad pool", control.OverrideRequest{Action: "drain", Pool: "a..b", Backend: "b0", Reason: "x", For: "1m"}, 400, "pool"},
		{"clear without an override", control.OverrideRequest{Action: "clear", Pool: "p", Backend: "b0", Reason: "x"}, 404, "no override in force"},
		{"a backend typo", control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0-WRONG", Reason: "x", For: "1m"}, 404,
			`backend "b0-WRONG" of pool "p" is neither configured nor in a current snapshot (known backends of p: b0, b1)`},
		{"an unknown pool", control.OverrideRequest{Action: "drain", Pool: "no-such-pool", Backend: "b0", Reason: "x", For: "1m"}, 404,
			`pool "no-such-pool" is neither configured nor in a current snapshot (known pools: p)`},
	} {
		code, reply := postOverride(t, srv.httpURL, tc.req)
		if code != tc.code || !strings.Contains(reply.Error, tc.want) || reply.Override != nil {
			t.Errorf("%s: %d %+v, want %d with an error containing %q", tc.name, code, reply, tc.code, tc.want)
		}
	}

	// Drain b0 over HTTP.
	code, reply := postOverride(t, srv.httpURL, control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0", Reason: "kernel upgrade", For: "10m", Who: "alice"})
	if code != 200 || reply.Override == nil || reply.Override.Kind != fleetwatch.OverrideDrain || reply.Override.Who != "alice" {
		t.Fatalf("drain: %d %+v", code, reply)
	}
	testkit.Eventually(t, 10*time.Second, "b0 drained in a snapshot", func() bool {
		b, _ := snaps.Backend("p", "b0")
		return b.Weight == 0 && b.Override != nil && b.Override.Kind == fleetwatch.OverrideDrain && b.Override.Reason == "kernel upgrade"
	})
	snap, _ := snaps.Snapshot("p")
	if err := snap.Validate(); err != nil {
		t.Errorf("drained snapshot: %v", err)
	}
	if b := snap.Find("b0"); b.State != fleetwatch.StateClosed {
		t.Errorf("drained b0 is %s, want closed (the state is unchanged)", b.State)
	}
	testkit.Eventually(t, 10*time.Second, "the router to apply the drain", func() bool {
		b := applied.backend("b0")
		return b.Weight == 0 && b.Override != nil
	})
	if got := send(60); got["b0"] != 0 || got["b1"] != 60 {
		t.Errorf("after the drain the router sent %v, want all 60 to b1", got)
	}
	if code, reply := getOverrides(t, srv.httpURL); code != 200 || len(reply.Overrides) != 1 || reply.Overrides[0].Backend != "b0" {
		t.Errorf("GET /api/overrides: %d %+v, want the drain of b0", code, reply)
	}

	// Force b1 open over NATS for 2s: it expires on its own.
	data, _ := json.Marshal(control.OverrideRequest{Action: "force_open", Pool: "p", Backend: "b1", Reason: "flaky NIC", For: "2s", Who: "bob"})
	m, err := nc.Request("fw.overrides.set", data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var nreply control.OverrideReply
	if err := json.Unmarshal(m.Data, &nreply); err != nil || nreply.Error != "" || nreply.Override == nil {
		t.Fatalf("force_open over NATS: %v %s", err, m.Data)
	}
	testkit.Eventually(t, 10*time.Second, "b1 forced open", func() bool {
		b, _ := snaps.Backend("p", "b1")
		return b.State == fleetwatch.StateOpen && b.OpenUntil != nil && b.OpenUntil.Equal(nreply.Override.Until.Time) && b.Override != nil
	})
	testkit.Eventually(t, 15*time.Second, "the force_open to expire and leave the bucket", func() bool {
		b, _ := snaps.Backend("p", "b1")
		if b.State != fleetwatch.StateClosed || b.Override != nil {
			return false
		}
		_, r := getOverrides(t, srv.httpURL)
		srv.ovr.mu.Lock()
		_, left := srv.ovr.byKey[control.Key("p", "b1")]
		srv.ovr.mu.Unlock()
		return len(r.Overrides) == 1 && !left
	})

	// Restart serve: the drain is still there, in the new epoch's
	// snapshots.
	before, _ := snaps.Snapshot("p")
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	srv = startServer(t, yaml, Options{})
	testkit.Eventually(t, 20*time.Second, "the drain after a restart", func() bool {
		s, ok := snaps.Snapshot("p")
		if !ok || s.Epoch == before.Epoch {
			send(2)
			return false
		}
		b := s.Find("b0")
		return b != nil && b.Weight == 0 && b.Override != nil && b.Override.Who == "alice"
	})

	// Clear: the analyzer's own verdict, a healthy b0 with a weight.
	code, reply = postOverride(t, srv.httpURL, control.OverrideRequest{Action: "clear", Pool: "p", Backend: "b0", Reason: "upgrade done", Who: "alice"})
	if code != 200 || reply.Override == nil || reply.Override.Kind != fleetwatch.OverrideDrain {
		t.Fatalf("clear: %d %+v", code, reply)
	}
	testkit.Eventually(t, 10*time.Second, "b0 back to its own verdict", func() bool {
		b, _ := snaps.Backend("p", "b0")
		return b.Override == nil && b.Weight > 0 && b.State == fleetwatch.StateClosed
	})
	testkit.Eventually(t, 10*time.Second, "the router to send b0 traffic again", func() bool {
		return send(20)["b0"] > 0
	})

	// The audit stream has every change, in order.
	js, _ := jetstream.New(nc)
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	cons, err := js.OrderedConsumer(actx, "FW_AUDIT", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 4 {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("audit after %v: %v", got, err)
		}
		var e control.AuditEntry
		if err := json.Unmarshal(msg.Data(), &e); err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Action+" "+e.Backend+" "+e.Who+" "+e.Via)
	}
	want := []string{"drain b0 alice http", "force_open b1 bob nats", "expire b1 bob expiry", "clear b0 alice http"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("audit = %q, want %q", got, want)
	}
}

// TestOverridesKnownTargets: a configured backend takes an override
// before its first event; a backend or pool that is neither configured
// nor in a snapshot is refused, over HTTP and NATS, naming what is known;
// force sets it anyway (a planned backend), and clear needs no force.
func TestOverridesKnownTargets(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	srv := startServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\npools:\n  - id: chat\n    backends: [{id: b1}, {id: b2}]\n", Options{})
	drain := control.OverrideRequest{Action: "drain", Pool: "chat", Backend: "b2", Reason: "rack move", For: "5m"}
	if code, reply := postOverride(t, srv.httpURL, drain); code != 200 {
		t.Errorf("drain of configured chat/b2: %d %+v", code, reply)
	}
	typo := drain
	typo.Backend = "b2-WRONG"
	code, reply := postOverride(t, srv.httpURL, typo)
	if want := "(known backends of chat: b1, b2)"; code != 404 || !strings.Contains(reply.Error, want) || !strings.Contains(reply.Error, `"b2-WRONG"`) {
		t.Errorf("drain of chat/b2-WRONG: %d %q, want 404 naming b2-WRONG and %s", code, reply.Error, want)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	data, _ := json.Marshal(control.OverrideRequest{Action: "drain", Pool: "no-such-pool", Backend: "b1", Reason: "x", For: "1m"})
	m, err := nc.Request("fw.overrides.set", data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var nreply control.OverrideReply
	if json.Unmarshal(m.Data, &nreply); nreply.Override != nil || !strings.Contains(nreply.Error, `pool "no-such-pool" is neither configured`) {
		t.Errorf("NATS drain of no-such-pool/b1: %s", m.Data)
	}
	typo.Force, typo.Backend = true, "b3"
	if code, reply := postOverride(t, srv.httpURL, typo); code != 200 || reply.Override == nil {
		t.Errorf("forced drain of planned chat/b3: %d %+v", code, reply)
	}
	testkit.Eventually(t, 10*time.Second, "chat/b2 and chat/b3 in force, none of the refused", func() bool {
		_, r := getOverrides(t, srv.httpURL)
		return len(r.Overrides) == 2 && r.Overrides[0].Backend == "b2" && r.Overrides[1].Backend == "b3"
	})
	if code, reply := postOverride(t, srv.httpURL, control.OverrideRequest{Action: "clear", Pool: "chat", Backend: "b3", Reason: "planned no more"}); code != 200 {
		t.Errorf("clear of chat/b3 without force: %d %+v", code, reply)
	}
}

func getOverrides(t *testing.T, base string) (int, control.OverrideReply) {
	t.Helper()
	resp, err := http.Get(base + "/api/overrides")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reply control.OverrideReply
	json.NewDecoder(resp.Body).Decode(&reply)
	return resp.StatusCode, reply
}

// TestOverridesWithoutJetStream checks that a server without JetStream
// refuses overrides, over HTTP and NATS, saying why.
func TestOverridesWithoutJetStream(t *testing.T) {
	srv := startServer(t, "nats: {no_jetstream: true}\nprobes: {disabled: true}\n", Options{})
	req := control.OverrideRequest{Action: "drain", Pool: "p", Backend: "b0", Reason: "x", For: "1m"}
	code, reply := postOverride(t, srv.httpURL, req)
	if code != http.StatusServiceUnavailable || !strings.Contains(reply.Error, "need JetStream") {
		t.Errorf("HTTP: %d %+v, want 503 saying overrides need JetStream", code, reply)
	}
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	data, _ := json.Marshal(req)
	m, err := nc.Request("fw.overrides.set", data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m.Data), "need JetStream") {
		t.Errorf("NATS: %s, want an error saying overrides need JetStream", m.Data)
	}
}

// TestReplyOverrideJSON: a reply names an override with the JSON of the
// analyzer's override (control.BackendOverride is a conversion of it).
func TestReplyOverrideJSON(t *testing.T) {
	w := 0.25
	b := analyzer.BackendOverride{Pool: "p", Backend: "b0", Override: fleetwatch.Override{
		Kind: fleetwatch.OverrideWeight, Reason: "canary", Who: "alice", Until: fleetwatch.At(time.Unix(1700000000, 0)), Weight: &w}}
	want, _ := json.Marshal(b)
	got, _ := json.Marshal(replyOverride(b))
	if string(got) != string(want) {
		t.Errorf("reply override %s, want %s", got, want)
	}
	list, _ := json.Marshal(replyOverrides([]analyzer.BackendOverride{b}))
	if string(list) != "["+string(want)+"]" {
		t.Errorf("reply overrides %s, want [%s]", list, want)
	}
}
