package bench

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestScaleModelFanOut checks the model's arithmetic on a made-up run: a
// pool's bytes from the frames' constants, a router's share, and the
// fan-out of one serve's feed to the routers of every node.
func TestScaleModelFanOut(t *testing.T) {
	const pools, backends = 2, 10
	base := ScaleStep{EventsPerSec: 100, Serves: []ServeStep{{Node: 1, FrameBytesPerSec: 460}}}
	for i := range 3 {
		base.Nodes = append(base.Nodes, NodeStep{Name: "n" + string(rune('1'+i)), InBytesPerSec: 1000, OutBytesPerSec: 2000})
		for j := range 3 {
			if j != i {
				base.Links = append(base.Links, LinkStep{From: "n" + string(rune('1'+i)), To: "n" + string(rune('1'+j)), BytesPerSec: 100})
			}
		}
	}
	// F = 0.2 x (50 + 15 x 10) + 3.8 x (20 + 6 x 0.5 x 10) = 40 + 190.
	const f = 230.0
	step := base
	step.Routers, step.Follow = 3, pools
	step.Nodes = append([]NodeStep(nil), base.Nodes...)
	step.Links = append([]LinkStep(nil), base.Links...)
	for i := range step.Nodes {
		step.Nodes[i].Routers, step.Nodes[i].PoolsFollowed = 1, pools
		step.Nodes[i].OutBytesPerSec += pools * f // its router
		if i == 1 {
			step.Nodes[i].OutBytesPerSec += 2 * pools * f // the feed to the two other nodes
		} else {
			step.Nodes[i].InBytesPerSec += pools * f
		}
	}
	for k, l := range step.Links {
		if l.From == "n2" {
			step.Links[k].BytesPerSec += pools * f
		}
	}
	step.PayloadPerPoolSec, step.WirePerPoolSec = f, f+4*30
	r := &ScaleReport{Settings: ScaleSettings{Pools: pools, Backends: backends, Rate: 5},
		Frames: FrameCensus{KeyPerPoolSec: 0.2, LoadPerPoolSec: 3.8, KeyHeader: 50, KeyPerBackend: 15,
			LoadHeader: 20, LoadPerEntry: 6, ChangeRate: 0.5, WireOverhead: 30},
		Steps: []ScaleStep{base, step}}
	m := fitScaleModel(r)
	if math.Abs(m.PoolBytesPerSec-f) > 1e-9 {
		t.Fatalf("F = %v, want %v", m.PoolBytesPerSec, f)
	}
	if m.MaxErrPct > 1e-9 {
		t.Errorf("largest error %v%%, want 0 on a run that is the model", m.MaxErrPct)
	}
	p := m.Points[1]
	if math.Abs(p.RouterWireErrPct) > 1e-9 || math.Abs(p.RouterPayloadErr) > 1e-9 {
		t.Errorf("router errors %v%% (wire), %v%% (payload), want 0", p.RouterWireErrPct, p.RouterPayloadErr)
	}
	// 1,000 routers following every pool of 100 backends each: every node
	// carries its routers' share, and the serve's node the fan-out too.
	pr := m.predict(1000, 100, 100, 100, 5)
	fb := m.poolBytes(100)
	if want := 334 * 100 * fb; math.Abs(pr.FeedNodeOut[0]-want) > 1e-6 {
		t.Errorf("feed out of n1 %v, want %v", pr.FeedNodeOut[0], want)
	}
	if want := 333*100*fb + 2*100*fb; math.Abs(pr.FeedNodeOut[1]-want) > 1e-6 {
		t.Errorf("feed out of n2 (the serve's) %v, want %v", pr.FeedNodeOut[1], want)
	}
	if pr.EventsPerSec != 50000 {
		t.Errorf("events %v, want 50000", pr.EventsPerSec)
	}
}

// TestServeCounters reads serve's counters from a /metrics page served
// over a real socket: the feed's frames and bytes, the snapshots, and the
// events refused (summed over every reason) and dropped.
func TestServeCounters(t *testing.T) {
	page := `# HELP ignored
fleetwatch_feed_frames_published_total{kind="key"} 12
fleetwatch_feed_frames_published_total{kind="loads"} 340
fleetwatch_feed_frame_bytes_total 98765
fleetwatch_decisions_published_total 77
fleetwatch_ingest_rejects_total{reason="bad_json"} 2
fleetwatch_ingest_rejects_total{reason="too_many_backends"} 5
fleetwatch_ingest_dropped_total 3
fleetwatch_feed_frame_bytes_bucket{le="100"} 9
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, page) }))
	defer srv.Close()
	sp := &serveProc{http: strings.TrimPrefix(srv.URL, "http://")}
	got, err := sp.counters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := serveCounters{KeyFrames: 12, LoadFrames: 340, FrameBytes: 98765, Published: 77, Refused: 7, Dropped: 3}
	if got != want {
		t.Errorf("counters: %+v, want %+v", got, want)
	}
}
