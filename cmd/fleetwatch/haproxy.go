package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
)

func init() {
	register("haproxy", "drive HAProxy's runtime API from the decisions (open -> maint, weights 0-256)", runHAProxy)
}

// runHAProxy is `fleetwatch haproxy --socket PATH`: it follows the decision
// snapshots and reconciles HAProxy's servers with them through the
// runtime API (internal/haproxyctl, docs/INTEGRATIONS.md).
func runHAProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("haproxy", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	socket := fs.String("socket", "/run/haproxy/admin.sock", "HAProxy's stats socket at level admin: a unix path, or tcp:HOST:PORT")
	drain := fs.Bool("drain", false, "put open backends in drain instead of maint")
	interval := fs.Duration("interval", 5*time.Second, "how often a full reconcile runs besides the one each snapshot triggers")
	httpAddr := fs.String("http", "127.0.0.1:9109", "listen address for /metrics and /healthz; empty: none")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	rt := &haproxyctl.Runtime{Network: "unix", Addr: *socket}
	if addr, ok := strings.CutPrefix(*socket, "tcp:"); ok {
		rt = &haproxyctl.Runtime{Network: "tcp", Addr: addr}
	}
	logf := logTo(stderr, "haproxy: ")
	nc, err := nf.connectURL("fleetwatch-haproxy", cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer nc.Close()
	set := metrics.NewSet()
	cs := cfg.HAProxySettings()
	cs.Mapping.Drain = *drain
	cs.Runtime, cs.Interval, cs.Metrics, cs.Logf = rt, *interval, set, logf
	c, err := haproxyctl.NewController(nc, cs)
	if err != nil {
		return err
	}
	if *httpAddr != "" {
		stop, err := serveMetrics(*httpAddr, set, stdout, "haproxy")
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintf(stdout, "haproxy: following the decisions into %s\n", c)
	return c.Run(ctx)
}
