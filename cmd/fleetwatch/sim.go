package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/sim"
)

func init() {
	register("sim", "compare routing policies in the deterministic simulator (tables, CSV, SVG charts)", runSim)
}

// simVariants are the picker and analyzer variants --variants adds to every
// scenario, for the choice of the defaults.
var simVariants = []string{sim.FWSeed, sim.FWSqrt, sim.FWNoGuard, sim.FWDefaultAnalyzer}

// runSim runs the simulator's scenarios and prints one table per scenario;
// with --out it also writes results.csv, tables.md, shares-<scenario>.csv
// and two SVG charts per scenario. The output on stdout depends only on the
// flags (the same seed gives the same tables); timing goes to stderr.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "drift" {
		// `fleetwatch sim drift` is the drift harness, `fleetwatch drift sim`.
		return runDrift(ctx, append([]string{"sim"}, args[1:]...), stdout, stderr)
	}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	scenario := fs.String("scenario", "", "run only the scenarios named (comma-separated); \"list\" lists them; default all")
	seed := fs.Uint64("seed", 1, "random seed of the first run")
	seeds := fs.Int("seeds", 1, "number of seeds (seed, seed+1, ...); tables show the median over seeds, CSV every run")
	out := fs.String("out", "", "directory for CSV, Markdown and SVG files (none when empty)")
	duration := fs.Duration("duration", 0, "shorten every scenario to this simulated duration (incident times scale); 0 keeps each scenario's")
	policies := fs.String("policies", "", "comma-separated policies to compare instead of each scenario's own")
	routers := fs.Int("routers", 0, "routers sharing the traffic in every scenario (for example 1, 4, 16, 64); 0 keeps each scenario's")
	feedPeriod := fs.Duration("feed-period", 0, "how often the published loads reach the routers: the compact feed's load beat (the snapshots every 1s, or every period when longer), or the JSON feed's heartbeat; 0 keeps 250ms load beats and 1s heartbeats")
	scrapeInterval := fs.Duration("scrape-interval", 0, "with the exact-load policies (fl-load3-exact, fw-exact) and fw-both-loads: read each backend's load every interval, at a phase of its own, and publish the latest read with its age (fw-both-loads: the newer of it and the event's); 0 reads every backend at every snapshot")
	feedKind := fs.String("feed", "compact", "the feed the fleetwatch routers follow: compact (key and load frames, as fleetwatch route does) or json (the snapshots alone: route.feed json, third-party routers)")
	stallFloor := fs.Duration("stall-floor", 0, "the feed-following routers' first-token deadline floor (route's stall_floor); 0 keeps 10s, negative turns the deadline off")
	prefillPenalty := fs.Float64("prefill-batch-penalty", 0, "slow every backend's prefill by 1 + this x its other busy slots / slots (a server whose decodes share steps with a new prompt's prefill); 0 keeps the default model")
	incidentRate := fs.Float64("incident-rate", 0, "answer only this share of a backend's requests as its failing incidents do (fail-fast, throttle, bare-throttle, client-errors), in (0, 1]; 0 keeps each incident's")
	scale := fs.Int("scale", 1, "run every scenario over this many times its backends at this many times its rate (copies of each backend; an incident on one backend stays on it)")
	detection := fs.Bool("detection", false, "also print breaker openings and the time to open the watched backend, per seed")
	variants := fs.Bool("variants", false, "also run the picker's score variants and the default-analyzer variant: "+strings.Join(simVariants, ", "))
	trace := fs.String("trace", "", "replay this per-request trace through the policies instead of the scenarios (formats: "+strings.Join(sim.TraceFormats, ", ")+")")
	format := fs.String("format", "", "the --trace file's format; detected from its first line when empty")
	speed := fs.Float64("speed", 1, "with --trace: compress the trace's time by this factor (2: twice the rate)")
	backends := fs.Int("backends", 4, "with --trace: identical backends in the fleet")
	slots := fs.Int("slots", 8, "with --trace: concurrent sequences per backend (the queue is 4x)")
	kvBlocks := fs.Int("kv-blocks", sim.DefaultKVBlocks, "with --trace: KV prefix cache per backend in 512-token blocks (0: none)")
	decodeMs := fs.Float64("decode-ms", 5, "with --trace: decode time per output token at an empty batch, ms")
	fleet := fs.String("fleet", "", "with --trace: the fleet as groups COUNTxSLOTS[@TIMES][:KVBLOCKS], for example 2x8,2x8@2 (two of 8 slots, two more taking twice the time); instead of --backends and --slots")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: fleetwatch sim [--scenario NAME] [--seed N] [--seeds N] [--out DIR] [--duration D] [--routers N] [--feed compact|json] [--feed-period D] [--scrape-interval D] [--scale K] [--prefill-batch-penalty K] [--incident-rate R] [--variants]")
		fmt.Fprintln(fs.Output(), "       fleetwatch sim --trace FILE [--format F] [--speed X] [--routers N] [--backends N --slots N | --fleet SPEC] [--kv-blocks N] [--prefill-batch-penalty K] [--policies P,...]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fleetwatch sim: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	if *routers < 0 || *feedPeriod < 0 || *scrapeInterval < 0 || *scale < 1 || *prefillPenalty < 0 || !(*incidentRate >= 0 && *incidentRate <= 1) {
		fmt.Fprintln(stderr, "fleetwatch sim: --routers, --feed-period, --scrape-interval and --prefill-batch-penalty must be >= 0, --scale >= 1, --incident-rate in [0, 1]")
		return errUsage
	}
	if *seeds < 1 {
		fmt.Fprintln(stderr, "fleetwatch sim: --seeds must be >= 1")
		return errUsage
	}
	if *feedKind != "compact" && *feedKind != "json" {
		fmt.Fprintf(stderr, "fleetwatch sim: --feed = %q: want compact or json\n", *feedKind)
		return errUsage
	}
	jsonFeed := *feedKind == "json"
	if *trace != "" {
		if *speed <= 0 || *backends < 1 || *slots < 1 || *kvBlocks < 0 || *decodeMs <= 0 {
			fmt.Fprintln(stderr, "fleetwatch sim: --speed, --backends, --slots and --decode-ms must be > 0, --kv-blocks >= 0")
			return errUsage
		}
		o := sim.TraceOptions{Speed: *speed, Routers: *routers, Backends: *backends, Slots: *slots, KVBlocks: *kvBlocks, DecodeMs: *decodeMs}
		if *fleet != "" {
			if flagSet(fs, "backends") || flagSet(fs, "slots") {
				fmt.Fprintln(stderr, "fleetwatch sim: --fleet replaces --backends and --slots; give one or the other")
				return errUsage
			}
			groups, err := sim.ParseFleet(*fleet)
			if err != nil {
				fmt.Fprintf(stderr, "fleetwatch sim: --fleet: %v\n", err)
				return errUsage
			}
			o.Fleet = groups
		}
		if *kvBlocks == 0 {
			o.KVBlocks = -1
		}
		if *policies != "" {
			o.Policies = strings.Split(*policies, ",")
		}
		return runSimTrace(ctx, *trace, *format, o, simFeed{*feedPeriod, jsonFeed, *scrapeInterval}, *prefillPenalty, *seed, *seeds, *out, stdout, stderr)
	}
	all := sim.Scenarios()
	if *scenario == "list" {
		for _, sc := range all {
			fmt.Fprintf(stdout, "%-16s %s\n", sc.Name, sc.Description)
		}
		return nil
	}
	scenarios, err := sim.SelectScenarios(all, *scenario)
	if err != nil {
		fmt.Fprintf(stderr, "fleetwatch sim: %v\n", err)
		return errUsage
	}
	adjustScenarios(scenarios, scenarioFlags{duration: *duration, routers: *routers, feed: simFeed{*feedPeriod, jsonFeed, *scrapeInterval}, scale: *scale, prefillPenalty: *prefillPenalty,
		incidentRate: *incidentRate, stallFloor: *stallFloor, policies: *policies, variants: *variants})
	return runScenarios(ctx, scenarios, *seed, *seeds, *detection, *out, stdout, stderr)
}

