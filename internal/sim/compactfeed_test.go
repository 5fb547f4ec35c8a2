package sim

import (
	"fmt"
	"testing"
	"time"
)

// natsFraming is what NATS adds to a frame on its way to a subscriber:
// the MSG line (subject fw.feed.<pool>, subscription id, size) and CRLFs.
const natsFraming = 50

// The compact feed of a 100-backend pool (mixed-equal over 100 backends,
// 75% busy, loads moving all the time) costs a router at most 3 KB a
// second with NATS framing, at 4 and at 64 routers (docs/EVALUATION.md
// "The compact feed"; the JSON snapshots of the same pool cost 36.8 KB a
// second at 4 routers before the compact feed), with the events' loads
// and with every backend's metrics read as well at scrape.interval's
// default of 250 ms (fw-both-loads: "What the two goals need"); and it
// reaches every router (a key frame, then load frames four times a
// second).
func TestCompactFeedCost(t *testing.T) {
	long(t)
	for _, c := range []struct {
		policy string
		scrape time.Duration
	}{{Fleetwatch, 0}, {FWBothLoads, 250 * time.Millisecond}} {
		for _, routers := range []int{4, 64} {
			t.Run(fmt.Sprintf("%s %d routers", c.policy, routers), func(t *testing.T) {
				sc := withRouters(scenario(t, MixedEqual).Shorten(2*time.Minute).Scaled(25), routers)
				if len(sc.Backends) != 100 {
					t.Fatalf("%d backends, want 100", len(sc.Backends))
				}
				sc.ScrapeInterval = c.scrape
				r := runsOver(t, sc, []uint64{1}, c.policy)[c.policy][0]
				secs := sc.Duration.Seconds()
				perSec := (float64(r.FeedBytes) + natsFraming*float64(r.FeedFrames)) / secs
				t.Logf("%d routers: %d frames, %d bytes: %.0f bytes a second with NATS framing, %.1f frames a second",
					routers, r.FeedFrames, r.FeedBytes, perSec, float64(r.FeedFrames)/secs)
				if perSec > 3000 {
					t.Errorf("%.0f bytes a second, want at most 3000", perSec)
				}
				if f := float64(r.FeedFrames) / secs; f < 3.5 {
					t.Errorf("%.1f frames a second, want about 4 (a load beat every 250 ms)", f)
				}
			})
		}
	}
}
