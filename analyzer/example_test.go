package analyzer_test

import (
	"fmt"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// A backend that fails fast is opened after five failures in a row, probed
// after its open time, and closed again after five successes.
func Example() {
	a, err := analyzer.New(analyzer.Config{
		Epoch:    "example",
		Settings: analyzer.Settings{OpenJitter: -1}, // exact open times for the example
		Pools: []analyzer.PoolConfig{{ID: "llama", Backends: []analyzer.BackendConfig{
			{ID: "vllm-a"}, {ID: "vllm-b"},
		}}},
	})
	if err != nil {
		panic(err)
	}
	start := time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)
	events := func(backend string, outcome fleetwatch.Outcome, n int, from time.Time) []fleetwatch.Event {
		var out []fleetwatch.Event
		for i := range n {
			out = append(out, fleetwatch.Event{Pool: "llama", Backend: backend, Outcome: outcome,
				TS: from.Add(time.Duration(i) * 100 * time.Millisecond), TTFTMs: 180, HasTTFT: outcome == fleetwatch.OutcomeOK})
		}
		return out
	}
	show := func(ev analyzer.Evaluation) {
		for _, t := range ev.Transitions {
			fmt.Printf("%s %s: %s -> %s (%s)\n", t.At.Format("15:04:05"), t.Backend, t.From, t.To, t.Reason)
		}
	}

	a.Observe(events("vllm-a", fleetwatch.OutcomeOK, 20, start))
	if urgent := a.Observe(events("vllm-b", fleetwatch.OutcomeError, 5, start)); urgent {
		show(a.Evaluate(start.Add(time.Second)))
	}
	show(a.Evaluate(start.Add(31 * time.Second)))
	a.Observe(events("vllm-b", fleetwatch.OutcomeOK, 5, start.Add(32*time.Second)))
	ev := a.Evaluate(start.Add(33 * time.Second))
	show(ev)
	// The weight ramps from the half-open 0.05 by 0.25 per heartbeat (two
	// since 07:50:31), to damp a herd of routers returning at once.
	b := ev.Snapshots[0].Find("vllm-b")
	fmt.Printf("seq %d: vllm-b %s weight %.2f\n", ev.Snapshots[0].Seq, b.State, b.Weight)
	// Output:
	// 07:50:01 vllm-b: closed -> open (5 consecutive failures)
	// 07:50:31 vllm-b: open -> half_open (open for 30s; probing with weight 0.05)
	// 07:50:33 vllm-b: half_open -> closed (5 ok in a row while half-open)
	// seq 3: vllm-b closed weight 0.55
}
