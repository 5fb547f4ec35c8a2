package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/bench"
)

// TestBenchScale runs the scale benchmark end to end, small (2 pools of
// 10 backends, 3 then 6 routers, 3 s windows): three real nats-server
// processes, a real serve, the routers' watchers and pickers, the join
// and a killed node. It checks the report's structure and that it is
// sane, never a wall-clock time: every router received the feed within a
// bound the frames' structure sets, nobody was a slow consumer or
// dropped a frame, the joining router created no JetStream consumer and
// the routers of the killed node came back.
func TestBenchScale(t *testing.T) {
	t.Parallel() // a long test of its own processes: it overlaps the rest of the package
	const pools, backends = 2, 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var windows []string // what --cpuprofile hangs on: each window with routers, started and ended
	r, err := bench.RunScale(ctx, bench.ScaleSettings{
		Fleetwatch: fleetwatchBinary(t), NATSServer: natsServerBinary(t),
		Pools: pools, Backends: backends, Routers: []int{3, 6},
		Duration: 3 * time.Second, Warmup: time.Second, Seed: 7, Dir: t.TempDir(),
		Logf: t.Logf, GOGC: 150,
		Window: func(n int) func() {
			windows = append(windows, fmt.Sprintf("start %d", n))
			return func() { windows = append(windows, fmt.Sprintf("end %d", n)) }
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"start 3", "end 3", "start 6", "end 6"}; !slices.Equal(windows, want) {
		t.Errorf("window hook calls %q, want %q", windows, want)
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", md.String())
	if len(r.Steps) != 3 || r.Steps[0].Routers != 0 || r.Steps[1].Routers != 3 || r.Steps[2].Routers != 6 {
		t.Fatalf("steps: got %d, want the baseline then 3 and 6 routers", len(r.Steps))
	}
	// At most about 4.5 frames per pool-second (a heartbeat and three load
	// beats, and a key frame now and then), none larger than a key frame of
	// the whole pool: a header and at most 24 bytes per backend.
	structural := 4.5 * (64 + 24*backends)
	for _, st := range r.Steps[1:] {
		if len(st.Nodes) != 3 || len(st.Links) != 6 || len(st.Serves) != 1 {
			t.Errorf("%d routers: %d nodes, %d links, %d serves; want 3, 6, 1", st.Routers, len(st.Nodes), len(st.Links), len(st.Serves))
		}
		for _, sv := range st.Serves {
			if sv.EventsRefused != 0 || sv.EventsDropped != 0 {
				t.Errorf("%d routers: serve refused %.0f and dropped %.0f of the synthetic events, want none", st.Routers, sv.EventsRefused, sv.EventsDropped)
			}
		}
		if !(st.PayloadPerPoolSec > 0 && st.WirePerPoolSec > st.PayloadPerPoolSec && st.PayloadPerPoolSec < structural) {
			t.Errorf("%d routers: payload %.0f B and wire %.0f B per pool-second, want 0 < payload < wire, payload < %.0f",
				st.Routers, st.PayloadPerPoolSec, st.WirePerPoolSec, structural)
		}
		if st.AgeSamples == 0 || st.AgeP99Ms < st.AgeP50Ms {
			t.Errorf("%d routers: %d load ages, p50 %.0f p99 %.0f", st.Routers, st.AgeSamples, st.AgeP50Ms, st.AgeP99Ms)
		}
		if st.HeapMiB <= 0 || st.GCCPU < 0 {
			t.Errorf("%d routers: the routers' process's heap %.1f MiB, GC %.3f cores", st.Routers, st.HeapMiB, st.GCCPU)
		}
		if st.SlowConsumers != 0 || st.Dropped != 0 || st.Malformed != 0 {
			t.Errorf("%d routers: %d slow consumers, %d dropped, %d malformed", st.Routers, st.SlowConsumers, st.Dropped, st.Malformed)
		}
	}
	m := r.Model
	if !(m.PoolBytesPerSec > 0 && m.PoolBytesPerSec < structural) || len(m.Points) != 3 || len(m.Predictions) != 2 {
		t.Errorf("model: %.0f B per pool-second, %d points, %d predictions", m.PoolBytesPerSec, len(m.Points), len(m.Predictions))
	}
	if j := r.Join; j == nil || !j.Compact || j.Bytes <= 0 || j.ConsumersAfter != j.ConsumersBefore || j.ConsumerAdvisories != 0 {
		t.Errorf("join: %+v; want the compact feed, bytes read, no consumer created", j)
	}
	if s := r.Storm; s == nil || s.Routers == 0 || s.FlowingMissing != 0 || s.KeyedMissing != 0 {
		t.Errorf("storm: %+v; want the killed node's routers back, every pool flowing and keyed", s)
	}
	if !strings.Contains(md.String(), "garbage collector in the windows (GOGC 150;") {
		t.Errorf("the Markdown report does not say the routers' process's GOGC")
	}
	if !strings.Contains(md.String(), "| routers |") || !strings.Contains(md.String(), "predicted") {
		t.Errorf("the Markdown report lacks its tables")
	}
}
