// Package natsrv runs an embedded NATS server (nats-server/v2) inside the
// fleetwatch process, so that `fleetwatch serve` and `fleetwatch demo` work on
// a fresh machine with nothing else installed, and so that tests talk to a
// real server. It is wiring only: it chooses options, starts the server, waits
// until it accepts clients and shuts it down.
package natsrv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrNotReady is returned by Start when the server did not accept
// connections in time.
var ErrNotReady = errors.New("natsrv: server not ready for connections")

// readyTimeout bounds how long Start waits for the server to accept clients.
const readyTimeout = 10 * time.Second

// Settings configures an embedded server. The zero value starts a server on a
// random loopback port with JetStream in a temporary directory.
type Settings struct {
	// Listen is the client listener as host:port. A port of -1 (or 0) picks
	// a random free port. If empty, "127.0.0.1:-1" is used; production
	// callers pass the configured address (DESIGN.md: 127.0.0.1:4222).
	Listen string
	// StoreDir is the JetStream store directory. If empty (and JetStream is
	// on), a temporary directory is created and removed by Shutdown.
	StoreDir string
	// NoJetStream turns JetStream off: core NATS only.
	NoJetStream bool
	// ServerName names the server in its INFO and in JetStream metadata.
	// If empty, "fleetwatch" is used.
	ServerName string
	// Logf, when set, receives the server's notices, warnings and errors.
	// If nil the server logs nothing.
	Logf func(format string, args ...any)
	// Debug also forwards the server's debug lines to Logf.
	Debug bool
	// Cluster, when set, makes the server a node of a NATS cluster (see
	// StartCluster). If nil, the server is standalone.
	Cluster *ClusterNode
}

// ClusterNode is a server's part of a cluster: the cluster's name, the
// address its route listener binds (host:port) and the routes to the other
// nodes ("nats-route://host:port").
type ClusterNode struct {
	Name   string
	Listen string
	Routes []string
}

// Server is a running embedded NATS server.
type Server struct {
	srv     *server.Server
	tempDir string // removed by Shutdown; "" when the caller owns the store

	shutdownOnce sync.Once
}

// Start starts an embedded server and waits until it accepts connections.
func Start(s Settings) (*Server, error) {
	opts, tempDir, err := options(s)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		removeTemp(tempDir)
		return nil, fmt.Errorf("natsrv: %w", err)
	}
	if s.Logf != nil {
		ns.SetLogger(logfLogger{s.Logf}, s.Debug, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		removeTemp(tempDir)
		return nil, ErrNotReady
	}
	return &Server{srv: ns, tempDir: tempDir}, nil
}

// options turns Settings into nats-server options, creating a temporary
// store directory when JetStream is on without one.
func options(s Settings) (*server.Options, string, error) {
	listen := s.Listen
	if listen == "" {
		listen = "127.0.0.1:-1"
	}
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, "", fmt.Errorf("natsrv: listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < -1 || port > 65535 {
		return nil, "", fmt.Errorf("natsrv: listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := s.ServerName
	if name == "" {
		name = "fleetwatch"
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		NoLog:      s.Logf == nil,
		NoSigs:     true, // the fleetwatch process owns signal handling
		// The collector raises its own pending limits; a larger server-side
		// payload limit is not needed (NDJSON batches stay below 1 MiB).
		MaxPayload: server.MAX_PAYLOAD_SIZE,
	}
	if c := s.Cluster; c != nil {
		chost, cport, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return nil, "", fmt.Errorf("natsrv: cluster listen %q: %w", c.Listen, err)
		}
		opts.Cluster.Name = c.Name
		opts.Cluster.Host = chost
		if opts.Cluster.Port, err = strconv.Atoi(cport); err != nil {
			return nil, "", fmt.Errorf("natsrv: cluster listen %q: bad port", c.Listen)
		}
		if len(c.Routes) > 0 {
			opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
		}
	}
	var tempDir string
	if !s.NoJetStream {
		opts.JetStream = true
		opts.StoreDir = s.StoreDir
		if opts.StoreDir == "" {
			tempDir, err = os.MkdirTemp("", "fleetwatch-nats-")
			if err != nil {
				return nil, "", fmt.Errorf("natsrv: %w", err)
			}
			opts.StoreDir = tempDir
		}
	}
	return opts, tempDir, nil
}

// ClientURL is the URL clients connect to (nats://127.0.0.1:port).
func (s *Server) ClientURL() string { return s.srv.ClientURL() }

// JetStream reports whether JetStream is enabled.
func (s *Server) JetStream() bool { return s.srv.JetStreamEnabled() }

// NATS returns the underlying server, for callers (tests, the demo) that
// need more than this package offers.
func (s *Server) NATS() *server.Server { return s.srv }

// Shutdown stops the server, waits until it is down and removes a temporary
// store. It is safe to call more than once.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		removeTemp(s.tempDir)
	})
}

func removeTemp(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// logfLogger adapts a printf-style function to nats-server's Logger.
type logfLogger struct {
	logf func(format string, args ...any)
}

func (l logfLogger) Noticef(format string, v ...any) { l.logf("nats: "+format, v...) }
func (l logfLogger) Warnf(format string, v ...any)   { l.logf("nats: warning: "+format, v...) }
func (l logfLogger) Fatalf(format string, v ...any)  { l.logf("nats: fatal: "+format, v...) }
func (l logfLogger) Errorf(format string, v ...any)  { l.logf("nats: error: "+format, v...) }
func (l logfLogger) Debugf(format string, v ...any)  { l.logf("nats: debug: "+format, v...) }
func (l logfLogger) Tracef(format string, v ...any)  { l.logf("nats: trace: "+format, v...) }
