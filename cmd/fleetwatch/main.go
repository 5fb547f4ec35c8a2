// Command fleetwatch keeps a fleet of LLM inference endpoints healthy from
// the outcomes of real traffic: it turns outcome events published on NATS
// into per-pool circuit-breaker and weight decisions that many thin routers
// follow, and probes every backend for silent artefact drift.
//
// Usage:
//
//	fleetwatch serve      run collector, analyzer, feed, probes and the HTTP server
//	fleetwatch demo       serve plus a simulated fleet with scripted incidents
//	fleetwatch route      a thin OpenAI-compatible router that follows the decisions
//	fleetwatch watch      a live terminal view of a pool's decisions
//	fleetwatch sim        compare routing policies in the simulator
//	fleetwatch drift      drift review, status, re-baseline and the drift harness
//	fleetwatch bench      end-to-end throughput against a plain NATS subscriber
//
// Run "fleetwatch help" for the full list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	summary string
}

// commands is the subcommand table. Files that implement a subcommand add
// themselves in an init function, so this file does not change per command.
var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{run: run, summary: summary}
}

func main() {
	ctx, stop := signalContext(context.Background(), os.Stderr)
	defer stop()
	os.Exit(Run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// signalContext returns a context canceled by the first SIGINT or SIGTERM
// (a graceful drain); a second signal exits at once.
func signalContext(parent context.Context, stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(stderr, "fleetwatch: %v: shutting down (again to exit at once)\n", s)
			cancel()
		case <-done:
			return
		}
		select {
		case <-ch:
			fmt.Fprintln(stderr, "fleetwatch: second signal: exiting now")
			os.Exit(130)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

// Run runs the fleetwatch command line and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fleetwatch: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "fleetwatch %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage marks a command-line mistake already reported by the flag set.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fleetwatch <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun \"fleetwatch <command> -h\" for a command's flags.")
}

// parseFlags parses args with fs, writing errors to stderr, and maps a
// parse failure to errUsage.
// parseArgs parses fs from args, accepting positional arguments before
// the flags as well as after them, and returns the positional ones.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	return append(pos, fs.Args()...), nil
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}
