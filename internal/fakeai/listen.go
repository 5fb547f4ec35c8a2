package fakeai

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// listener is the server's own HTTP listener. Behavior.Refuse closes it
// (dropping open connections, so that clients see connection refused and
// resets) and reopens it on the same address.
type listener struct {
	// mu guards the fields below; held across Listen and Close so that
	// refuse/resume are serialised.
	mu      sync.Mutex
	addr    string // fixed after the first Start
	srv     *http.Server
	closed  bool // Close was called: never listen again
	serveWG sync.WaitGroup
}

// Listen returns a new Server with settings s, listening on 127.0.0.1 on a
// free port. Close it when done.
func Listen(s Settings) (*Server, error) {
	srv := New(s)
	if err := srv.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return srv, nil
}

// Start listens on addr (host:port; port 0 picks a free one) and serves s
// there until Close. If the behavior says Refuse, the address is reserved
// but nothing listens until Refuse is cleared.
func (s *Server) Start(addr string) error {
	l := &s.lis
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addr != "" || l.closed {
		return fmt.Errorf("fakeai: start %s: already started", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("fakeai: listen: %w", err)
	}
	l.addr = ln.Addr().String()
	if s.Behavior().Refuse {
		return ln.Close()
	}
	l.serveLocked(ln, s)
	return nil
}

func (l *listener) serveLocked(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	l.srv = srv
	l.serveWG.Add(1)
	go func() { // exits when srv is closed (refuse or Close)
		defer l.serveWG.Done()
		srv.Serve(ln)
	}()
}

// setRefusing closes or reopens the listener to match refuse.
func (l *listener) setRefusing(refuse bool, h http.Handler) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addr == "" || l.closed {
		return nil
	}
	switch {
	case refuse && l.srv != nil:
		err := l.srv.Close()
		l.srv = nil
		return err
	case !refuse && l.srv == nil:
		ln, err := listenRetry(l.addr)
		if err != nil {
			return fmt.Errorf("fakeai: listen again: %w", err)
		}
		l.serveLocked(ln, h)
	}
	return nil
}

// listenRetry listens on addr, retrying briefly: the port was ours a moment
// ago and the kernel may still be releasing it.
func listenRetry(addr string) (net.Listener, error) {
	var err error
	for range 50 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, err
}

// Addr returns the host:port the server listens on (also while refusing),
// or "" when it was never started.
func (s *Server) Addr() string {
	s.lis.mu.Lock()
	defer s.lis.mu.Unlock()
	return s.lis.addr
}

// URL returns the base URL of the server ("http://127.0.0.1:port"), or ""
// when it was never started. Append "/v1" for an OpenAI client's base URL.
func (s *Server) URL() string {
	if a := s.Addr(); a != "" {
		return "http://" + a
	}
	return ""
}

// Close stops the owned listener and drops every connection (hanging
// requests see their context canceled). It is idempotent.
func (s *Server) Close() error {
	l := &s.lis
	l.mu.Lock()
	var err error
	if l.srv != nil {
		err = l.srv.Close()
		l.srv = nil
	}
	l.closed = true
	l.mu.Unlock()
	l.serveWG.Wait()
	return err
}
