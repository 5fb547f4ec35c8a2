package p2c_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// A router applies each decision snapshot with Update, then for every
// request: Pick (which counts it in flight), send, and Done on the Choice.
func Example() {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	picker := p2c.New(p2c.Settings{Now: func() time.Time { return now }})
	picker.Update(&fleetwatch.Snapshot{
		V: 1, Pool: "llama-3.1-70b", Epoch: "e1", Seq: 1,
		At: fleetwatch.At(now), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
		MedianEWMATTFTMs: new(float64(200)),
		Backends: []fleetwatch.Backend{
			{Backend: "vllm-a", State: fleetwatch.StateClosed, Weight: 1, EWMATTFTMs: new(float64(200))},
			{Backend: "vllm-b", State: fleetwatch.StateOpen, Weight: 0, OpenUntil: new(fleetwatch.At(now.Add(30 * time.Second)))},
			{Backend: "vllm-c", State: fleetwatch.StateClosed, Weight: 1, EWMATTFTMs: new(float64(210))},
		},
	})
	r := rand.New(rand.NewPCG(1, 2))
	busy, _ := picker.Choose("vllm-a") // another request is already on vllm-a
	defer busy.Done(fleetwatch.OutcomeOK, 190, false)

	choice, err := picker.Pick(r, p2c.Request{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("picked", choice.Backend)
	// ... send the request, then:
	choice.Done(fleetwatch.OutcomeOK, 180, false)
	choice.Done(fleetwatch.OutcomeOK, 180, false) // a second Done is a no-op
	// Output: picked vllm-c
}

// With the default score the picker ranks by the load the snapshot
// publishes for each backend (fleet-wide) plus the number of routers times
// its own change since the snapshot: here vllm-a is busy across the fleet
// although this router has sent it nothing, and its own two requests to
// vllm-c count as 2 x 4 routers.
func ExampleLoadScore() {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	picker := p2c.New(p2c.Settings{Score: p2c.LoadScore, Now: func() time.Time { return now }})
	backend := func(id string, running float64) fleetwatch.Backend {
		return fleetwatch.Backend{Backend: id, State: fleetwatch.StateClosed, Weight: 1,
			Load: &fleetwatch.Load{Running: running, Source: "event"}}
	}
	picker.Update(&fleetwatch.Snapshot{
		V: 1, Pool: "llama-3.1-70b", Epoch: "e1", Seq: 1, At: fleetwatch.At(now), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Routers: 4,
		Backends: []fleetwatch.Backend{backend("vllm-a", 12), backend("vllm-b", 9), backend("vllm-c", 2)},
	})
	for range 2 {
		c, _ := picker.Choose("vllm-c") // 2 + 4 x 2 = 10
		defer c.Done(fleetwatch.OutcomeOK, 150, false)
	}
	r := rand.New(rand.NewPCG(1, 2))
	choice, _ := picker.Pick(r, p2c.Request{}) // three choices of three: the least loaded
	fmt.Println("picked", choice.Backend)
	choice.Done(fleetwatch.OutcomeOK, 150, false)
	// Output: picked vllm-b
}
