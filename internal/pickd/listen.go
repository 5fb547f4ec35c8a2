package pickd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// listen listens on the gRPC address (ext_proc and health) and the HTTP
// address, keeps readiness current, and serves until ctx ends; then it
// drains: readiness off, the gRPC streams given DrainTimeout, the HTTP
// server shut down.
func (d *Daemon) listen(ctx context.Context, nc *nats.Conn) error {
	gln, err := net.Listen("tcp", d.opts.GRPCListen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var gopts []grpc.ServerOption
	if d.opts.GRPCTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(d.opts.GRPCTLS)))
	}
	g := grpc.NewServer(gopts...)
	d.epp.Register(g)
	var hln net.Listener
	var hsrv *http.Server
	httpURL := ""
	if d.opts.HTTPListen != "-" {
		if hln, err = net.Listen("tcp", d.opts.HTTPListen); err != nil {
			gln.Close()
			return fmt.Errorf("listen: %w", err)
		}
		hsrv = &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 30 * time.Second}
		httpURL = "http://" + hln.Addr().String()
	}
	d.mu.Lock()
	d.grpcAddr, d.httpURL = gln.Addr().String(), httpURL
	d.mu.Unlock()
	if d.opts.OnListen != nil {
		d.opts.OnListen(gln.Addr().String(), httpURL)
	}

	rctx, stopReady := context.WithCancel(ctx)
	readyDone := make(chan struct{})
	go func() { // exits when stopReady is called (drain) or ctx ends
		defer close(readyDone)
		d.keepReady(rctx, nc)
	}()
	serveErr := make(chan error, 2)
	go func() { serveErr <- g.Serve(gln) }() // exits when g stops
	if hsrv != nil {
		go func() { serveErr <- hsrv.Serve(hln) }() // exits when hsrv shuts down
	}
	close(d.ready)
	var failed error
	select {
	case err := <-serveErr:
		failed = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stopReady()
	<-readyDone
	d.drain(g, hsrv)
	return failed
}

// keepReady recomputes readiness every readyEvery until ctx ends.
func (d *Daemon) keepReady(ctx context.Context, nc *nats.Conn) {
	start := time.Now()
	t := time.NewTicker(readyEvery)
	defer t.Stop()
	for {
		if ready := d.isReady(nc, start, time.Now()); ready != d.epp.Ready() {
			d.epp.SetReady(ready)
			d.opts.Logf("epp: ready %v", ready)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drain ends the listeners: readiness off first (the data planes' health
// checks stop sending new streams), then the gRPC streams get
// DrainTimeout to finish before they are cut, and the HTTP server shuts
// down.
func (d *Daemon) drain(g *grpc.Server, hsrv *http.Server) {
	d.epp.SetReady(false)
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }() // exits when the streams end or Stop cuts them
	timer := time.NewTimer(d.opts.DrainTimeout)
	select {
	case <-stopped:
	case <-timer.C:
		g.Stop()
		<-stopped
	}
	timer.Stop()
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), d.opts.DrainTimeout)
		defer cancel()
		if err := hsrv.Shutdown(sctx); err != nil {
			hsrv.Close()
		}
	}
}
