package serve

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"golang.org/x/crypto/bcrypt"

	"github.com/fleetwatch/fleetwatch/internal/config"
)

// ErrBadUsersFile is returned by New when http.basic_users_file cannot be
// used; the error names the file and the line.
var ErrBadUsersFile = errors.New("serve: http.basic_users_file")

// dummyHash is compared against when the user is unknown, so that an
// unknown user takes as long to refuse as a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("fleetwatch: no such user"), bcrypt.MinCost)

// httpAuth checks the credentials of serve's HTTP API: a bearer token,
// basic authentication against an htpasswd file of bcrypt hashes, or
// either when both are configured. A nil *httpAuth lets everything
// through (no authentication configured).
type httpAuth struct {
	bearer    [sha256.Size]byte // sha256 of the token, when hasBearer
	hasBearer bool
	users     map[string][]byte // user -> bcrypt hash; nil without basic auth

	mu sync.Mutex // guards verified
	// verified holds, per user, the sha256 of the password bcrypt last
	// accepted, so that the status page polling every second does not pay
	// for a bcrypt comparison on every request.
	verified map[string][sha256.Size]byte
}

// newHTTPAuth builds the authentication of cfg; it returns nil when cfg
// configures none. getenv reads http.bearer_token_env's variable.
func newHTTPAuth(cfg config.HTTPConfig, getenv func(string) string) (*httpAuth, error) {
	if !cfg.HasAuth() {
		return nil, nil
	}
	a := &httpAuth{verified: map[string][sha256.Size]byte{}}
	if cfg.BearerTokenEnv != "" {
		token := getenv(cfg.BearerTokenEnv)
		if token == "" {
			return nil, fmt.Errorf("serve: http.bearer_token_env: the environment variable %s is empty or unset", cfg.BearerTokenEnv)
		}
		a.bearer, a.hasBearer = sha256.Sum256([]byte(token)), true
	}
	if cfg.BasicUsersFile != "" {
		users, err := readUsersFile(cfg.BasicUsersFile)
		if err != nil {
			return nil, err
		}
		a.users = users
	}
	return a, nil
}

// readUsersFile reads an htpasswd file: "user:hash" lines where hash is a
// bcrypt hash ($2a$, $2b$ or $2y$, as `htpasswd -B` writes); blank lines
// and lines starting with # are skipped.
func readUsersFile(path string) (map[string][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadUsersFile, err)
	}
	return parseUsers(data, path)
}

// parseUsers parses the htpasswd data of file (named in errors).
func parseUsers(data []byte, path string) (map[string][]byte, error) {
	users := map[string][]byte{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		if !ok || user == "" {
			return nil, fmt.Errorf("%w %s:%d: want user:bcrypt-hash", ErrBadUsersFile, path, n)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil || !strings.HasPrefix(hash, "$2") {
			return nil, fmt.Errorf("%w %s:%d: user %q: the hash is not bcrypt (make it with htpasswd -B)", ErrBadUsersFile, path, n, user)
		}
		if _, dup := users[user]; dup {
			return nil, fmt.Errorf("%w %s:%d: user %q appears twice", ErrBadUsersFile, path, n, user)
		}
		users[user] = []byte(hash)
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("%w %s: no users", ErrBadUsersFile, path)
	}
	return users, nil
}

// wrap lets /healthz (for load balancers) and authenticated requests
// through to next, and answers 401 to the others.
func (a *httpAuth) wrap(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || a.allowed(r) {
			next.ServeHTTP(w, r)
			return
		}
		if a.users != nil {
			w.Header().Add("WWW-Authenticate", `Basic realm="fleetwatch", charset="UTF-8"`)
		}
		if a.hasBearer {
			w.Header().Add("WWW-Authenticate", `Bearer realm="fleetwatch"`)
		}
		http.Error(w, "401 unauthorized: fleetwatch needs credentials (see docs/DEPLOY.md \"Security\")", http.StatusUnauthorized)
	})
}

// allowed reports whether r carries valid credentials. Secrets are
// compared in constant time (bearer tokens as sha256 digests, so that
// their length does not show either).
func (a *httpAuth) allowed(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	if scheme, token, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		if !a.hasBearer {
			return false
		}
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		return subtle.ConstantTimeCompare(got[:], a.bearer[:]) == 1
	}
	user, password, ok := r.BasicAuth()
	if !ok || a.users == nil {
		return false
	}
	return a.checkBasic(user, password)
}

func (a *httpAuth) checkBasic(user, password string) bool {
	hash, known := a.users[user]
	if !known {
		bcrypt.CompareHashAndPassword(dummyHash, []byte(password))
		return false
	}
	sum := sha256.Sum256([]byte(password))
	a.mu.Lock()
	last, seen := a.verified[user]
	a.mu.Unlock()
	if seen && subtle.ConstantTimeCompare(sum[:], last[:]) == 1 {
		return true
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil {
		return false
	}
	a.mu.Lock()
	a.verified[user] = sum
	a.mu.Unlock()
	return true
}

// listenHTTP prepares the HTTP authentication and binds http.listen, with
// TLS when http.tls_cert is set.
func (s *Server) listenHTTP() (net.Listener, error) {
	getenv := s.opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var err error
	if s.web.auth, err = newHTTPAuth(s.cfg.HTTP, getenv); err != nil {
		return nil, err
	}
	var tlsConfig *tls.Config
	if s.cfg.HTTP.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.HTTP.TLSCert, s.cfg.HTTP.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("serve: http.tls_cert %s, http.tls_key %s: %w", s.cfg.HTTP.TLSCert, s.cfg.HTTP.TLSKey, err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", s.cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("serve: http listen %s: %w", s.cfg.HTTP.Listen, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	return ln, nil
}

// HTTPURL is the base URL of the HTTP server: https://ADDR with
// http.tls_cert, else http://ADDR.
func (s *Server) HTTPURL() string {
	if s.cfg.HTTP.TLSCert != "" {
		return "https://" + s.HTTPAddr()
	}
	return "http://" + s.HTTPAddr()
}
