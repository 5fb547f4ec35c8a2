package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/watch"
)

func init() {
	register("watch", "a live terminal view of a pool's decisions (fleetwatch watch [pool])", runWatch)
}

// runWatch is `fleetwatch watch [pool]`: it follows the decision snapshots
// of one pool (or of every pool) and shows them as a table, redrawn in place
// when stdout is a terminal and appended otherwise; --json prints each
// snapshot as one JSON line instead (internal/watch).
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
	return watch.Run(ctx, nc, watch.Settings{
		Out: stdout, Terminal: watch.IsTerminal(stdout), Prefix: cfg.Prefix, Pool: pool,
		JSON: *asJSON, Refresh: *refresh, Once: *once, Logf: logf,
	})
}
