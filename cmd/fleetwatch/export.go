package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/collector"
)

func init() {
	register("export", "write a time range of the accepted outcome events (FW_OUTCOMES) as NDJSON, e.g. for fleetwatch sim --trace", runExport)
}

// runExport is `fleetwatch export`: the events a deployment accepted and
// stored in FW_OUTCOMES between --since and --until, one JSON object per
// line as on fw.outcomes (the format `fleetwatch sim --trace` reads as
// outcomes-ndjson). It reads the stream through an ordered consumer and
// creates nothing.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	since := fs.String("since", "1h", "start of the range: a duration before now (1h, 30m) or an RFC 3339 time")
	until := fs.String("until", "", "end of the range: a duration before now or an RFC 3339 time (default now)")
	pool := fs.String("pool", "", "only this pool's events")
	out := fs.String("out", "", "file to write (default stdout)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetwatch export [flags]   (NDJSON of the accepted outcome events in FW_OUTCOMES)")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	now := time.Now()
	from, err := parseExportTime(*since, now)
	if err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	to := now
	if *until != "" {
		if to, err = parseExportTime(*until, now); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	if !to.After(from) {
		return fmt.Errorf("--until (%s) must be after --since (%s)", fleetwatch.FormatTime(to), fleetwatch.FormatTime(from))
	}
	if *pool != "" {
		if err := fleetwatch.ValidatePoolID(*pool); err != nil {
			return fmt.Errorf("--pool: %w", err)
		}
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "export: "+format+"\n", args...) }
	nc, err := nf.connectURL("fleetwatch-export", cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriter(w)
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	var line []byte
	written, skipped := 0, 0
	_, err = collector.ReadOutcomes(ctx, js, subj, from, func(batch []fleetwatch.Event) {
		for i := range batch {
			ev := &batch[i]
			if ev.TS.Before(from) || ev.TS.After(to) || *pool != "" && ev.Pool != *pool {
				skipped++
				continue
			}
			line = append(fleetwatch.AppendEvent(line[:0], ev), '\n')
			bw.Write(line)
			written++
		}
	})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	logf("%d events from %s to %s (%d stored beside them outside the range or pool)", written,
		fleetwatch.FormatTime(from), fleetwatch.FormatTime(to), skipped)
	return nil
}

// parseExportTime reads an RFC 3339 time, or a duration before now.
func parseExportTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration before now must be positive", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (1h) nor an RFC 3339 time", s)
	}
	return t, nil
}
