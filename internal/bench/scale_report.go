package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ScaleReport is what RunScale measured and the model fitted to it.
type ScaleReport struct {
	Settings     ScaleSettings `json:"-"`
	Machine      string        `json:"machine"`
	Date         string        `json:"date"`
	LoadAvgStart float64       `json:"load_avg_start"`
	LoadAvgEnd   float64       `json:"load_avg_end"`
	// EventsPerSec is the outcome events published per second, over the
	// whole run; RateNote says what rate per backend was chosen and why.
	EventsPerSec float64 `json:"events_per_sec"`
	RateNote     string  `json:"rate_note"`
	// Steps are the baseline window (no routers) first, then one per
	// router count.
	Steps []ScaleStep `json:"steps"`
	// Skipped are the router counts not run because a smaller one did
	// not sync.
	Skipped []int        `json:"skipped,omitempty"`
	Frames  FrameCensus  `json:"frames"`
	Join    *JoinResult  `json:"join,omitempty"`
	Storm   *StormResult `json:"storm,omitempty"`
	Model   ScaleModel   `json:"model"`
	started time.Time
}

// ScaleStep is one window.
type ScaleStep struct {
	Routers      int     `json:"routers"` // 0: the baseline
	Follow       int     `json:"follow"`  // pools per router
	Seconds      float64 `json:"seconds"`
	LoadAvg      float64 `json:"load_avg"`
	EventsPerSec float64 `json:"events_per_sec"`
	// SyncMs is how long the step's routers took, started together, until
	// every one held a snapshot of every pool it follows.
	SyncMs float64 `json:"sync_ms"`
	// SyncBytesMean is the mean of what each of them read from its socket
	// until then: a join storm's cost per router.
	SyncBytesMean float64 `json:"sync_bytes_mean"`
	// Unsynced is how many of them never did (the step was measured with
	// them; larger counts were skipped).
	Unsynced int `json:"unsynced,omitempty"`
	// Per router and per pool-second followed: bytes read from the
	// router's socket (the wire, NATS protocol included), the payload
	// bytes and the messages nats.go counted.
	WirePerPoolSec    float64 `json:"wire_bytes_per_pool_sec"`
	PayloadPerPoolSec float64 `json:"payload_bytes_per_pool_sec"`
	MsgsPerPoolSec    float64 `json:"msgs_per_pool_sec"`
	// The age of a load frame when a router applied it: the frame's at
	// to the moment OnLoads ran, over every router's applies.
	AgeP50Ms   float64 `json:"age_p50_ms"`
	AgeP99Ms   float64 `json:"age_p99_ms"`
	AgeMaxMs   float64 `json:"age_max_ms"`
	AgeSamples int64   `json:"age_samples"`
	// SlowConsumers is the nodes' count (varz) in the window; Dropped,
	// Gaps, Malformed and KeyFetches the watchers' counters.
	SlowConsumers int64  `json:"slow_consumers"`
	Dropped       uint64 `json:"dropped"`
	Gaps          uint64 `json:"gaps"`
	Malformed     uint64 `json:"malformed"`
	KeyFetches    uint64 `json:"key_fetches"`
	// ProcessCPU is this process's CPU in cores (routers, traffic and
	// measuring); RouterCPUMsPerPoolSec what it used beyond the baseline
	// window's, per router and pool-second followed.
	ProcessCPU            float64 `json:"process_cpu_cores"`
	RouterCPUMsPerPoolSec float64 `json:"router_cpu_ms_per_pool_sec"`
	// GCCycles and GCCPU (cores) are this process's garbage collector in
	// the window, HeapMiB its heap objects at the window's end (garbage
	// not yet collected included): every router shares the one heap,
	// whose marking slows every router at once, where a router process of
	// its own would collect a heap of its own.
	GCCycles uint64      `json:"gc_cycles"`
	GCCPU    float64     `json:"gc_cpu_cores"`
	HeapMiB  float64     `json:"heap_mib"`
	Nodes    []NodeStep  `json:"nodes"`
	Links    []LinkStep  `json:"links"`
	Serves   []ServeStep `json:"serves"`
}

