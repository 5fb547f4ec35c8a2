package route

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// The snapshot's retry budget through the router: a backend failing with
// 500 and a healthy one, and a per-router budget that allows no retry.
// While the snapshot says the pool has spare capacity (retry_budget.free)
// every failed first attempt is retried on the healthy backend; once it
// says the pool is busy with a fleet budget of 0 retries a second, the
// retries are refused and counted.
func TestRouteFollowsSnapshotRetryBudget(t *testing.T) {
	bad := startCountingBackend(t, "bad", http.StatusInternalServerError)
	good := startCountingBackend(t, "good", http.StatusOK)
	pool := countingPool(bad, good)
	pool.Picker = p2c.Settings{RetryRatio: 1e-9, RetryFloorPerSec: 1e-9} // no retries of its own
	rt, url := serveRouter(t, Settings{Pools: []Pool{pool}, Seed: 5, PrefixFrom: PrefixNone, MaxAttempts: 2})
	snap := func(seq uint64, rb *fleetwatch.RetryBudget) *fleetwatch.Snapshot {
		s := &fleetwatch.Snapshot{
			V: 1, Pool: "llama", Epoch: "e1", Seq: seq, At: fleetwatch.At(time.Now()), TTLMs: 3_600_000,
			Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Routers: 1, RetryBudget: rb,
		}
		for _, id := range []string{"bad", "good"} {
			s.Backends = append(s.Backends, fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftOK})
		}
		return s
	}
	c := testkit.NewChatClient(url)
	failures := func(n int) int {
		failed := 0
		for i := range n {
			r, err := c.Chat("", fmt.Sprint(i), false)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusOK {
				failed++
			}
		}
		return failed
	}
	spare := 0.8
	rt.Apply(snap(1, &fleetwatch.RetryBudget{Free: true, Spare: &spare, PerSec: 0}))
	if got := failures(40); got != 0 {
		t.Errorf("retries free: %d of 40 requests failed, want 0 (each failure retried on the healthy backend)", got)
	}
	if bad.requests.Load() == 0 {
		t.Fatal("the failing backend got no request: nothing was retried")
	}
	busy := -0.2
	rt.Apply(snap(2, &fleetwatch.RetryBudget{Free: false, Spare: &busy, PerSec: 0}))
	before := bad.requests.Load()
	got := failures(40)
	if sent := bad.requests.Load() - before; got == 0 || int64(got) != sent {
		t.Errorf("fleet budget of 0/s: %d of 40 requests failed with %d sent to the failing backend; want every one of those to fail unretried", got, sent)
	}
}
