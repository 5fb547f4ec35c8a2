package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

func init() {
	register("ingest", "turn nginx or HAProxy access logs (file or syslog) into outcome events (fleetwatch ingest nginx|haproxy)", runIngest)
}

// ingestHTTPDefaults are the adapters' --http defaults: distinct, since
// both may run on one host, and apart from `fleetwatch haproxy`'s 9109.
var ingestHTTPDefaults = map[string]string{
	ingest.AdapterNginx:   "127.0.0.1:9108",
	ingest.AdapterHAProxy: "127.0.0.1:9110",
}

// runIngest is `fleetwatch ingest nginx|haproxy`: it follows the access log
// file and/or receives syslog as the config's ingest.<proxy> block and the
// flags say, and publishes one outcome event per upstream attempt
// (internal/ingest, docs/INTEGRATIONS.md).
func runIngest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != ingest.AdapterNginx && args[0] != ingest.AdapterHAProxy) {
		fmt.Fprintln(stderr, "usage: fleetwatch ingest nginx|haproxy [flags]")
		return errUsage
	}
	proxy := args[0]
	fs := flag.NewFlagSet("ingest "+proxy, flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	file := fs.String("file", "", "access log file to follow (overrides ingest."+proxy+".file)")
	offsetFile := fs.String("offset-file", "", "where the read offset is kept (overrides ingest."+proxy+".offset_file)")
	syslogAddr := fs.String("syslog", "", "UDP host:port to receive syslog on (overrides ingest."+proxy+".syslog_listen)")
	fromStart := fs.Bool("from-start", false, "read a file without a saved offset from its start (default: from its end)")
	httpAddr := fs.String("http", ingestHTTPDefaults[proxy], "listen address for /metrics and /healthz; empty: none")
	poll := fs.Duration("poll", 250*time.Millisecond, "how often the file is checked")
	data := fs.String("data", "", "data directory, for the default offset file (default the config's data, ./data)")
	if err := parseFlags(fs, args[1:], stderr); err != nil {
		return err
	}
	cfg, err := nf.loadConfig()
	if err != nil {
		return err
	}
	override(&cfg.Data, *data)
	ls := cfg.LogIngestSettings(proxy)
	override(&ls.Run.File, *file)
	override(&ls.Run.Tail.OffsetFile, *offsetFile)
	override(&ls.SyslogListen, *syslogAddr)
	if ls.Run.File != "" {
		// Before anything is read: an offset that cannot be saved would
		// otherwise stop the adapter after its first batch.
		if err := ingest.PrepareOffsetFile(ls.Run.Tail.OffsetFile); err != nil {
			return err
		}
	}
	logf := logTo(stderr, "ingest "+proxy+": ")
	nc, err := nf.connectURL("fleetwatch-ingest-"+proxy, cfg.NATS.URL, logf)
	if err != nil {
		return err
	}
	defer func() {
		nc.FlushTimeout(5 * time.Second) // what syslog lines published is sent before exit
		nc.Close()
	}()

	set := metrics.NewSet()
	lset := ls.Ingester
	lset.Emitter = ingest.NewEmitter(nc, ls.Emitter)
	lset.Metrics = ingest.NewMetrics(set, proxy)
	in, err := ingest.NewLogIngester(lset)
	if err != nil {
		return err
	}
	rs := ls.Run
	rs.Ingester, rs.Logf = in, logf
	rs.Tail.FromStart, rs.Tail.Poll = *fromStart, *poll
	if ls.SyslogListen != "" {
		if rs.Syslog, err = ingest.ListenSyslog(ls.SyslogListen); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ingest %s: syslog on udp://%s\n", proxy, rs.Syslog.LocalAddr())
	}
	if *httpAddr != "" {
		stop, err := serveMetrics(*httpAddr, set, stdout, "ingest "+proxy)
		if err != nil {
			if rs.Syslog != nil {
				rs.Syslog.Close()
			}
			return err
		}
		defer stop()
	}
	if rs.File != "" {
		fmt.Fprintf(stdout, "ingest %s: following %s (offset in %s)\n", proxy, rs.File, rs.Tail.OffsetFile)
	}
	return ingest.RunLog(ctx, rs)
}

func override(dst *string, flagValue string) {
	if flagValue != "" {
		*dst = flagValue
	}
}

// serveMetrics serves /metrics and /healthz on addr until stop; label
// starts its lines ("ingest nginx: metrics on http://...").
func serveMetrics(addr string, set *metrics.Set, stdout io.Writer, label string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		set.WritePrometheus(w)
		metrics.WriteProcessMetrics(w)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stdout, "%s: http: %v\n", label, err)
		}
	}()
	fmt.Fprintf(stdout, "%s: metrics on http://%s/metrics\n", label, ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