// NodeStep is one nats-server node in a window (varz, /proc).
type NodeStep struct {
	Name           string  `json:"name"`
	Up             bool    `json:"up"`
	Routers        int     `json:"routers"`
	PoolsFollowed  int     `json:"pools_followed"` // distinct pools its routers follow
	InBytesPerSec  float64 `json:"in_bytes_per_sec"`
	OutBytesPerSec float64 `json:"out_bytes_per_sec"`
	InMsgsPerSec   float64 `json:"in_msgs_per_sec"`
	OutMsgsPerSec  float64 `json:"out_msgs_per_sec"`
	SlowConsumers  int64   `json:"slow_consumers"`
	CPU            float64 `json:"cpu_cores"`
	RSSMiB         float64 `json:"rss_mib"`
}

// LinkStep is the route traffic from one node to another (routez: every
// route connection between the two, payload bytes).
type LinkStep struct {
	From        string  `json:"from"`
	To          string  `json:"to"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	MsgsPerSec  float64 `json:"msgs_per_sec"`
}

// ServeStep is one serve process in a window (/metrics, /proc).
type ServeStep struct {
	Name             string  `json:"name"`
	Node             int     `json:"node"` // the node it is connected to (index)
	CPU              float64 `json:"cpu_cores"`
	RSSMiB           float64 `json:"rss_mib"`
	KeyFramesPerSec  float64 `json:"key_frames_per_sec"`
	LoadFramesPerSec float64 `json:"load_frames_per_sec"`
	FrameBytesPerSec float64 `json:"frame_bytes_per_sec"`
	SnapshotsPerSec  float64 `json:"snapshots_per_sec"`
	// EventsRefused and EventsDropped are the outcome events its collector
	// rejected (any reason, the analyzer's limits among them) and lost to
	// a slow subscription in the window.
	EventsRefused float64 `json:"events_refused"`
	EventsDropped float64 `json:"events_dropped"`
}

// FrameCensus is the compact feed's frames as a subscriber of every pool
// saw them for a while (on the first serve's node, outside the windows).
type FrameCensus struct {
	Seconds   float64 `json:"seconds"`
	KeyFrames int     `json:"key_frames"`
	// KeyRepeats are the key frames that repeated the decisions of the
	// pool's last key frame but one that did not (feed.RepeatsDecisions):
	// a router applies them as loads.
	KeyRepeats     int     `json:"key_repeats"`
	LoadFrames     int     `json:"load_frames"`
	KeyPerPoolSec  float64 `json:"key_per_pool_sec"`
	LoadPerPoolSec float64 `json:"load_per_pool_sec"`
	KeyBytesMean   float64 `json:"key_bytes_mean"`
	KeyHeader      float64 `json:"key_header_bytes"`
	KeyPerBackend  float64 `json:"key_bytes_per_backend"`
	LoadBytesMean  float64 `json:"load_bytes_mean"`
	LoadHeader     float64 `json:"load_header_bytes"`
	LoadPerEntry   float64 `json:"load_bytes_per_entry"`
	EntriesMean    float64 `json:"load_entries_mean"`
	// ChangeRate is the share of a pool's backends a load frame lists.
	ChangeRate float64 `json:"change_rate"`
	// WireOverhead is the NATS protocol's bytes per delivered message
	// (the MSG line and the CRLFs).
	WireOverhead float64 `json:"wire_overhead_bytes"`
}

// JoinResult is a fresh router joining every pool.
type JoinResult struct {
	Pools              int     `json:"pools"`
	Bytes              int64   `json:"bytes"`
	Millis             float64 `json:"ms"`
	Compact            bool    `json:"compact"`
	ConsumersBefore    int     `json:"consumers_before"`
	ConsumersAfter     int     `json:"consumers_after"`
	ConsumerAdvisories int64   `json:"consumer_created_advisories"`
}

// StormResult is the routers of a killed node coming back.
type StormResult struct {
	Node           string  `json:"node"`
	Routers        int     `json:"routers"`
	ReconnectP50Ms float64 `json:"reconnect_p50_ms"`
	ReconnectMaxMs float64 `json:"reconnect_max_ms"`
	FlowingP50Ms   float64 `json:"flowing_p50_ms"`
	FlowingMaxMs   float64 `json:"flowing_max_ms"`
	FlowingMissing int     `json:"flowing_missing"`
	KeyedP50Ms     float64 `json:"keyed_p50_ms"`
	KeyedMaxMs     float64 `json:"keyed_max_ms"`
	KeyedMissing   int     `json:"keyed_missing"`
}

func newScaleReport(s ScaleSettings) *ScaleReport {
	return &ScaleReport{Settings: s, Machine: machine(), Date: time.Now().UTC().Format(time.RFC3339),
		LoadAvgStart: loadAvg(), started: time.Now(),
		RateNote: fmt.Sprintf("%.3g events/s per backend: the Azure 2023 conversation trace (5.53 requests/s) spread over "+
			"4 backends of 8 slots at its x3.6 replay speed (about 75%% busy) gives about 5 requests/s per backend", s.Rate)}
}

// WriteJSON writes the report as one JSON object.
func (r *ScaleReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func kb(b float64) string { return fmt.Sprintf("%.1f", b/1000) }

// WriteMarkdown writes the report as Markdown tables.
func (r *ScaleReport) WriteMarkdown(w io.Writer) error {
	s := r.Settings
	fmt.Fprintf(w, "fleetwatch bench scale: %d pools x %d backends, %d serve(s), routers follow %d pools each, %v windows, %.0f events/s\n",
		s.Pools, s.Backends, s.Serves, s.Follow, s.Duration, r.EventsPerSec)
	fmt.Fprintf(w, "machine %s; %s; load average %.2f at the start, %.2f at the end\n\n", r.Machine, r.Date, r.LoadAvgStart, r.LoadAvgEnd)
	fmt.Fprintln(w, "| routers | per router: wire B/pool-s | payload B/pool-s | msgs/pool-s | load age at apply p50 / p99 / max ms | slow consumers | dropped / gaps / malformed / key fetches | router CPU ms/pool-s | serve CPU (cores) / RSS MiB | all synced s (mean B read by then) | load avg |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, st := range r.Steps {
		if st.Unsynced > 0 {
			fmt.Fprintf(w, "| %d (%d never synced) | | | | | | | | | | |\n", st.Routers, st.Unsynced)
		}
		var sc, sr []string
		for _, sv := range st.Serves {
			sc = append(sc, fmt.Sprintf("%.3f", sv.CPU))
			sr = append(sr, fmt.Sprintf("%.0f", sv.RSSMiB))
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %.2f | %.0f / %.0f / %.0f | %d | %d / %d / %d / %d | %.3f | %s / %s | %.1f (%.0f) | %.2f |\n",
			st.Routers, st.WirePerPoolSec, st.PayloadPerPoolSec, st.MsgsPerPoolSec, st.AgeP50Ms, st.AgeP99Ms, st.AgeMaxMs,
			st.SlowConsumers, st.Dropped, st.Gaps, st.Malformed, st.KeyFetches, st.RouterCPUMsPerPoolSec,
			strings.Join(sc, ","), strings.Join(sr, ","), st.SyncMs/1000, st.SyncBytesMean, st.LoadAvg)
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "\nrouter counts %v skipped: the last step's routers did not all sync\n", r.Skipped)
	}
	var refused, dropped float64
	for _, st := range r.Steps {
		for _, sv := range st.Serves {
			refused, dropped = refused+sv.EventsRefused, dropped+sv.EventsDropped
		}
	}
	fmt.Fprintf(w, "\nserve's collectors over the windows: %.0f events refused (every reason, the analyzer's limits among them), %.0f dropped (slow subscription)\n", refused, dropped)
	gogc := "GOGC 100, the Go default"
	if r.Settings.GOGC != 0 {
		gogc = fmt.Sprintf("GOGC %d", r.Settings.GOGC)
	} else if env := os.Getenv("GOGC"); env != "" {
		gogc = "GOGC " + env + " from the environment"
	}
	fmt.Fprintf(w, "\nthe routers' process's garbage collector in the windows (%s; one heap for every router):", gogc)
	for _, st := range r.Steps {
		fmt.Fprintf(w, " %d routers: %d cycles, %.3f cores, a heap of %.0f MiB;", st.Routers, st.GCCycles, st.GCCPU, st.HeapMiB)
	}
	fmt.Fprintln(w)
	r.writeNodes(w)
	r.writeFramesJoinStorm(w)
	return r.Model.writeMarkdown(w)
}

// writeNodes writes each step's servers and links with the model's
// figures beside them.
func (r *ScaleReport) writeNodes(w io.Writer) {
	fmt.Fprintln(w, "\n| routers | node (routers on it) | in kB/s (model, err) | out kB/s (model, err) | in / out msgs/s | CPU cores | RSS MiB |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for i, st := range r.Steps {
		for j, n := range st.Nodes {
			var pin, pout string
			if i < len(r.Model.Points) && j < len(r.Model.Points[i].Nodes) {
				p := r.Model.Points[i].Nodes[j]
				pin, pout = fmt.Sprintf(" (%s, %+.1f%%)", kb(p.In), p.InErrPct), fmt.Sprintf(" (%s, %+.1f%%)", kb(p.Out), p.OutErrPct)
			}
			fmt.Fprintf(w, "| %d | %s (%d) | %s%s | %s%s | %.0f / %.0f | %.2f | %.0f |\n", st.Routers, n.Name, n.Routers,
				kb(n.InBytesPerSec), pin, kb(n.OutBytesPerSec), pout, n.InMsgsPerSec, n.OutMsgsPerSec, n.CPU, n.RSSMiB)
		}
	}
	fmt.Fprintln(w, "\n| routers | link | kB/s (model, err) | msgs/s |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for i, st := range r.Steps {
		for j, l := range st.Links {
			var pm string
			if i < len(r.Model.Points) && j < len(r.Model.Points[i].Links) {
				p := r.Model.Points[i].Links[j]
				pm = fmt.Sprintf(" (%s, %+.1f%%)", kb(p.Bytes), p.ErrPct)
			}
			fmt.Fprintf(w, "| %d | %s->%s | %s%s | %.0f |\n", st.Routers, l.From, l.To, kb(l.BytesPerSec), pm, l.MsgsPerSec)
		}
	}
}

func (r *ScaleReport) writeFramesJoinStorm(w io.Writer) {
	f := r.Frames
	fmt.Fprintf(w, "\nframes (%.0f s census): key %.3f/pool-s of %.0f B (header %.0f + %.2f B/backend; %d of %d repeating the decisions applied); load %.3f/pool-s of %.0f B (header %.1f + %.2f B/entry x %.1f entries, change rate %.2f); %.1f B of protocol per message\n",
		f.Seconds, f.KeyPerPoolSec, f.KeyBytesMean, f.KeyHeader, f.KeyPerBackend, f.KeyRepeats, f.KeyFrames, f.LoadPerPoolSec, f.LoadBytesMean,
		f.LoadHeader, f.LoadPerEntry, f.EntriesMean, f.ChangeRate, f.WireOverhead)
	if j := r.Join; j != nil {
		fmt.Fprintf(w, "join: a fresh router following %d pools read %d B (%.0f B per pool) in %.0f ms until it held every pool (compact %v); JetStream consumers %d before, %d after, %d consumer-created advisories meanwhile\n",
			j.Pools, j.Bytes, float64(j.Bytes)/float64(max(j.Pools, 1)), j.Millis, j.Compact, j.ConsumersBefore, j.ConsumersAfter, j.ConsumerAdvisories)
	}
	if s := r.Storm; s != nil {
		fmt.Fprintf(w, "reconnect storm: %s killed with %d routers on it: reconnected p50 %.0f / max %.0f ms; a frame of every pool applied p50 %.0f / max %.0f ms (%d never); a key frame of every pool (in sync) p50 %.0f / max %.0f ms (%d never)\n",
			s.Node, s.Routers, s.ReconnectP50Ms, s.ReconnectMaxMs, s.FlowingP50Ms, s.FlowingMaxMs, s.FlowingMissing, s.KeyedP50Ms, s.KeyedMaxMs, s.KeyedMissing)
	}
}
