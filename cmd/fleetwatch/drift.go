package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/serve"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

func init() {
	register("drift", "drift review, status, re-baseline and the drift harness (fleetwatch drift review|status|rebaseline|sim)", runDrift)
}

// controlTimeout bounds a request to serve's probes.
const controlTimeout = 5 * time.Second

// runDrift is `fleetwatch drift <review|status|rebaseline|sim>`.
func runDrift(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, `usage: fleetwatch drift <command> [flags]

commands:
  review [--since D] [--json]       print the drift review digest now (from FW_DRIFT)
  status [--json]                   every backend's drift state (asks serve; falls back to FW_DRIFT)
  rebaseline <pool> <backend>       drop a backend's baseline and enrol again (recorded in FW_DRIFT)
  sim [--cycles N] [--seed S] ...   run the toy-LM drift harness: false alarms, power, delay`)
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

// streamErr explains a missing FW_DRIFT.
func streamErr(cmd string, subj fleetwatch.Subjects, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%s: no stream %s yet (it is created by serve with JetStream): %w", cmd, subj.StreamDrift(), err)
	}
	return fmt.Errorf("%s: %s: %w", cmd, subj.StreamDrift(), err)
}

// askStatuses asks serve's probes for every backend's state; nil when no
// serve answers.
func askStatuses(nc *nats.Conn, subj fleetwatch.Subjects) ([]probes.BackendStatus, error) {
	m, err := nc.Request(subj.Control(serve.ControlDriftStatus), nil, controlTimeout)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r serve.ControlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("drift status reply: %w", err)
	}
	if !r.OK {
		return nil, errors.New(r.Error)
	}
	if r.Statuses == nil {
		r.Statuses = []probes.BackendStatus{}
	}
	return r.Statuses, nil
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
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	now := time.Now()
	from := now.Add(-7 * 24 * time.Hour)
	if *since > 0 {
		from = now.Add(-*since)
	} else if t, ok, err := serve.LastReview(ctx, js, subj); err != nil {
		return streamErr("drift review", subj, err)
	} else if ok {
		from = t
	}
	alerts, _, err := serve.ReadDrift(ctx, js, subj, from)
	if err != nil {
		return streamErr("drift review", subj, err)
	}
	statuses, err := askStatuses(nc, subj)
	if err != nil {
		return err
	}
	r := probes.BuildReview(now, from, alerts, statuses)
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
	subj := fleetwatch.Subjects{Prefix: cfg.Prefix}
	statuses, err := askStatuses(nc, subj)
	if err != nil {
		return err
	}
	source := "serve"
	if statuses == nil {
		// no serve: the latest alert of each backend in the stream
		source = subj.StreamDrift() + " (no running serve answered)"
		alerts, _, err := serve.ReadDrift(ctx, js, subj, time.Now().Add(-serve.DriftRetention))
		if err != nil {
			return streamErr("drift status", subj, err)
		}
		latest := map[[2]string]fleetwatch.DriftAlert{}
		for _, a := range alerts {
			latest[[2]string{a.Pool, a.Backend}] = a
		}
		for _, a := range latest {
			statuses = append(statuses, probes.BackendStatus{Pool: a.Pool, Backend: a.Backend, Status: a.Status, Since: a.At.Time,
				Score: a.Score, Threshold: a.Threshold})
		}
		slices.SortFunc(statuses, func(a, b probes.BackendStatus) int {
			return strings.Compare(a.Pool+"\x00"+a.Backend, b.Pool+"\x00"+b.Backend)
		})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(statuses)
	}
	fmt.Fprintf(stdout, "drift status from %s\n", source)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tBACKEND\tSTATUS\tSINCE\tSCORE/THRESHOLD\tBASELINE\tLAST ERROR")
	for _, s := range statuses {
		since := "-"
		if !s.Since.IsZero() {
			since = fleetwatch.FormatTime(s.Since)
		}
		base := "-"
		switch {
		case s.Enrolling:
			base = fmt.Sprintf("enrolling (%d cycles)", s.EnrolCycles)
		case s.BaselineCycles > 0:
			base = fmt.Sprintf("%d cycles, %s", s.BaselineCycles, fleetwatch.FormatTime(s.BaselineCreated))
		}
		lastErr := "-"
		if s.LastError != "" {
			lastErr = s.LastErrorKind + ": " + s.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3g/%.3g\t%s\t%s\n", s.Pool, s.Backend, s.Status, since, s.Score, s.Threshold, base, lastErr)
	}
	return tw.Flush()
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
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	pos = append(pos, fs.Args()...)
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
	req, _ := json.Marshal(serve.RebaselineRequest{Pool: pool, Backend: backend, By: *by})
	m, err := nc.Request(subj.Control(serve.ControlRebaseline), req, controlTimeout)
	switch {
	case err == nil:
		var r serve.ControlReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return fmt.Errorf("drift rebaseline reply: %w", err)
		}
		if !r.OK {
			return fmt.Errorf("drift rebaseline: %s", r.Error)
		}
		fmt.Fprintf(stdout, "re-baseline of %s/%s done by serve: %s\n", pool, backend, r.Alert.Reason)
		return nil
	case errors.Is(err, nats.ErrNoResponders):
		// no serve running: clear the stored baseline and record it ourselves
		kv, err := serve.OpenBaselines(ctx, js, subj)
		if err != nil {
			return err
		}
		if err := (serve.KVBaselines{KV: kv}).Save(ctx, pool, backend, nil); err != nil {
			return err
		}
		if _, err := serve.EnsureDriftStream(ctx, js, subj); err != nil {
			return err
		}
		suite, err := probes.LoadSuite(cfg.Probes.Suite)
		if err != nil {
			return err
		}
		a := probes.RebaselineAlert(pool, backend, suite, fleetwatch.DriftUnknown, *by, time.Now())
		data, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, subj.Drift(pool), data); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "no serve answered: baseline of %s/%s cleared in %s and recorded in %s\n", pool, backend, subj.BucketBaselines(), subj.StreamDrift())
		return nil
	default:
		return fmt.Errorf("drift rebaseline: %w", err)
	}
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
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *cycles < *backends || *backends < 1 || *trials < 1 || *enrol < 3 || *interval <= 0 || *enrolMin < 0 {
		return fmt.Errorf("drift sim: need --cycles >= --backends >= 1, --trials >= 1, --enrol >= 3, --interval > 0 and --enrol-min >= 0")
	}
	suite, err := probes.LoadSuite("")
	if err != nil {
		return err
	}
	h := &toylm.Harness{Suite: suite, Enrol: *enrol, EnrolMin: *enrolMin, Interval: *interval}
	if *enrolMin == 0 {
		h.EnrolMin = -1
	}
	ref := toylm.New(toylm.Config{})
	h.Ref = ref
	variants := toylm.Variants(ref)
	fmt.Fprintf(stdout, "# fleetwatch drift sim (seed %d, suite %s; a cycle every %v, enrolment of at least %d cycles over at least %v, the newest %d kept)\n\n",
		*seed, suite.Name, *interval, *enrol, *enrolMin, 2**enrol)
	fmt.Fprintln(stdout, "Calibration (measured KL against the reference, nats/token; greedy top-1 agreement):")
	for _, v := range variants {
		if m, ok := variantModel(v, ref); ok {
			fmt.Fprintf(stdout, "- %s: KL %.5f, top-1 agreement %.3f\n", v.Name, toylm.MeasureKL(ref, m), toylm.Top1Agreement(ref, m))
		}
	}
	levels := append(slices.Clone(toylm.NoiseLevels), toylm.LoadRegime)
	var fp16 toylm.Variant
	for _, v := range variants {
		if v.Name == "fp16" {
			fp16 = v
		}
	}
	fmt.Fprintln(stdout, "\n## Null (unchanged backend, and fp16 rounding)")
	fmt.Fprintln(stdout, "\n| sigma | served | cycles | gross signals | rate (95% CP) | alarms (left ok) | rate (95% CP) | drifted |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|")
	per := *cycles / *backends
	for _, sigma := range levels {
		for _, v := range []*toylm.Variant{nil, &fp16} {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Null(sigma, v, *backends, per, *seed)
			if err != nil {
				return err
			}
			name := "reference"
			if v != nil {
				name = v.Name
			}
			fmt.Fprintf(stdout, "| %s | %s | %d | %d | %s | %d | %s | %d |\n", toylm.SigmaName(sigma), name, r.Cycles,
				r.Gross, rateCP(r.Gross, r.Cycles), r.Alarms, rateCP(r.Alarms, r.Cycles), r.Drifted)
		}
	}
	fmt.Fprintf(stdout, "\n## Power and delay (%d trials per cell; change point right after enrolment)\n", *trials)
	fmt.Fprintf(stdout, "\n| variant | sigma | left ok in 1 cycle (95%% CP) | within 3 | within %d | drifted within %d | median cycles to alarm | median cycles to drifted |\n", *maxDelay, *maxDelay)
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|")
	for _, v := range variants {
		for _, sigma := range levels {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Power(v, sigma, *trials, *maxDelay, *seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", v.Name, toylm.SigmaName(sigma),
				propCP(r.Within(1), r.Trials), propCP(r.Within(3), r.Trials), propCP(r.Within(*maxDelay), r.Trials),
				propCP(r.DriftedWithin(*maxDelay), r.Trials), medianDelay(r.SuspectDelay), medianDelay(r.DriftedDelay))
		}
	}
	fmt.Fprintf(stdout, "\n## Peers (3 backends, the last one serving the variant from the start; %d trials)\n", *peerTrials)
	fmt.Fprintln(stdout, "\n| variant | sigma | outlier named (95% CP) | wrong backend named | median distance of the farthest backend | median distance among the others |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|")
	for _, v := range variants {
		if v.Name == "swap" || v.Name == "partial-q4-50%" {
			continue
		}
		for _, sigma := range levels {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := h.Peers(v, sigma, 3, *peerTrials, *seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "| %s | %s | %s | %d | %.4f | %.4f |\n", v.Name, toylm.SigmaName(sigma), propCP(r.Named, r.Trials),
				r.WrongName, medianOf(r.Distances), medianOf(r.OthersDistances))
		}
	}
	return nil
}

