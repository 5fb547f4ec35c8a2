package route

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// The cost term through the router: two cheap and two expensive backends,
// equally fast, under concurrent load. Cost ignored, the cheap pair gets
// about half of the requests; at an exchange rate of 300 ms per unit of
// cost_per_mtok (CostWeightPerMs 1/300), clearly more, and the expensive
// pair still some.
func TestRouteCostExchangeRate(t *testing.T) {
	share := func(t *testing.T, msPerUnit float64) float64 {
		var bs []*countingBackend
		for _, id := range []string{"cheap1", "cheap2", "dear1", "dear2"} {
			b := startCountingBackend(t, id, http.StatusOK)
			b.delay.Store(int64(10 * time.Millisecond))
			bs = append(bs, b)
		}
		pool := countingPool(bs...)
		// Two choices: with three of these four backends one of the
		// sample is always cheap, and 8 clients never load the cheap
		// pair enough for an expensive one to win.
		pool.Picker = p2c.Settings{Choices: 2}
		if msPerUnit > 0 {
			pool.Picker.CostWeightPerMs = 1 / msPerUnit
		}
		rt, url := serveRouter(t, Settings{Pools: []Pool{pool}, Seed: 3, PrefixFrom: PrefixNone})
		snap := &fleetwatch.Snapshot{
			V: 1, Pool: "llama", Epoch: "e1", Seq: 1, At: fleetwatch.At(time.Now()), TTLMs: 3_600_000,
			Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, MedianEWMATTFTMs: new(float64(100)),
		}
		for _, b := range bs {
			cost := 0.2
			if b.id[:4] == "dear" {
				cost = 2
			}
			snap.Backends = append(snap.Backends, fleetwatch.Backend{Backend: b.id, State: fleetwatch.StateClosed,
				Weight: 1, Drift: fleetwatch.DriftOK, EWMATTFTMs: new(float64(100)), CostPerMTok: new(float64(cost))})
		}
		rt.Apply(snap)
		c := testkit.NewChatClient(url)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 40 {
					if r, err := c.Chat("", fmt.Sprint(w, i), false); err != nil || r.Status != http.StatusOK {
						t.Errorf("request: %v, status %d", err, r.Status)
					}
				}
			}()
		}
		wg.Wait()
		cheap := bs[0].requests.Load() + bs[1].requests.Load()
		total := cheap + bs[2].requests.Load() + bs[3].requests.Load()
		return float64(cheap) / float64(total)
	}
	blind := share(t, 0)
	aware := share(t, 300)
	t.Logf("the cheap backends' share: %.3f with cost ignored, %.3f at 300 ms per unit", blind, aware)
	if blind < 0.35 || blind > 0.65 {
		t.Errorf("cost ignored: the cheap backends' share is %.3f, want about 0.5", blind)
	}
	if aware < blind+0.12 || aware > 0.99 {
		t.Errorf("at 300 ms per unit: the cheap backends' share is %.3f, want clearly above %.3f and below 0.99", aware, blind)
	}
}
