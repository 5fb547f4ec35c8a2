package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/fleetwatch/fleetwatch/internal/config"
)

func init() {
	register("config", "check a configuration file: fleetwatch config check FILE", runConfig)
}

// runConfig is `fleetwatch config check FILE`: the file loaded and
// validated as serve loads it at start and at a reload, without starting
// anything (nginx -t, promtool check config). It exits 1 naming the key
// and line of the first problem.
func runConfig(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: fleetwatch config check FILE") }
	pos, err := parseArgs(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(pos) != 2 || pos[0] != "check" {
		fs.Usage()
		return errUsage
	}
	cfg, err := config.Load(pos[1])
	if err != nil {
		return err
	}
	if cfg == nil {
		return errors.New("no configuration")
	}
	backends := 0
	for _, p := range cfg.Pools {
		backends += len(p.Backends)
	}
	fmt.Fprintf(stdout, "%s: ok (%d pools, %d backends)\n", pos[1], len(cfg.Pools), backends)
	return nil
}
