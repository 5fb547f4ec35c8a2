package p2c

import (
	"testing"

	"github.com/fleetwatch/fleetwatch"
)

// The cost term trades money for latency: with backends equal in speed and
// load, the cheap ones win more of the comparisons as the exchange rate
// (ms of TTFT per unit of cost_per_mtok, 1 / CostWeightPerMs) rises, and
// the expensive ones keep some traffic, since they win once the cheap ones
// are enough busier.
func TestCostExchangeRateShiftsTraffic(t *testing.T) {
	cheapShare := func(msPerUnit float64) float64 {
		// Two choices: with three of these four backends one of the
		// sample is always cheap, and at 1000 ms per unit cost decides
		// every comparison.
		s := Settings{RetryRatio: -1, Choices: 2}
		if msPerUnit > 0 {
			s.CostWeightPerMs = 1 / msPerUnit
		}
		p := newPicker(&clock{now: t0}, s)
		bs := []fleetwatch.Backend{backend("cheap1", 100), backend("cheap2", 100), backend("dear1", 100), backend("dear2", 100)}
		for i := range bs {
			bs[i].CostPerMTok = new(float64(0.2))
			if i >= 2 {
				bs[i].CostPerMTok = new(float64(2))
			}
		}
		p.Update(pool(1, bs...))
		r := seeded(9)
		var inFlight []*Choice
		cheap := 0
		const n = 20000
		for range n {
			c, err := p.Pick(r, Request{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Backend == "cheap1" || c.Backend == "cheap2" {
				cheap++
			}
			inFlight = append(inFlight, &c)
			if len(inFlight) > 12 { // every request takes 12 picks: equal speed
				inFlight[0].Done(fleetwatch.OutcomeOK, 100, false)
				inFlight = inFlight[1:]
			}
		}
		return float64(cheap) / n
	}
	rates := []float64{0, 100, 300, 1000}
	var shares []float64
	for _, rate := range rates {
		shares = append(shares, cheapShare(rate))
	}
	t.Logf("ms_per_cost_unit %v: the cheap backends' share %.3f", rates, shares)
	if shares[0] < 0.45 || shares[0] > 0.55 {
		t.Errorf("cost ignored (rate 0): cheap share %.3f, want about 0.5", shares[0])
	}
	for k := 1; k < len(shares); k++ {
		if shares[k] < shares[k-1]+0.03 {
			t.Errorf("rate %v: cheap share %.3f, want clearly above %.3f at rate %v", rates[k], shares[k], shares[k-1], rates[k-1])
		}
	}
	if last := shares[len(shares)-1]; last >= 0.999 {
		t.Errorf("rate %v: the expensive backends got nothing (cheap share %.4f): cost must be a trade, not a filter", rates[len(rates)-1], last)
	}
}
