package sim

import "testing"

func TestAdhoc2(t *testing.T) {
	sc, _ := ScenarioByName(BadRequests)
	sc.Routers = 1
	for i := range sc.Incidents {
		sc.Incidents[i].Rate = 1
	}
	for seed := uint64(1); seed <= 8; seed++ {
		r, _ := Run(sc, Fleetwatch, seed)
		t.Logf("seed %d opens %d", seed, r.Opens)
	}
}
