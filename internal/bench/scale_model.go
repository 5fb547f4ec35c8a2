package bench

import (
	"fmt"
	"io"
	"math"
)

// The model of the feed's bytes, derived from what the frames are and how
// NATS fans them out, with its constants measured (the frame census and
// the baseline window), then checked against every measured step:
//
//	per pool, payload bytes/s   F(B, c) = k_K x (h_K + b_K x B) + k_L x (h_L + e_L x c x B)
//	per pool, messages/s        M       = k_K + k_L
//	a router following f pools  f x (F + M x o)  on the wire (o: the MSG line and CRLFs)
//	link n -> m                 base(n->m) + F x |pools published on n followed on m|
//	node n out                  base_out(n) + routers(n) x f x F + sum over m of the feed sent to m
//	node n in                   base_in(n) + sum over m of the feed received from m
//
// k_K and k_L are the key and load frames per pool-second (a key frame
// every 5 s without decision changes; four frames a second in all: three
// load beats and the heartbeat's snapshot), h_K and h_L their headers,
// b_K the bytes of a backend in a key frame, e_L of an entry in a load
// frame, c the share of a pool's backends a load frame lists (how fast
// loads move: it follows the traffic), B the backends of a pool. The base
// terms are what the servers carry without routers (outcome events, their
// JetStream capture and its replication, the JSON snapshots and the KV
// puts), measured in the baseline window and scaled by the event rate.
// Payload bytes are what nats-server counts (varz, routez); the wire adds
// o per message. h_L is fitted at the run's B (a load frame's size
// against the entries it lists), so it holds whatever a load frame
// carries per backend listed or not (a report age per backend since the
// feed's c3fac0b): predictions at another B are sound only from a run at
// that B, which is why the benchmark's defaults and the documented runs
// use the predictions' 100 backends.

// ScaleModel is the model's constants, its check against the measured
// steps and its predictions.
type ScaleModel struct {
	KeyPerPoolSec  float64 `json:"k_key"`
	LoadPerPoolSec float64 `json:"k_load"`
	KeyHeader      float64 `json:"h_key"`
	KeyPerBackend  float64 `json:"b_key"`
	LoadHeader     float64 `json:"h_load"`
	LoadPerEntry   float64 `json:"e_load"`
	ChangeRate     float64 `json:"change_rate"`
	WireOverhead   float64 `json:"wire_overhead"`
	// PoolBytesPerSec and PoolMsgsPerSec are F and M at the run's B;
	// ServeBytesPerSec is what serve counted (fleetwatch_feed_frame_bytes_total)
	// per pool-second, over the steps, for comparison.
	PoolBytesPerSec  float64 `json:"pool_bytes_per_sec"`
	PoolMsgsPerSec   float64 `json:"pool_msgs_per_sec"`
	ServeBytesPerSec float64 `json:"serve_pool_bytes_per_sec"`
	// BaseEventsPerSec is the baseline window's event rate, the base
	// terms' unit.
	BaseEventsPerSec float64      `json:"base_events_per_sec"`
	Points           []ModelPoint `json:"points"`
	MaxErrPct        float64      `json:"max_err_pct"`
	Predictions      []Prediction `json:"predictions"`
	base             ScaleStep
}

// ModelPoint is the model at one measured step; errors are (model -
// measured) / measured.
type ModelPoint struct {
	Routers          int         `json:"routers"`
	RouterWire       float64     `json:"router_wire_per_pool_sec"`
	RouterWireErrPct float64     `json:"router_wire_err_pct"`
	RouterPayload    float64     `json:"router_payload_per_pool_sec"`
	RouterPayloadErr float64     `json:"router_payload_err_pct"`
	Nodes            []ModelNode `json:"nodes"`
	Links            []ModelLink `json:"links"`
}

// ModelNode is a node's modelled bytes per second.
type ModelNode struct {
	In, Out             float64
	InErrPct, OutErrPct float64
}

// ModelLink is a link's modelled bytes per second.
type ModelLink struct {
	Bytes, ErrPct float64
}

// Prediction is the model at a fleet not measured.
type Prediction struct {
	Routers, Pools, Backends, Follow, Serves int
	EventsPerSec                             float64
	RouterWirePerSec                         float64   // one router, all it follows
	NodeOut, NodeIn                          []float64 // bytes/s
	LinkMax                                  float64   // the busiest link, bytes/s
	FeedNodeOut                              []float64 // the feed's part of NodeOut
}

