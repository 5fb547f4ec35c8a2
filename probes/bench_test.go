package probes_test

import (
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// benchCycles returns n cycles of the default suite from the toy model at
// logit noise 0.03, an hour apart.
func benchCycles(b *testing.B, n int) (*drift.Suite, []*drift.Cycle) {
	b.Helper()
	s, err := drift.LoadSuite("")
	if err != nil {
		b.Fatal(err)
	}
	m := toylm.New(toylm.Config{}).With(toylm.Options{Sigma: 0.03, NoiseSeed: 1})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]*drift.Cycle, n)
	for i := range out {
		out[i] = toylm.Cycle(s, m, t0.Add(time.Duration(i)*time.Hour))
	}
	return s, out
}

// BenchmarkMeasure is S1-S3 of one cycle against a 16-cycle baseline: the
// baseline for BenchmarkObserve.
func BenchmarkMeasure(b *testing.B) {
	s, cycles := benchCycles(b, 17)
	base, err := drift.BuildBaseline(s, cycles[:16], 0.002)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		drift.Measure(base, cycles[16])
	}
}

// BenchmarkObserve is a whole judged cycle: S1-S4, the rules and the status
// machine (what a probe cycle costs besides its HTTP requests).
func BenchmarkObserve(b *testing.B) {
	s, cycles := benchCycles(b, 18)
	mon := drift.NewMonitor("p", "b", drift.MonitorSettings{Suite: s, Enrol: 16, EnrolMin: -1}, nil)
	for _, c := range cycles[:16] {
		if _, err := mon.Observe(c, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c := *cycles[16+i%2]
		c.At = c.At.Add(time.Duration(i) * time.Hour)
		i++
		if _, err := mon.Observe(&c, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuildBaseline is enrolment from 16 cycles: the profile, 16
// leave-one-out and 120 leave-two-out profiles.
func BenchmarkBuildBaseline(b *testing.B) {
	s, cycles := benchCycles(b, 16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := drift.BuildBaseline(s, cycles, 0.002); err != nil {
			b.Fatal(err)
		}
	}
}
