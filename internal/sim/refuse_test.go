package sim

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// The share a failing or refusing backend gets, over pools of 4, 16 and 64
// backends (--scale 1, 4, 16) behind 1, 4 and 8 routers, seeds 1-5, the
// scenarios shortened to 2 minutes (the incident from 30 s):
//
//   - bare-429's b3 answers every request with an instant bare 429. The
//     refusal rule (analyzer.Settings.ThrottleRefuseRate) opens it within
//     15 s, and from then on it gets at most 1% of the attempts, its
//     half-open trickles included. Without the rule (FWNoRefuse) it is
//     only down-weighted and keeps more than 1% (2-12% over 20 seeds,
//     docs/EVALUATION.md "A backend that refuses everything"), so the
//     test fails without it.
//   - fast-failure's b3 answers every request with an instant 500: the
//     consecutive-failure rule opens it, then at most 1% likewise.
//   - While half-open, the backend gets a trickle: its share of the
//     attempts sent in its half-open periods, pooled over every cell and
//     seed, is at most twice the trickle weight (0.05): the scan's promise
//     (p2c TestScanDownWeighted) plus noise, since a period ends at the
//     first attempt sent to it (its first 429 or 500 reopens it).
//
// And a pool-wide overload still opens nothing (overload, at 1, 4 and 8
// routers, 4 backends).
func TestRefusingBackendShare(t *testing.T) {
	long(t)
	const limit, trickle = 0.01, 0.05
	var (
		mu                  sync.Mutex
		halfHits, halfTotal = map[string]int{}, map[string]int{}
	)
	t.Run("shares", func(t *testing.T) {
		for _, k := range []int{1, 4, 16} {
			for _, routers := range []int{1, 4, 8} {
				t.Run(fmt.Sprintf("%d backends, %d routers", 4*k, routers), func(t *testing.T) {
					t.Parallel()
					for _, name := range []string{Refusing, FastFailure} {
						sc := withRouters(scenario(t, name).Shorten(2*time.Minute).Scaled(k), routers)
						policies := []string{Fleetwatch}
						if name == Refusing {
							policies = append(policies, FWNoRefuse)
						}
						res := runs(t, sc, policies...)
						for i, seed := range seeds {
							r := res[Fleetwatch][i]
							t.Logf("%s seed %d: opened after %.1f s; share once open %.4f%%; half-open: %d of %d attempts over %d periods",
								name, seed, r.WatchOpenMs/1000, 100*r.DetectedShare, r.HalfOpenHits, r.HalfOpenAttempts, r.HalfOpens)
							if !(r.WatchOpenMs <= 15000) { // NaN: never opened
								t.Errorf("%s seed %d: b3 opened after %.1f s, want <= 15 s", name, seed, r.WatchOpenMs/1000)
							}
							if !(r.DetectedShare <= limit) {
								t.Errorf("%s seed %d: b3 got %.3f%% of the attempts once open, want <= %.0f%%", name, seed, 100*r.DetectedShare, 100*limit)
							}
							mu.Lock()
							halfHits[name] += r.HalfOpenHits
							halfTotal[name] += r.HalfOpenAttempts
							mu.Unlock()
							if name == Refusing {
								if before := res[FWNoRefuse][i]; !(before.WatchShare > limit) {
									t.Errorf("seed %d: without the refusal rule b3 got %.3f%% of the attempts: the scenario no longer needs the rule",
										seed, 100*before.WatchShare)
								}
							}
						}
					}
				})
			}
		}
	})
	for _, name := range []string{Refusing, FastFailure} {
		share := float64(halfHits[name]) / float64(halfTotal[name])
		t.Logf("%s: while half-open b3 got %d of %d attempts (%.1f%%), all cells and seeds", name, halfHits[name], halfTotal[name], 100*share)
		if !(share <= 2*trickle) {
			t.Errorf("%s: while half-open b3 got %.1f%% of the attempts, want at most %.0f%% (the trickle weight is %.0f%%)",
				name, 100*share, 200*trickle, 100*trickle)
		}
	}
	for _, routers := range []int{1, 4, 8} {
		t.Run(fmt.Sprintf("overload, %d routers", routers), func(t *testing.T) {
			t.Parallel()
			for i, r := range runs(t, withRouters(scenario(t, Overload), routers), Fleetwatch)[Fleetwatch] {
				if r.Opens != 0 {
					t.Errorf("seed %d: %d breakers opened in a pool-wide overload, want none", seeds[i], r.Opens)
				}
			}
		})
	}
}
