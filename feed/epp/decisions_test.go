package epp

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// pickCounts runs n header-only requests through pk and counts the
// endpoints picked.
func pickCounts(t *testing.T, pk *picker, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		rs, err := pk.exchange(t, reqHeaders(nil, true))
		if err != nil || len(rs) != 1 {
			t.Fatalf("pick: %v %v", rs, err)
		}
		h, _ := destination(rs[0])
		seen[h]++
	}
	return seen
}

// A stale feed fails static, as route does: once the decisions are past
// their ttl, a breaker whose open_until is still ahead stays honoured and
// the others are picked again (with equal weights); the picker never
// fails closed.
func TestStaleFeedFailsStatic(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{})
	now := time.Now()
	old := now.Add(-time.Minute) // at + ttl (5s) is long past: stale on arrival
	pk.publish(t, n, feedtest.Snapshot("llama", "e1", 1, old,
		feedtest.Open(llama.addrs[0], now.Add(time.Hour), "error rate 0.9"),    // still ahead: honoured
		feedtest.Open(llama.addrs[1], now.Add(-time.Second), "error rate 0.9"), // passed: picked again
		feedtest.Closed(llama.addrs[2])))
	seen := pickCounts(t, pk, 60)
	if seen[llama.addrs[0]] > 0 || seen[llama.addrs[1]] == 0 || seen[llama.addrs[2]] == 0 {
		t.Errorf("stale decisions: picks %v; want %s (open until ahead) never, the other two both", seen, llama.addrs[0])
	}
	w := pk.core.Why("llama", llama.addrs[2])
	if w.Class != "stale" {
		t.Errorf("Why under stale decisions: %+v, want class stale", w)
	}
}

// Several pickers on one NATS follow the same fleet-wide decisions: a
// breaker the analyzer opens is honoured by every replica at once, and
// each replica reports its own outcomes under its own source.
func TestReplicasShareTheDecisions(t *testing.T) {
	n := newNATS(t)
	var pks []*picker
	for i := range 3 {
		pks = append(pks, startPicker(t, n, Settings{Source: fmt.Sprintf("replica-%d", i)}))
	}
	now := time.Now()
	snap := feedtest.Snapshot("llama", "e1", 1, now,
		feedtest.Closed(llama.addrs[0]),
		feedtest.Open(llama.addrs[1], now.Add(time.Minute), "error rate 0.9"),
		feedtest.Closed(llama.addrs[2]))
	n.script.Publish(snap)
	for i, pk := range pks {
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("replica %d to apply the decision", i), func() bool {
			return pk.core.Why("llama", llama.addrs[1]).State == fleetwatch.StateOpen
		})
	}
	for i, pk := range pks {
		if seen := pickCounts(t, pk, 30); seen[llama.addrs[1]] > 0 {
			t.Errorf("replica %d picked the open breaker: %v", i, seen)
		}
		_, err := pk.exchange(t, reqHeaders(nil, true), respHeaders(map[string]string{":status": "200"}, true))
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range pks {
		if evs := eventsOf(t, n, fmt.Sprintf("replica-%d", i), 1); evs[0].Pool != "llama" {
			t.Errorf("replica %d event %+v", i, evs[0])
		}
	}
}

// With prefix_from system the pick waits for the body and keeps a system
// prompt on one backend (route's rendezvous affinity, the same hash: the
// event carries it as route writes it), while other prompts spread.
func TestPrefixAffinityAtTheEndOfTheBody(t *testing.T) {
	n := newNATS(t)
	pk := startPicker(t, n, Settings{PrefixFrom: "system", Source: "sticky"})
	pk.publish(t, n, feedtest.Snapshot("llama", "e1", 1, time.Now(),
		feedtest.Closed(llama.addrs[0]), feedtest.Closed(llama.addrs[1]), feedtest.Closed(llama.addrs[2])))
	sticky := map[string]int{}
	spread := map[string]int{}
	for i := range 30 {
		body := chatBody(40) // one system prompt
		rs, err := pk.exchange(t, reqHeaders(nil, false), reqBody(body[:30], false), reqBody(body[30:], true),
			respHeaders(map[string]string{":status": "200"}, true))
		if err != nil || len(rs) < 2 {
			t.Fatalf("%v %v", rs, err)
		}
		h, _ := destination(rs[0])
		sticky[h]++
		other := strings.Replace(chatBody(40), `"sss`, fmt.Sprintf(`"%03d`, i), 1)
		rs, err = pk.exchange(t, reqHeaders(nil, false), reqBody(other, true))
		if err != nil {
			t.Fatal(err)
		}
		h, _ = destination(rs[0])
		spread[h]++
	}
	if len(sticky) != 1 || len(spread) < 2 {
		t.Errorf("one system prompt went to %v (want one backend); thirty different ones to %v (want several)", sticky, spread)
	}
	evs := eventsOf(t, n, "sticky", 30)
	if evs[0].Prefix == "" {
		t.Errorf("event %+v carries no prefix", evs[0])
	}
}