// poolBytes is F at b backends per pool.
func (m *ScaleModel) poolBytes(b int) float64 {
	return m.KeyPerPoolSec*(m.KeyHeader+m.KeyPerBackend*float64(b)) +
		m.LoadPerPoolSec*(m.LoadHeader+m.LoadPerEntry*m.ChangeRate*float64(b))
}

// fitScaleModel takes the constants from the frame census and the
// baseline, and checks the model at every step with routers.
func fitScaleModel(r *ScaleReport) ScaleModel {
	f := r.Frames
	m := ScaleModel{KeyPerPoolSec: f.KeyPerPoolSec, LoadPerPoolSec: f.LoadPerPoolSec, KeyHeader: f.KeyHeader,
		KeyPerBackend: f.KeyPerBackend, LoadHeader: f.LoadHeader, LoadPerEntry: f.LoadPerEntry,
		ChangeRate: f.ChangeRate, WireOverhead: f.WireOverhead}
	if len(r.Steps) == 0 {
		return m
	}
	m.base = r.Steps[0]
	m.BaseEventsPerSec = m.base.EventsPerSec
	m.PoolBytesPerSec = m.poolBytes(r.Settings.Backends)
	m.PoolMsgsPerSec = m.KeyPerPoolSec + m.LoadPerPoolSec
	var served float64
	for _, st := range r.Steps {
		for _, sv := range st.Serves {
			served += sv.FrameBytesPerSec
		}
	}
	m.ServeBytesPerSec = served / float64(len(r.Steps)) / float64(r.Settings.Pools)
	for _, st := range r.Steps {
		p := m.point(st)
		if st.Routers > 0 {
			for _, n := range p.Nodes {
				m.MaxErrPct = math.Max(m.MaxErrPct, math.Max(math.Abs(n.InErrPct), math.Abs(n.OutErrPct)))
			}
			for _, l := range p.Links {
				m.MaxErrPct = math.Max(m.MaxErrPct, math.Abs(l.ErrPct))
			}
		}
		m.Points = append(m.Points, p)
	}
	for _, follow := range []int{100, 5} {
		m.Predictions = append(m.Predictions, m.predict(1000, 100, 100, follow, r.Settings.Rate))
	}
	return m
}

// published is the share of the feed's bytes sent into each node: where
// the serves connected (first URL), weighted by what each published.
func published(st ScaleStep, nodes int) []float64 {
	share := make([]float64, nodes)
	var total float64
	for _, sv := range st.Serves {
		share[sv.Node%nodes] += sv.FrameBytesPerSec
		total += sv.FrameBytesPerSec
	}
	for i := range share {
		if total > 0 {
			share[i] /= total
		} else if len(st.Serves) > 0 {
			share[i] = 1 / float64(len(st.Serves))
		}
	}
	return share
}

// point is the model at a step.
func (m *ScaleModel) point(st ScaleStep) ModelPoint {
	p := ModelPoint{Routers: st.Routers, RouterPayload: m.PoolBytesPerSec,
		RouterWire: m.PoolBytesPerSec + m.PoolMsgsPerSec*m.WireOverhead}
	if st.Routers > 0 {
		p.RouterPayloadErr = errPct(p.RouterPayload, st.PayloadPerPoolSec)
		p.RouterWireErrPct = errPct(p.RouterWire, st.WirePerPoolSec)
	}
	scale := 1.0
	if m.BaseEventsPerSec > 0 {
		scale = st.EventsPerSec / m.BaseEventsPerSec
	}
	n := len(st.Nodes)
	share := published(st, n)
	followedOn := make([]float64, n) // pools with a follower on each node
	for i, node := range st.Nodes {
		followedOn[i] = float64(node.PoolsFollowed)
	}
	fwd := func(from, to int) float64 { return share[from] * followedOn[to] * m.PoolBytesPerSec }
	for i, node := range st.Nodes {
		mn := ModelNode{In: m.base.Nodes[i].InBytesPerSec * scale,
			Out: m.base.Nodes[i].OutBytesPerSec*scale + float64(node.Routers*st.Follow)*m.PoolBytesPerSec}
		for j := range st.Nodes {
			if j != i {
				mn.In += fwd(j, i)
				mn.Out += fwd(i, j)
			}
		}
		mn.InErrPct, mn.OutErrPct = errPct(mn.In, node.InBytesPerSec), errPct(mn.Out, node.OutBytesPerSec)
		p.Nodes = append(p.Nodes, mn)
	}
	for k, l := range st.Links {
		from, to := nodeIndex(l.From), nodeIndex(l.To)
		ml := ModelLink{Bytes: fwd(from, to)}
		if k < len(m.base.Links) {
			ml.Bytes += m.base.Links[k].BytesPerSec * scale
		}
		ml.ErrPct = errPct(ml.Bytes, l.BytesPerSec)
		p.Links = append(p.Links, ml)
	}
	return p
}

