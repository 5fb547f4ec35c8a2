package p2c_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// A snapshot in shadow mode "observe": the picker routes as if every
// backend were healthy, and counts the picks the decisions would not have
// made.
func ExamplePicker_ShadowStats() {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	picker := p2c.New(p2c.Settings{Now: func() time.Time { return now }})
	picker.Update(&fleetwatch.Snapshot{
		V: 1, Pool: "llama-3.1-70b", Epoch: "e1", Seq: 1,
		At: fleetwatch.At(now), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
		Shadow: fleetwatch.ShadowObserve,
		Backends: []fleetwatch.Backend{
			{Backend: "vllm-a", State: fleetwatch.StateClosed, Weight: 1},
			{Backend: "vllm-b", State: fleetwatch.StateOpen, Weight: 0, OpenUntil: new(fleetwatch.At(now.Add(30 * time.Second)))},
		},
	})
	r := rand.New(rand.NewPCG(1, 2))
	toB := 0
	for range 1000 {
		choice, err := picker.Pick(r, p2c.Request{})
		if err != nil {
			fmt.Println(err)
			return
		}
		if choice.Backend == "vllm-b" {
			toB++
		}
		choice.Done(fleetwatch.OutcomeOK, 200, false)
	}
	st := picker.ShadowStats()
	fmt.Println("mode:", st.Mode)
	fmt.Println("picks:", st.Picks)
	fmt.Println("picks of the open vllm-b counted:", st.ExcludedOpen == uint64(toB) && toB > 0)
	// Output:
	// mode: observe
	// picks: 1000
	// picks of the open vllm-b counted: true
}
