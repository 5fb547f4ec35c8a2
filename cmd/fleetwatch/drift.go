package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

func init() {
	register("drift", "drift review, status, re-baseline and the drift harness (fleetwatch drift review|status|rebaseline|sim)", runDrift)
}

// runDrift is `fleetwatch drift <review|status|rebaseline|sim>`.
func runDrift(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, `usage: fleetwatch drift <command> [flags]

commands:
  review [--since D] [--json]       print the drift review digest now (from FW_DRIFT)
  status [--json]                   every backend's drift state (asks serve; falls back to FW_DRIFT)
  rebaseline <pool> <backend>       drop a backend's baseline and enrol again (recorded in FW_DRIFT)
  sim [--cycles N] [--seed S] ...   run the toy-LM drift harness: false alarms, power, delay
                                    (--null-only: the false-alarm table alone)`)
	}
	if len(args) == 0 {
		usage()
		return errUsage
	}
	switch args[0] {
	case "review":
		return runDriftReview(ctx, args[1:], stdout, stderr)
	case "status":
		return runDriftStatus(ctx, args[1:], stdout, stderr)
	case "rebaseline":
		return runDriftRebaseline(ctx, args[1:], stdout, stderr)
	case "sim":
		return runDriftSim(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		usage()
		return nil
	}
	fmt.Fprintf(stderr, "fleetwatch drift: unknown command %q\n", args[0])
	usage()
	return errUsage
}

// driftConn connects to NATS for a drift command and opens JetStream.
func driftConn(nf *natsFlags, name string, stderr io.Writer) (*config.Config, *nats.Conn, jetstream.JetStream, error) {
	cfg, err := nf.loadConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "drift: "+format+"\n", args...) }
	nc, err := nf.connectURL(name, cfg.NATS.URL, logf)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return cfg, nc, js, nil
}

func runDriftReview(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("drift review", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	since := fs.Duration("since", 0, "review this far back (default: since the last review digest, or 7 days)")
	asJSON := fs.Bool("json", false, "print the digest as JSON (the fw.drift.review payload) instead of Markdown")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	cfg, nc, js, err := driftConn(&nf, "fleetwatch-drift-review", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, statuses, err := control.Review(ctx, nc, js, fleetwatch.Subjects{Prefix: cfg.Prefix}, time.Now(), *since)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	_, err = io.WriteString(stdout, probes.RenderMarkdown(r, statuses))
	return err
}

func runDriftStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("drift status", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, nc, js, err := driftConn(&nf, "fleetwatch-drift-status", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	statuses, source, err := control.DriftStatuses(ctx, nc, js, fleetwatch.Subjects{Prefix: cfg.Prefix}, time.Now())
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(statuses)
	}
	return control.WriteDriftStatus(stdout, source, statuses)
}

func runDriftRebaseline(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("drift rebaseline", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	by := fs.String("by", "", "who asks (recorded in the alert; default $USER)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetwatch drift rebaseline [flags] <pool> <backend>")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args, stderr) // the pool and backend before or after the flags
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return errUsage
	}
	pool, backend := pos[0], pos[1]
	if err := fleetwatch.ValidatePoolID(pool); err != nil {
		return err
	}
	if err := fleetwatch.ValidateBackendID(backend); err != nil {
		return err
	}
	if *by == "" {
		*by = os.Getenv("USER")
	}
	cfg, nc, js, err := driftConn(&nf, "fleetwatch-drift-rebaseline", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	a, byServe, err := control.Rebaseline(ctx, nc, js, subj, control.RebaselineRequest{Pool: pool, Backend: backend, By: *by}, cfg.Probes.Suite, time.Now())
	if err != nil {
		return err
	}
	if byServe {
		fmt.Fprintf(stdout, "re-baseline of %s/%s done by serve: %s\n", pool, backend, a.Reason)
	} else {
		fmt.Fprintf(stdout, "no serve answered: baseline of %s/%s cleared in %s and recorded in %s\n", pool, backend, subj.BucketBaselines(), subj.StreamDrift())
	}
	return nil
}

// runDriftSim is `fleetwatch drift sim` (also `fleetwatch sim drift`): the
// toy-LM harness of docs/DRIFT.md.
func runDriftSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("drift sim", flag.ContinueOnError)
	cycles := fs.Int("cycles", 2000, "null cycles per noise level (split over --backends independent enrolments)")
	backends := fs.Int("backends", 20, "independent enrolments the null cycles are split over")
	trials := fs.Int("trials", 50, "trials per variant and noise level for power and delay")
	maxDelay := fs.Int("max-delay", 10, "cycles a power trial waits for detection")
	peerTrials := fs.Int("peer-trials", 20, "trials of the three-peer outlier test per noise level")
	seed := fs.Uint64("seed", 1, "seed of every run")
	enrol := fs.Int("enrol", 8, "minimum enrolment cycles (probes.enrol)")
	enrolMin := fs.Duration("enrol-min", 2*time.Hour, "minimum enrolment span (probes.enrol_min); 0: none")
	interval := fs.Duration("interval", 5*time.Minute, "time between cycles (the probe schedule)")
	nullOnly := fs.Bool("null-only", false, "run only the false-alarm measurement: --cycles null cycles per noise level, each count with its exact 95% upper bound")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "null backends run at once (the result does not depend on it)")
	tier := fs.String("tier", "teacher", "what is judged: sampled (the sampled probes alone), teacher (teacher-forced scores for subtle changes, serve's default) or both (every rule of both tiers)")
	noise := fs.String("noise", "independent", "noise model: independent (sigma 0.003, 0.03, 0.1 and the load regime) or correlated (those and the correlated level: numeric paths chosen by batch shape, shared by consecutive cycles)")
	legacyS4 := fs.Bool("legacy-s4", false, "judge the sampled tier as before its persistence test (the CUSUM on S4's z), for comparison")
	toolsOnly := fs.Bool("tools-only", false, "run only the tool-call probes' section (suite default-v1+tools-v1)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if _, err := toylm.TierMode(*tier); err != nil {
		return fmt.Errorf("drift sim: --tier: %w", err)
	}
	if *cycles < *backends || *backends < 1 || *trials < 1 || *enrol < 3 || *interval <= 0 || *enrolMin < 0 || *workers < 1 {
		return fmt.Errorf("drift sim: need --cycles >= --backends >= 1, --trials >= 1, --enrol >= 3, --interval > 0, --enrol-min >= 0 and --workers >= 1")
	}
	if _, err := toylm.Levels(*noise); err != nil {
		return fmt.Errorf("drift sim: --noise: %w", err)
	}
	if *nullOnly && *toolsOnly {
		return fmt.Errorf("drift sim: --null-only and --tools-only exclude each other")
	}
	rs := toylm.ReportSettings{
		Cycles: *cycles, Backends: *backends, Trials: *trials, MaxDelay: *maxDelay, PeerTrials: *peerTrials,
		Seed: *seed, Enrol: *enrol, EnrolMin: *enrolMin, Interval: *interval, Workers: *workers, Tier: *tier,
		Noise: *noise, LegacyS4: *legacyS4,
	}
	if *nullOnly {
		return toylm.WriteFalseAlarms(ctx, stdout, rs)
	}
	if *toolsOnly {
		return toylm.WriteToolReport(ctx, stdout, rs)
	}
	return toylm.WriteReport(ctx, stdout, rs)
}
