package route

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/testkit"

	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// manualClock is a clock the test moves forward; safe for concurrent use.
type manualClock struct{ ns atomic.Int64 }

func (c *manualClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Without a feed (no decision ever arrived, so the picker routes on its own
// signals) a backend that answers 500 at once has nothing in flight and
// would win every comparison it is in. The picker's local breaker keeps it
// under 5% of the attempts; without it (LocalFailures -1), it draws far
// more. Eight clients send at once; the other backends take 20 ms; the
// clock moves 1 s per round of 40 requests.
func TestRouteStaleLocalBreakerFastFailure(t *testing.T) {
	for _, tt := range []struct {
		name           string
		localFailures  int
		minBad, maxBad float64 // the band of the failing backend's share of attempts
	}{
		{"local breaker", 0, 0, 0.05},
		{"no local breaker: the trap", -1, 0.2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			good1 := startCountingBackend(t, "good1", http.StatusOK)
			good2 := startCountingBackend(t, "good2", http.StatusOK)
			bad := startCountingBackend(t, "bad", http.StatusInternalServerError)
			good1.delay.Store(int64(20 * time.Millisecond))
			good2.delay.Store(int64(20 * time.Millisecond))
			clk := &manualClock{}
			clk.Advance(time.Duration(time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC).UnixNano()))
			pool := countingPool(good1, good2, bad)
			pool.Picker = p2c.Settings{LocalFailures: tt.localFailures}
			_, url := serveRouter(t, Settings{Pools: []Pool{pool}, Now: clk.Now, Seed: 7, PrefixFrom: PrefixNone})
			c := testkit.NewChatClient(url)

			const rounds, workers, perWorker = 30, 8, 5
			for round := range rounds {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range perWorker {
							if _, err := c.Chat("", fmt.Sprint(round, w, i), false); err != nil {
								t.Errorf("request: %v", err)
							}
						}
					}()
				}
				wg.Wait()
				clk.Advance(time.Second)
			}
			b, total := bad.requests.Load(), bad.requests.Load()+good1.requests.Load()+good2.requests.Load()
			share := float64(b) / float64(total)
			t.Logf("the failing backend got %d of %d attempts (%.3f)", b, total, share)
			if share < tt.minBad || share > tt.maxBad {
				t.Errorf("the failing backend got %d of %d attempts (share %.3f), want a share in [%.2f, %.2f]",
					b, total, share, tt.minBad, tt.maxBad)
			}
		})
	}
}
