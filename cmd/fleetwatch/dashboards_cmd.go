package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fleetwatch/fleetwatch/dashboards"
)

func init() {
	register("dashboards", "export the Grafana dashboards (fleetwatch dashboards export DIR) or print the alerting rules (fleetwatch dashboards alerts)", runDashboards)
}

// runDashboards is `fleetwatch dashboards export [-force] DIR`: it writes
// every embedded Grafana dashboard as DIR/<file>.json, creating DIR. An
// existing file is kept unless -force is given, so that a dashboard edited in
// place is not silently lost.
func runDashboards(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: fleetwatch dashboards export [-force] DIR\n"+
			"       fleetwatch dashboards alerts\n\n"+
			"export writes the Grafana dashboards (JSON, for a Prometheus or VictoriaMetrics\n"+
			"data source chosen with the ${datasource} variable) into DIR; alerts prints\n"+
			"the Prometheus alerting rules for fleetwatch's own metrics (docs/OPERATIONS.md).")
	}
	if len(args) == 1 && args[0] == "alerts" {
		_, err := stdout.Write(dashboards.AlertRules())
		return err
	}
	if len(args) == 0 || args[0] != "export" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			usage()
			return flag.ErrHelp
		}
		usage()
		return errUsage
	}
	fs := flag.NewFlagSet("dashboards export", flag.ContinueOnError)
	force := fs.Bool("force", false, "overwrite existing files")
	fs.Usage = usage
	if err := parseFlags(fs, args[1:], stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		usage()
		return errUsage
	}
	dir := fs.Arg(0)
	list, err := dashboards.Grafana()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range list {
		if err := ctx.Err(); err != nil {
			return err
		}
		path := filepath.Join(dir, d.File)
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		if !*force {
			flags |= os.O_EXCL
		}
		f, err := os.OpenFile(path, flags, 0o644)
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists (use -force to overwrite): %w", path, err)
		}
		if err != nil {
			return err
		}
		_, werr := f.Write(d.JSON)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return werr
		}
		fmt.Fprintf(stdout, "%s\t%s (uid %s)\n", path, d.Title, d.UID)
	}
	return nil
}
