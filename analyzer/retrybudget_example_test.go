package analyzer_test

import (
	"fmt"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// A publisher computes the pool's retry budget from the snapshot's
// backends, their capacities and the pool's attempt rate.
func ExampleComputeRetryBudget() {
	slots := map[string]float64{"a": 8, "b": 8}
	backends := []fleetwatch.Backend{
		{Backend: "a", Load: &fleetwatch.Load{Running: 8, Waiting: 2}},
		{Backend: "b", Load: &fleetwatch.Load{Running: 7}},
	}
	rb := analyzer.ComputeRetryBudget(backends, func(id string) float64 { return slots[id] }, 120, analyzer.RetryBudgetSettings{})
	fmt.Printf("free %v, spare %.3f, %.0f retries/s for the fleet\n", rb.Free, *rb.Spare, rb.PerSec)
	// Output: free false, spare -0.062, 23 retries/s for the fleet
}
