// Package watch is the live terminal view of `fleetwatch watch`: it follows
// the decision snapshots of one pool (or of every pool) through a
// feed.Watcher and shows them as tables, redrawn in place on a terminal and
// appended otherwise, or as one JSON line per snapshot.
package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
)

// Settings configure Run.
type Settings struct {
	// Out receives the tables or JSON lines. If nil, os.Stdout is used.
	Out io.Writer
	// Terminal redraws the tables in place (cursor home, clear screen);
	// see IsTerminal.
	Terminal bool
	// Prefix is the subject prefix. If empty, "fw" is used.
	Prefix string
	// Pool is the pool followed. If empty, every pool is.
	Pool string
	// JSON prints every snapshot as one JSON line (NDJSON) instead of
	// tables.
	JSON bool
	// Refresh is the shortest time between two tables (ignored with JSON).
	// If zero, every update is drawn at once.
	Refresh time.Duration
	// Once prints the current state once, after the first snapshot, and
	// returns.
	Once bool
	// Now is the clock of the tables' ages and countdowns. If nil,
	// time.Now is used.
	Now func() time.Time
	// Logf receives the watcher's log lines. If nil, they are dropped.
	Logf func(format string, args ...any)
}

// Run follows the decisions on nc and writes them to s.Out until ctx ends
// (it then returns nil), the watcher fails, or, with s.Once, the first
// output is written.
func Run(ctx context.Context, nc *nats.Conn, s Settings) error {
	if s.Out == nil {
		s.Out = os.Stdout
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	v := NewView(s.Out, s.Terminal, s.Now)
	updates := make(chan struct{}, 1)
	var pools []string
	if s.Pool != "" {
		pools = []string{s.Pool}
	}
	w, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix: s.Prefix,
		Pools:  pools,
		OnUpdate: func(snap *fleetwatch.Snapshot) {
			v.Add(snap)
			select {
			case updates <- struct{}{}:
			default:
			}
		},
		Logf: s.Logf,
	})
	if err != nil {
		return err
	}
	subj := fleetwatch.Subjects{Prefix: s.Prefix}
	if s.Pool != "" {
		s.Logf("waiting for decisions on %s", subj.Decisions(s.Pool))
	} else {
		s.Logf("waiting for decisions on %s", subj.DecisionsWildcard())
	}
	watchDone := make(chan error, 1)
	go func() { watchDone <- w.Run(ctx) }() // exits on ctx or Close
	defer func() {
		w.Close()
		<-watchDone
	}()

	var last time.Time
	var timer <-chan time.Time // set while a redraw waits for Refresh
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watchDone:
			watchDone <- err
			return err
		case <-updates:
			if s.JSON {
				if err := v.WriteJSON(); err != nil {
					return err
				}
				if s.Once {
					return nil
				}
				continue
			}
			if wait := s.Refresh - time.Since(last); wait > 0 && !s.Once {
				if timer == nil {
					timer = time.After(wait)
				}
				continue
			}
		case <-timer:
		}
		timer = nil
		last = time.Now()
		if err := v.Draw(); err != nil {
			return err
		}
		if s.Once {
			return nil
		}
	}
}

// IsTerminal reports whether w is a character device (a terminal), in which
// case the table is redrawn in place.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// View holds the newest snapshot of each pool and renders them.
type View struct {
	out      io.Writer
	terminal bool
	now      func() time.Time

	// mu guards snaps and pending; the watcher's goroutine adds, the
	// caller's goroutine renders.
	mu      sync.Mutex
	snaps   map[string]*fleetwatch.Snapshot
	pending []*fleetwatch.Snapshot // for WriteJSON: every snapshot, in order
}

// NewView returns a View writing to out; on a terminal, Draw redraws in
// place. now is the clock of the ages and countdowns.
func NewView(out io.Writer, terminal bool, now func() time.Time) *View {
	return &View{out: out, terminal: terminal, now: now, snaps: map[string]*fleetwatch.Snapshot{}}
}

// Add records s as its pool's newest snapshot.
func (v *View) Add(s *fleetwatch.Snapshot) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.snaps[s.Pool] = s
	if len(v.pending) < 4096 { // a reader that cannot keep up loses lines, not memory
		v.pending = append(v.pending, s)
	}
}

// WriteJSON prints the snapshots added since the last call, one per line.
func (v *View) WriteJSON() error {
	v.mu.Lock()
	pending := v.pending
	v.pending = nil
	v.mu.Unlock()
	for _, s := range pending {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		if _, err := v.out.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	return nil
}

// Draw prints every pool's table: in place on a terminal (cursor home,
// clear screen), appended otherwise.
func (v *View) Draw() error {
	v.mu.Lock()
	snaps := make([]*fleetwatch.Snapshot, 0, len(v.snaps))
	for _, id := range slices.Sorted(maps.Keys(v.snaps)) {
		snaps = append(snaps, v.snaps[id])
	}
	v.pending = nil
	v.mu.Unlock()
	var buf bytes.Buffer
	if v.terminal {
		buf.WriteString("\x1b[H\x1b[2J")
	}
	now := v.now()
	for _, s := range snaps {
		RenderSnapshot(&buf, s, now)
		buf.WriteByte('\n')
	}
	_, err := v.out.Write(buf.Bytes())
	return err
}

// RenderSnapshot writes one pool's decisions as a table.
func RenderSnapshot(w io.Writer, s *fleetwatch.Snapshot, now time.Time) {
	age := now.Sub(s.At.Time).Round(time.Millisecond)
	stale := ""
	if feed.Stale(s, now) {
		stale = "  STALE (routers fall back to local signals)"
	}
	switch s.Shadow {
	case fleetwatch.ShadowBreakers:
		stale += "  SHADOW breakers (advisory: routers follow the breakers only, not the weights)"
	case fleetwatch.ShadowObserve:
		stale += "  SHADOW observe (advisory: routers follow none of it but operator overrides)"
	}
	median := "-"
	if s.MedianEWMATTFTMs != nil {
		median = fmtMs(s.MedianEWMATTFTMs)
	}
	fmt.Fprintf(w, "pool %s  mode %s  all_open %s  median ewma %s  seq %d  epoch %s  age %v%s\n",
		s.Pool, s.Mode, s.AllOpen, median, s.Seq, s.Epoch, age, stale)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tSTATE\tWEIGHT\tEWMA TTFT\tP95 TTFT\tSUCCESS\t429 RATE\tREQS\tDRIFT\tREASON")
	for _, b := range s.Backends {
		state := string(b.State)
		if b.State == fleetwatch.StateOpen && b.OpenUntil != nil {
			state += " (" + b.OpenUntil.Sub(now).Round(time.Second).String() + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n",
			b.Backend, state, b.Weight, fmtMs(b.EWMATTFTMs), fmtMs(b.P95TTFTMs),
			fmtRate(b.SuccessRate), fmtRate(b.Rate429), b.Requests, b.Drift, b.Reason)
	}
	tw.Flush()
}

func fmtMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 0, 64) + "ms"
}

func fmtRate(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v*100, 'f', 1, 64) + "%"
}
