package analyzer_test

import (
	"fmt"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// A backend's load comes from its metrics (ObserveLoad) and from events
// that carry an ORCA report; the newest wins field by field, and the
// snapshot publishes it with its age until load_max_age.
func ExampleAnalyzer_ObserveLoad() {
	a, _ := analyzer.New(analyzer.Config{Epoch: "example", Pools: []analyzer.PoolConfig{
		{ID: "llama", Backends: []analyzer.BackendConfig{{ID: "vllm-a"}}},
	}})
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	a.Evaluate(t0)
	// serve read the backend's /metrics ...
	a.ObserveLoad("llama", "vllm-a", analyzer.LoadReport{Running: 12, HasRunning: true, Waiting: 3, HasWaiting: true}, t0)
	// ... and a router's event then carried vLLM's ORCA report (waiting
	// and KV cache, no running count).
	a.Observe([]fleetwatch.Event{{Pool: "llama", Backend: "vllm-a", Status: 200, HasStatus: true, Source: "router-1",
		TS: t0.Add(400 * time.Millisecond), Waiting: 5, HasWaiting: true, KVCacheUsage: 0.5, HasKVCache: true}})
	show := func(at time.Duration) {
		snap, _ := a.Snapshot("llama", t0.Add(at))
		if l := snap.Find("vllm-a").Load; l != nil {
			fmt.Printf("at %v: running %v waiting %v kv %v age %dms from %s; routers %d\n",
				at, l.Running, l.Waiting, *l.KVCacheUsage, l.AgeMs, l.Source, snap.Routers)
		} else {
			fmt.Printf("at %v: no load; routers %d\n", at, snap.Routers)
		}
	}
	show(time.Second)
	show(3200 * time.Millisecond) // the metrics' running count is now older than 3s
	show(4 * time.Second)         // and so is the event's report
	// Output:
	// at 1s: running 12 waiting 5 kv 0.5 age 600ms from event; routers 1
	// at 3.2s: running 0 waiting 5 kv 0.5 age 2800ms from event; routers 1
	// at 4s: no load; routers 1
}
