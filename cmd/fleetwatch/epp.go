package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch/feed/epp"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/internal/pickd"
)

func init() {
	register("epp", "the endpoint picker of the Gateway API Inference Extension (Envoy ext_proc over gRPC) following the decisions", runEPP)
}

// runEPP is `fleetwatch epp`: internal/pickd (feed/epp's endpoint picker,
// see its package documentation for the protocol) over the pools of
// --config, following the decisions through a feed watcher and publishing
// one outcome event per answered request on <prefix>.outcomes.<source>.
// It serves ext_proc and gRPC health on --grpc, and /metrics, /healthz and
// the pick endpoint /v1/pick (nginx auth_request, Caddy forward_auth) on
// --http.
func runEPP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var opts pickd.Options
	host, _ := os.Hostname()
	var prefixFrom, bodyMode, visibility, grpcTLS, grpcCert, grpcKey string
	fs.StringVar(&opts.GRPCListen, "grpc", ":9002", "address of the ext_proc and gRPC health services (an InferencePool's endpointPickerRef port)")
	fs.StringVar(&grpcTLS, "grpc-tls", "off", "TLS on --grpc: off (plaintext h2c), self-signed (a certificate made at start, as GIE's picker serves by default), or files (--grpc-cert and --grpc-key)")
	fs.StringVar(&grpcCert, "grpc-cert", "", "certificate file of --grpc-tls files (PEM)")
	fs.StringVar(&grpcKey, "grpc-key", "", "key file of --grpc-tls files (PEM)")
	fs.StringVar(&opts.HTTPListen, "http", ":9090", "address of /metrics, /healthz and /v1/pick (- for none)")
	fs.StringVar(&opts.EPP.Pool, "pool", "", "the pool this picker serves (default: the configuration's only pool)")
	fs.StringVar(&opts.EPP.PoolHeader, "pool-header", "", "a request header naming the request's pool or model (such as x-ai-eg-model); without it, --pool")
	fs.StringVar(&opts.Source, "source", host, "this picker's id: the source field of its events and the last token of its outcome subject")
	fs.IntVar(&opts.EPP.Fallbacks, "fallbacks", 0, "fallback endpoints after the picked one (a comma list: only for data planes that walk it, such as Envoy's override_host)")
	fs.StringVar(&prefixFrom, "prefix-from", route.PrefixNone, "none: pick at the request headers; system: pick at the end of the body with the system prompt's affinity where the data plane streams the body first")
	fs.StringVar(&bodyMode, "body-mode", string(epp.BodyFullDuplex), "body send mode assumed when the data plane does not say (protocol_config): full_duplex_streamed, streamed, buffered or none")
	fs.StringVar(&visibility, "visibility", string(epp.VisibilityOff), "show why a backend was chosen: off, metadata (dynamic metadata \"fleetwatch\"), headers (X-Fleetwatch-* response headers) or both")
	fs.BoolVar(&opts.EPP.LeaveAfterResponseHeaders, "leave-after-response-headers", false, "end each stream at the response headers (no body processing; the outcome from the status alone)")
	fs.DurationVar(&opts.ReadyTimeout, "ready-timeout", pickd.DefaultReadyTimeout, "how long readiness waits for the pool's first decision before picking on equal weights (negative: forever)")
	fs.DurationVar(&opts.DrainTimeout, "drain-timeout", pickd.DefaultDrainTimeout, "how long open streams may finish at shutdown")
	fs.DurationVar(&opts.PickHold, "pick-hold", epp.DefaultHold, "how long a /v1/pick answer counts in flight on its backend when no outcome event of the steered proxy finishes it")
	var pickSources string
	fs.StringVar(&pickSources, "pick-sources", strings.Join(pickd.DefaultPickSources, ","), "comma-separated sources whose outcome events finish /v1/pick answers: the steered proxy's log adapter (fleetwatch ingest nginx --source)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	opts.EPP.PrefixFrom, opts.EPP.BodyMode, opts.EPP.Visibility = prefixFrom, epp.BodyMode(bodyMode), epp.Visibility(visibility)
	for _, s := range strings.Split(pickSources, ",") {
		if s = strings.TrimSpace(s); s != "" {
			opts.PickSources = append(opts.PickSources, s)
		}
	}
	if opts.EPP.Fallbacks < 0 {
		fmt.Fprintf(stderr, "--fallbacks = %d: must be >= 0\n", opts.EPP.Fallbacks)
		return errUsage
	}
	if opts.Source == "" {
		opts.Source = epp.DefaultSource
	}
	var err error
	if opts.GRPCTLS, err = grpcTLSConfig(grpcTLS, grpcCert, grpcKey); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	if len(cfg.Pools) == 0 {
		return errors.New("the configuration has no pools: epp needs --config with pools and backend urls (the InferencePool's endpoints)")
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "epp: "+format+"\n", args...) }
	opts.Logf = logf
	opts.Dial = func() (*nats.Conn, error) { return nf.connectURL("fleetwatch-epp-"+opts.Source, cfg.NATS.URL, logf) }
	var d *pickd.Daemon
	opts.OnListen = func(grpcAddr, httpURL string) {
		fmt.Fprintf(stdout, "epp: ext_proc on %s, http on %s (pool %s, events on %s)\n", grpcAddr, orNone(httpURL), d.EPP().Pool(), d.Subject())
	}
	// The daemon is built before NATS is dialled, so that a configuration
	// error is reported as such; its Run dials.
	if d, err = pickd.New(cfg, opts); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer d.Close()
	return d.Run(ctx)
}

// grpcTLSConfig is the TLS of the gRPC listener for --grpc-tls mode.
func grpcTLSConfig(mode, certFile, keyFile string) (*tls.Config, error) {
	if (certFile != "" || keyFile != "") && mode != "files" {
		return nil, errors.New("--grpc-cert and --grpc-key go with --grpc-tls files")
	}
	switch mode {
	case "off":
		return nil, nil
	case "self-signed":
		host, _ := os.Hostname()
		return pickd.SelfSignedTLS("localhost", host)
	case "files":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--grpc-cert, --grpc-key: %w", err)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
	}
	return nil, fmt.Errorf("--grpc-tls = %q: want off, self-signed or files", mode)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