func nodeIndex(name string) int {
	var i int
	fmt.Sscanf(name, "n%d", &i)
	return i - 1
}

func errPct(model, measured float64) float64 {
	if measured == 0 {
		if model == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return (model - measured) / measured * 100
}

// predict is the model at routers spread evenly over the three nodes,
// pools of backends each, every router following follow pools, the
// serves where the run had them (publishing the same shares), rate
// events per backend-second.
func (m *ScaleModel) predict(routers, pools, backends, follow int, rate float64) Prediction {
	follow = min(follow, pools)
	pr := Prediction{Routers: routers, Pools: pools, Backends: backends, Follow: follow, Serves: len(m.base.Serves),
		EventsPerSec: rate * float64(pools*backends)}
	f := m.poolBytes(backends)
	msgs := m.KeyPerPoolSec + m.LoadPerPoolSec
	pr.RouterWirePerSec = float64(follow) * (f + msgs*m.WireOverhead)
	scale := 0.0
	if m.BaseEventsPerSec > 0 {
		scale = pr.EventsPerSec / m.BaseEventsPerSec
	}
	nodes := len(m.base.Nodes)
	if nodes == 0 {
		return pr
	}
	perNode := make([]int, nodes)
	for i := range routers {
		perNode[i%nodes]++
	}
	share := published(m.base, nodes)
	fwd := func(from, to int) float64 {
		return share[from] * math.Min(float64(pools), float64(perNode[to]*follow)) * f
	}
	for i := range nodes {
		feedOut := float64(perNode[i]*follow) * f
		in := m.base.Nodes[i].InBytesPerSec * scale
		for j := range nodes {
			if j != i {
				feedOut += fwd(i, j)
				in += fwd(j, i)
			}
		}
		pr.FeedNodeOut = append(pr.FeedNodeOut, feedOut)
		pr.NodeOut = append(pr.NodeOut, m.base.Nodes[i].OutBytesPerSec*scale+feedOut)
		pr.NodeIn = append(pr.NodeIn, in)
	}
	for _, l := range m.base.Links {
		pr.LinkMax = math.Max(pr.LinkMax, l.BytesPerSec*scale+fwd(nodeIndex(l.From), nodeIndex(l.To)))
	}
	return pr
}

func mb(b float64) string { return fmt.Sprintf("%.2f", b/1e6) }

func (m *ScaleModel) writeMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "\nmodel: F(B) = %.3f x (%.1f + %.2f B) + %.3f x (%.1f + %.2f x %.2f B) bytes per pool-second; at B of the run %.0f B/pool-s (serve counted %.0f), %.2f msgs/pool-s, %.1f B of protocol each\n",
		m.KeyPerPoolSec, m.KeyHeader, m.KeyPerBackend, m.LoadPerPoolSec, m.LoadHeader, m.LoadPerEntry, m.ChangeRate,
		m.PoolBytesPerSec, m.ServeBytesPerSec, m.PoolMsgsPerSec, m.WireOverhead)
	fmt.Fprintf(w, "model against the measured steps: largest error %.1f%% over every node (in, out) and link\n", m.MaxErrPct)
	for _, p := range m.Points {
		if p.Routers > 0 {
			fmt.Fprintf(w, "  %d routers: router wire %.0f B/pool-s (%+.1f%%), payload %.0f (%+.1f%%)\n",
				p.Routers, p.RouterWire, p.RouterWireErrPct, p.RouterPayload, p.RouterPayloadErr)
		}
	}
	fmt.Fprintln(w, "\n| predicted (modelled, not measured) | events/s | one router MB/s | node out MB/s (feed part) | node in MB/s | busiest link MB/s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, p := range m.Predictions {
		var out, in string
		for i := range p.NodeOut {
			if i > 0 {
				out, in = out+", ", in+", "
			}
			out += fmt.Sprintf("%s (%s)", mb(p.NodeOut[i]), mb(p.FeedNodeOut[i]))
			in += mb(p.NodeIn[i])
		}
		fmt.Fprintf(w, "| %d routers x %d pools of %d, %d followed each, %d serve | %.0f | %s | %s | %s | %s |\n",
			p.Routers, p.Pools, p.Backends, p.Follow, p.Serves, p.EventsPerSec, mb(p.RouterWirePerSec), out, in, mb(p.LinkMax))
	}
	return nil
}