// scenarioFlags are the flags of `fleetwatch sim` that change the
// scenarios.
type scenarioFlags struct {
	duration, stallFloor         time.Duration
	feed                         simFeed
	routers, scale               int
	prefillPenalty, incidentRate float64
	policies                     string
	variants                     bool
}

// simFeed is the feed of --feed, --feed-period and --scrape-interval.
type simFeed struct {
	period time.Duration
	json   bool
	scrape time.Duration
}

func (f simFeed) apply(sc *sim.Scenario) {
	if f.period > 0 {
		sc.FeedPeriod = f.period
	}
	sc.JSONFeed = f.json
	sc.ScrapeInterval = f.scrape
}

// adjustScenarios applies the flags to the scenarios chosen.
func adjustScenarios(scenarios []sim.Scenario, f scenarioFlags) {
	for i := range scenarios {
		scenarios[i] = scenarios[i].Shorten(f.duration).Scaled(f.scale).WithPrefillBatchPenalty(f.prefillPenalty).WithIncidentRate(f.incidentRate)
		if f.routers > 0 {
			scenarios[i].Routers = f.routers
		}
		f.feed.apply(&scenarios[i])
		if f.stallFloor != 0 {
			scenarios[i].StallFloor = f.stallFloor
		}
		switch {
		case f.policies != "":
			scenarios[i].Policies = strings.Split(f.policies, ",")
		case f.variants:
			pols := slices.Clone(sim.PoliciesOf(scenarios[i]))
			for _, v := range simVariants {
				if !slices.Contains(pols, v) {
					pols = append(pols, v)
				}
			}
			scenarios[i].Policies = pols
		}
	}
}