// variantModel returns the single model behind a plain variant.
func variantModel(v toylm.Variant, ref *toylm.Model) (*toylm.Model, bool) {
	c, models := v.Build(ref, toylm.Options{})
	if len(models) != 1 {
		return nil, false
	}
	m, ok := c.(*toylm.Model)
	return m, ok
}

// rateCP formats k/n as a rate with its 95% Clopper-Pearson interval.
func rateCP(k, n int) string {
	lo, hi := probes.ClopperPearson(k, n, 0.05)
	return fmt.Sprintf("%.2g [%.2g, %.2g]", float64(k)/float64(n), lo, hi)
}

// propCP formats k of n with its 95% Clopper-Pearson interval.
func propCP(k, n int) string {
	lo, hi := probes.ClopperPearson(k, n, 0.05)
	return fmt.Sprintf("%d/%d [%.2f, %.2f]", k, n, lo, hi)
}

// medianDelay is the median of the detection delays, counting misses as
// infinite.
func medianDelay(d []int) string {
	s := make([]int, len(d))
	for i, v := range d {
		if v == 0 {
			v = 1 << 30
		}
		s[i] = v
	}
	slices.Sort(s)
	m := s[(len(s)-1)/2]
	if m == 1<<30 {
		return "not detected"
	}
	return fmt.Sprint(m)
}

func medianOf(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
