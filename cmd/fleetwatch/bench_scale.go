package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/bench"
)

// runBenchScale is `fleetwatch bench scale`: a three-node nats-server
// cluster, one or three serve processes (this binary), P pools of B
// backends with synthetic outcome traffic, and R routers as real NATS
// connections in this process, for each R of a list (internal/bench,
// RunScale). It prints Markdown tables and the model's predictions
// (docs/DEPLOY.md "Capacity").
func runBenchScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench scale", flag.ContinueOnError)
	var s bench.ScaleSettings
	fs.IntVar(&s.Pools, "pools", 10, "pools (P)")
	fs.IntVar(&s.Backends, "backends", 100, "backends per pool (B)")
	routers := fs.String("routers", "10,50,100", "router counts (R) measured, one window each, comma-separated")
	follow := fs.String("follow", "all", "pools each router follows: all, or a number k (taken in turn, so every pool has as many followers as can be)")
	fs.IntVar(&s.Serves, "serves", 1, "serve processes: 1, or 3 sharing the partitions (HA)")
	fs.DurationVar(&s.Duration, "duration", 30*time.Second, "measurement window of each router count")
	fs.DurationVar(&s.Warmup, "warmup", 5*time.Second, "wait between the routers' sync and the window")
	fs.Float64Var(&s.Rate, "rate", 5, "outcome events per second of each backend")
	seed := fs.Uint64("seed", 1, "seed of the synthetic traffic")
	fs.StringVar(&s.NATSServer, "nats-server", "", "the nats-server binary; default: build go.mod's nats-server (needs go and the module source), else nats-server on the PATH")
	fs.StringVar(&s.Fleetwatch, "fleetwatch", "", "the fleetwatch binary serve runs from; default: this one")
	fs.BoolVar(&s.NoStorm, "no-storm", false, "skip the reconnect storm (killing a node after the last window)")
	fs.BoolVar(&s.NoJoin, "no-join", false, "skip the fresh router's join")
	fs.IntVar(&s.GOGC, "gogc", 0, "GOGC of this process (the routers' one heap) for the run; 0: the Go default or $GOGC")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	out := fs.String("out", "", "also write the Markdown report to this file")
	verbose := fs.Bool("v", false, "log progress to stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (the routers, not serve or the servers) over each window with routers to this file (with several router counts, to this file.R for R routers)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fleetwatch bench scale: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	s.Seed = *seed
	var err error
	if s.Routers, err = parseCounts(*routers); err != nil {
		return fmt.Errorf("bench scale: --routers: %w", err)
	}
	if *follow != "all" {
		if s.Follow, err = strconv.Atoi(*follow); err != nil || s.Follow < 1 {
			return fmt.Errorf("bench scale: --follow %q: want all or a number >= 1", *follow)
		}
	}
	if *verbose {
		s.Logf = func(format string, args ...any) {
			fmt.Fprintf(stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
		}
	}
	if s.NATSServer == "" {
		if s.NATSServer, err = findNATSServer(stderr); err != nil {
			return err
		}
	}
	if *cpuProfile != "" {
		profile := func(n int) string {
			if len(s.Routers) > 1 {
				return *cpuProfile + "." + strconv.Itoa(n)
			}
			return *cpuProfile
		}
		// The first profile starts with the first window: say now if it
		// cannot be written.
		f, err := os.Create(profile(s.Routers[0]))
		if err != nil {
			return fmt.Errorf("bench scale: --cpuprofile: %w", err)
		}
		f.Close()
		s.Window = func(n int) func() {
			stop, err := startCPUProfile(profile(n))
			if err != nil {
				fmt.Fprintf(stderr, "fleetwatch bench scale: --cpuprofile: %v\n", err)
				return func() {}
			}
			return stop
		}
	}
	r, err := bench.RunScale(ctx, s)
	if err != nil {
		return err
	}
	if *out != "" {
		var b bytes.Buffer
		if err := r.WriteMarkdown(&b); err != nil {
			return err
		}
		if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if *asJSON {
		return r.WriteJSON(stdout)
	}
	return r.WriteMarkdown(stdout)
}

// parseCounts parses "10,50,100".
func parseCounts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive counts separated by commas", list)
		}
		out = append(out, n)
	}
	return out, nil
}

// findNATSServer builds the nats-server of go.mod (the version the
// embedded server is, 2.15) into the user's cache directory, as the tests
// do (natsServerBinary); where that fails (no go, or not in the module),
// it takes nats-server from the PATH and says which version it is
// (Debian's is 2.9: fine to check compatibility, not for the figures).
func findNATSServer(stderr io.Writer) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	bin := filepath.Join(dir, "fleetwatch", "nats-server")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	if out, err := cmd.CombinedOutput(); err == nil {
		fmt.Fprintf(stderr, "bench scale: nats-server built from go.mod: %s\n", bin)
		return bin, nil
	} else {
		fmt.Fprintf(stderr, "bench scale: could not build go.mod's nats-server (%v: %s); looking on the PATH\n",
			err, strings.TrimSpace(string(out)))
	}
	path, err := exec.LookPath("nats-server")
	if err != nil {
		return "", fmt.Errorf("bench scale: no nats-server: build one (go build github.com/nats-io/nats-server/v2) and pass --nats-server")
	}
	version, _ := exec.Command(path, "--version").CombinedOutput()
	fmt.Fprintf(stderr, "bench scale: using %s (%s)\n", path, strings.TrimSpace(string(version)))
	return path, nil
}