// runScenarios runs the scenarios over the seeds and prints their tables
// (and the detection tables), writing the files into out when it is set.
func runScenarios(ctx context.Context, scenarios []sim.Scenario, seed uint64, seeds int, detection bool, out string, stdout, stderr io.Writer) error {
	start := time.Now()
	results, err := sim.RunScenarios(ctx, scenarios, seed, seeds)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)

	var tables strings.Builder
	requests := 0
	for i, sc := range scenarios {
		var medians []*sim.Result
		for _, runs := range results[i] {
			medians = append(medians, sim.Median(runs))
			for _, r := range runs {
				requests += r.Requests
			}
		}
		if err := sim.WriteTable(&tables, sc, medians); err != nil {
			return err
		}
	}
	if seeds > 1 {
		fmt.Fprintf(stdout, "Medians over seeds %d to %d.\n\n", seed, seed+uint64(seeds)-1)
	}
	if _, err := io.WriteString(stdout, tables.String()); err != nil {
		return err
	}
	if detection {
		for i, sc := range scenarios {
			if err := sim.WriteDetection(stdout, sc, results[i]); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(stderr, "fleetwatch sim: %d runs, %d simulated requests in %.2fs (%.0f requests per wall second)\n",
		sim.CountRuns(results), requests, elapsed.Seconds(), float64(requests)/elapsed.Seconds())
	if out != "" {
		if err := sim.WriteFiles(out, scenarios, results, tables.String()); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "fleetwatch sim: wrote %s\n", out)
	}
	return nil
}

// runSimTrace replays a trace file through the policies and prints one
// table (medians over seeds: the seed draws each request's router and the
// policies' randomness); with out it also writes results.csv and tables.md.
func runSimTrace(ctx context.Context, path, format string, o sim.TraceOptions, feed simFeed, prefillPenalty float64, seed uint64, seeds int, out string, stdout, stderr io.Writer) error {
	tr, err := sim.ReadTraceFile(path, format)
	if err != nil {
		return err
	}
	sc := sim.TraceScenario(tr, o).WithPrefillBatchPenalty(prefillPenalty)
	feed.apply(&sc)
	start := time.Now()
	results, err := sim.RunScenarios(ctx, []sim.Scenario{sc}, seed, seeds)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	var medians []*sim.Result
	requests := 0
	for _, runs := range results[0] {
		medians = append(medians, sim.Median(runs))
		for _, r := range runs {
			requests += r.Requests
		}
	}
	var tables strings.Builder
	if seeds > 1 {
		fmt.Fprintf(&tables, "Medians over seeds %d to %d.\n\n", seed, seed+uint64(seeds)-1)
	}
	if err := sim.WriteTraceTable(&tables, sc, medians); err != nil {
		return err
	}
	if _, err := io.WriteString(stdout, tables.String()); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "fleetwatch sim: %d runs, %d replayed requests in %.2fs (%.0f requests per wall second)\n",
		sim.CountRuns(results), requests, elapsed.Seconds(), float64(requests)/elapsed.Seconds())
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var flat []*sim.Result
	for _, runs := range results[0] {
		flat = append(flat, runs...)
	}
	var csv strings.Builder
	if err := sim.WriteCSV(&csv, flat, true); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "results.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "tables.md"), []byte(tables.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "fleetwatch sim: wrote %s\n", out)
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
