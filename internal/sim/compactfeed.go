package sim

import (
	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
)

// The feed the routers follow (docs/PROTOCOL.md "Compact feed
// (extension)"): by default the compact feed, as `fleetwatch route` does:
// the serve side's feed.CompactEncoder turns each decision snapshot into a
// key or load frame and each load beat (analyzer.Evaluation.Loads) into a
// load frame, and each fleetwatch router decodes the frames and applies
// them (key frames as snapshots, load frames through
// p2c.Picker.UpdateLoads), quantization and thresholds included. With
// Scenario.JSONFeed the routers follow the JSON snapshots alone (route.feed:
// json, and every third-party router): one every heartbeat and decision
// change, no load beats.

// frameFollower is a router that follows the compact feed's frames.
type frameFollower interface {
	frame(kind byte, data []byte)
}

// deliver hands one snapshot of the analyzer (a load beat's with beat) to
// every router over the feed of the run.
func (s *sim) deliver(snap *fleetwatch.Snapshot, beat bool) {
	if s.sc.JSONFeed {
		if !beat {
			for _, rt := range s.routers {
				rt.update(snap)
			}
		}
		return
	}
	var kind byte = feed.FrameLoads
	if beat {
		var ok bool
		if s.frame, ok = s.compact.Loads(s.frame[:0], snap); !ok {
			return
		}
	} else {
		s.frame, kind, _ = s.compact.Frame(s.frame[:0], snap, s.wall())
	}
	if kind == feed.FrameKey {
		s.stallP95 = poolP95(snap) // a router's deadline reads the key frames' p95
	}
	s.feedBytes += int64(len(s.frame))
	s.feedFrames++

	for _, rt := range s.routers {
		if f, ok := rt.(frameFollower); ok {
			f.frame(kind, s.frame)
		} else if !beat {
			rt.update(snap) // the fleet-load experiments follow the decision snapshots (their EVALUATION.md figures)
		}
	}
}

// compactState is a fleetwatch router's side of the compact feed: the
// snapshot applied, the backends of the last key frame (its load frames
// name them by position) and the buffers of the load frames, reused.
type compactState struct {
	applied *fleetwatch.Snapshot
	ids     []string
	loads   feed.Loads
	upd     p2c.LoadUpdate
}

// frame applies a compact frame to the router's picker, as feed.Watcher
// does: a key frame that repeats the decisions applied as their loads.
func (p *fleetwatchRouter) frame(kind byte, data []byte) {
	c := &p.compact
	if kind == feed.FrameKey {
		snap, _, err := feed.DecodeKey(data, poolID)
		if err != nil {
			panic("sim: " + err.Error()) // the encoder's own frame
		}
		c.ids = c.ids[:0]
		for i := range snap.Backends {
			c.ids = append(c.ids, snap.Backends[i].Backend)
		}
		if c.applied != nil && feed.RepeatsDecisions(c.applied, snap) {
			feed.KeyLoads(&c.upd, c.applied, snap)
			p.picker.UpdateLoads(&c.upd)
			return
		}
		c.applied = snap
		p.picker.Update(snap)
		return
	}
	if err := feed.DecodeLoads(data, &c.loads); err != nil {
		panic("sim: " + err.Error())
	}
	u := &c.upd
	c.loads.Update(u, c.applied.Epoch, c.applied.Seq, c.ids)
	p.picker.UpdateLoads(u)
}
