package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/internal/bench"
)

func init() {
	register("bench", "end-to-end throughput and decision latency against a plain NATS subscriber; bench peers, bench scale", runBench)
}

// runBench measures, in one run against one server configuration, how many
// outcome events per second fleetwatch ingests compared with a plain
// nats.go subscriber that only counts messages, the rate with NDJSON
// batches, and the latency from a tripping event's publish to the snapshot
// that shows the breaker open (internal/bench).
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "peers" { // real balancers side by side (bench_peers.go)
		return runBenchPeers(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "scale" { // the feed at fleet scale on real processes (bench_scale.go)
		return runBenchScale(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	events := fs.Int("events", 500_000, "events per throughput run")
	batch := fs.Int("batch", 100, "events per NDJSON message in the batch run")
	trips := fs.Int("trips", 200, "breaker trips timed for the decision latency")
	rounds := fs.Int("rounds", 3, "repetitions of each throughput run (the best is reported)")
	asJSON := fs.Bool("json", false, "print results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memory := fs.Bool("memory", false, "only measure the memory of 10,000 backends in 100 pools")
	noCapture := fs.Bool("no-jetstream", false, "run fleetwatch without JetStream (no FW_OUTCOMES capture, no KV), to see what capture costs")
	ingestMode := fs.String("ingest", "capture", "how the daemon keeps what is published while it is down: capture (the default of serve), intake (ingest.durable: true) or core (ingest.durable: false)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	if *memory {
		m, err := bench.Memory(10_000, 100)
		if err != nil {
			return err
		}
		return m.Write(stdout)
	}
	var durable *bool
	switch *ingestMode {
	case "capture":
	case "intake":
		durable = new(true)
	case "core":
		durable = new(false)
	default:
		return fmt.Errorf("bench: --ingest %q: want capture, intake or core", *ingestMode)
	}
	nopts, err := nf.options()
	if err != nil {
		return err
	}
	if nf.url != "" {
		// A TLS or credentials mistake is reported at once, before the
		// daemon under test starts (its own connection retries forever).
		if err := nf.check(nf.url); err != nil {
			return err
		}
	}
	r, err := bench.Run(ctx, bench.Settings{
		URL:         nf.url,
		NATSOptions: nopts,
		Dial:        func(name, url string) (*nats.Conn, error) { return nf.connectURL(name, url, nil) },
		Events:      *events,
		Batch:       *batch,
		Trips:       *trips,
		Rounds:      *rounds,
		NoJetStream: *noCapture,
		Durable:     durable,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return r.WriteJSON(stdout)
	}
	return r.WriteText(stdout)
}

// startCPUProfile writes a CPU profile of this process to path until
// stop is called; an empty path profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
