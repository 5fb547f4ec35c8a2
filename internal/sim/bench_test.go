package sim

import (
	"testing"
	"time"
)

// BenchmarkRun measures the simulator's speed in simulated requests per
// wall second (the requests/s metric), for a cheap baseline policy and for
// fleetwatch (the real analyzer and picker in the loop).
func BenchmarkRun(b *testing.B) {
	sc, _ := ScenarioByName(MixedEqual)
	sc = sc.Shorten(2 * time.Minute)
	for _, p := range []string{Random, Fleetwatch} {
		b.Run(p, func(b *testing.B) {
			requests := 0
			for b.Loop() {
				r, err := Run(sc, p, 1)
				if err != nil {
					b.Fatal(err)
				}
				requests += r.Requests
			}
			b.ReportMetric(float64(requests)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}
