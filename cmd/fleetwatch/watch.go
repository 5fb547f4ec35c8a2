package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed"
)

func init() {
	register("watch", "a live terminal view of a pool's decisions (fleetwatch watch [pool])", runWatch)
}

// runWatch is `fleetwatch watch [pool]`: it follows the decision snapshots
// of one pool (or of every pool) and shows them as a table, redrawn in place
// when stdout is a terminal and appended otherwise; --json prints each
// snapshot as one JSON line instead.
func runWatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	asJSON := fs.Bool("json", false, "print every snapshot as one JSON line (NDJSON) instead of a table")
	refresh := fs.Duration("refresh", time.Second, "shortest time between two tables (ignored with --json)")
	once := fs.Bool("once", false, "print the current state once (after the first snapshot of every pool named, or of any pool) and exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetwatch watch [flags] [pool]")
		fs.PrintDefaults()
	}
	// Accept the pool before or after the flags.
	var pool string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pool, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 1 || (pool != "" && fs.NArg() > 0) {
		fs.Usage()
		return errUsage
	}
	if fs.NArg() == 1 {
		pool = fs.Arg(0)
	}
	if pool != "" {
		if err := fleetwatch.ValidatePoolID(pool); err != nil {
			return err
		}
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "watch: "+format+"\n", args...) }
	nc, err := nf.connectURL("fleetwatch-watch", cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer nc.Close()

	v := &watchView{out: stdout, terminal: isTerminal(stdout), now: time.Now}
	updates := make(chan struct{}, 1)
	var pools []string
	if pool != "" {
		pools = []string{pool}
	}
	w, err := feed.NewWatcher(nc, feed.WatcherSettings{
		Prefix: cfg.Prefix,
		Pools:  pools,
		OnUpdate: func(s *fleetwatch.Snapshot) {
			v.add(s)
			select {
			case updates <- struct{}{}:
			default:
			}
		},
		Logf: logf,
	})
	if err != nil {
		return err
	}
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	if pool != "" {
		logf("waiting for decisions on %s", subj.Decisions(pool))
	} else {
		logf("waiting for decisions on %s", subj.DecisionsWildcard())
	}
	watchDone := make(chan error, 1)
	go func() { watchDone <- w.Run(ctx) }() // exits on ctx or Close
	defer func() {
		w.Close()
		<-watchDone
	}()

	var last time.Time
	var timer <-chan time.Time // set while a redraw waits for --refresh
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watchDone:
			watchDone <- err
			return err
		case <-updates:
			if *asJSON {
				if err := v.writeJSON(); err != nil {
					return err
				}
				if *once {
					return nil
				}
				continue
			}
			if wait := *refresh - time.Since(last); wait > 0 && !*once {
				if timer == nil {
					timer = time.After(wait)
				}
				continue
			}
		case <-timer:
		}
		timer = nil
		last = time.Now()
		if err := v.draw(); err != nil {
			return err
		}
		if *once {
			return nil
		}
	}
}

// isTerminal reports whether w is a character device (a terminal), in which
// case the table is redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// watchView holds the newest snapshot of each pool and renders them.
type watchView struct {
	out      io.Writer
	terminal bool
	now      func() time.Time

	// mu guards snaps and pending; the watcher's goroutine adds, the
	// command's goroutine renders.
	mu      sync.Mutex
	snaps   map[string]*fleetwatch.Snapshot
	pending []*fleetwatch.Snapshot // for --json: every snapshot, in order
}

func (v *watchView) add(s *fleetwatch.Snapshot) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.snaps == nil {
		v.snaps = map[string]*fleetwatch.Snapshot{}
	}
	v.snaps[s.Pool] = s
	if len(v.pending) < 4096 { // a reader that cannot keep up loses lines, not memory
		v.pending = append(v.pending, s)
	}
}

// writeJSON prints the snapshots received since the last call, one per line.
func (v *watchView) writeJSON() error {
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

// draw prints every pool's table: in place on a terminal (cursor home,
// clear screen), appended otherwise.
func (v *watchView) draw() error {
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
		renderSnapshot(&buf, s, now)
		buf.WriteByte('\n')
	}
	_, err := v.out.Write(buf.Bytes())
	return err
}

// renderSnapshot writes one pool's decisions as a table.
func renderSnapshot(w io.Writer, s *fleetwatch.Snapshot, now time.Time) {
	age := now.Sub(s.At.Time).Round(time.Millisecond)
	stale := ""
	if feed.Stale(s, now) {
		stale = "  STALE (routers fall back to local signals)"
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
