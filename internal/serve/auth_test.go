package serve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// usersFile writes an htpasswd file with one bcrypt line per user
// (password = "pw-" + user), in the $2y$ form `htpasswd -B` writes.
func usersFile(t *testing.T, users ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# fleetwatch status page users\n\n")
	for _, u := range users {
		h, err := bcrypt.GenerateFromPassword([]byte("pw-"+u), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%s\n", u, strings.Replace(string(h), "$2a$", "$2y$", 1))
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsClient trusts only the CA file ca.
func tlsClient(t *testing.T, ca string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no CA certificate in", ca)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type cred struct {
	bearer     string
	user, pass string
}

func get(t *testing.T, c *http.Client, url string, cr cred) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cr.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+cr.bearer)
	}
	if cr.user != "" {
		req.SetBasicAuth(cr.user, cr.pass)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header
}

// TestHTTPAuthTLS runs serve with a bearer token, a users file and TLS on
// a real socket, and checks every endpoint with and without credentials.
func TestHTTPAuthTLS(t *testing.T) {
	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	users := usersFile(t, "alice", "bob")
	yaml := fmt.Sprintf("probes:\n  disabled: true\nhttp:\n  bearer_token_env: FW_TEST_TOKEN\n  basic_users_file: %s\n  tls_cert: %s\n  tls_key: %s\n",
		users, pki.ServerCert, pki.ServerKey)
	getenv := func(k string) string {
		if k == "FW_TEST_TOKEN" {
			return "s3cret-token"
		}
		return ""
	}
	r := startServer(t, yaml, Options{Getenv: getenv})
	base := r.HTTPURL()
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("HTTPURL %s: want https", base)
	}
	c := tlsClient(t, pki.CA)

	none := cred{}
	good := []cred{{bearer: "s3cret-token"}, {user: "alice", pass: "pw-alice"}, {user: "bob", pass: "pw-bob"}}
	bad := []cred{
		none,
		{bearer: "s3cret-tokeN"},
		{bearer: "s3cret-token-and-more"},
		{bearer: ""},
		{user: "alice", pass: "pw-bob"},
		{user: "carol", pass: "pw-carol"},
		{user: "alice", pass: ""},
	}
	for _, path := range []string{"/", "/metrics", "/api/decisions", "/api/status", "/assets/app.js"} {
		for _, cr := range bad {
			code, h := get(t, c, base+path, cr)
			if code != http.StatusUnauthorized {
				t.Errorf("GET %s with %+v: %d, want 401", path, cr, code)
			}
			if ch := strings.Join(h.Values("WWW-Authenticate"), ", "); !strings.Contains(ch, "Basic realm=") || !strings.Contains(ch, "Bearer") {
				t.Errorf("GET %s: WWW-Authenticate %q, want Basic and Bearer challenges", path, ch)
			}
		}
		for _, cr := range good {
			// /assets/app.js may not exist under that name; any answer but 401 shows the check passed.
			if code, _ := get(t, c, base+path, cr); code == http.StatusUnauthorized || (path != "/assets/app.js" && code != http.StatusOK) {
				t.Errorf("GET %s with %+v: %d, want 200", path, cr, code)
			}
		}
	}
	// Twice with the same password: the second is answered from the
	// verified digest; a wrong one after it is still refused.
	for range 2 {
		if code, _ := get(t, c, base+"/metrics", cred{user: "alice", pass: "pw-alice"}); code != http.StatusOK {
			t.Errorf("repeated basic auth: %d", code)
		}
	}
	if code, _ := get(t, c, base+"/metrics", cred{user: "alice", pass: "pw-alicE"}); code != http.StatusUnauthorized {
		t.Errorf("wrong password after a good one: %d, want 401", code)
	}
	if code, _ := get(t, c, base+"/healthz", none); code != http.StatusOK {
		t.Errorf("GET /healthz without credentials: %d, want 200 (load balancers)", code)
	}

	// Plain HTTP to the TLS port is not served, and a client that does not
	// trust the CA refuses the server.
	if code, _ := get(t, http.DefaultClient, "http://"+r.HTTPAddr()+"/healthz", none); code != http.StatusBadRequest {
		t.Errorf("plain HTTP to the TLS listener: %d, want 400", code)
	}
	other := testkit.NewPKI(t, "other-ca")
	if _, err := tlsClient(t, other.CA).Get(base + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client trusting another CA: err = %v, want a certificate error", err)
	}
}

// TestHTTPBearerOnly: with only a bearer token, basic credentials are
// refused and the challenge is Bearer's.
func TestHTTPBearerOnly(t *testing.T) {
	r := startServer(t, "probes:\n  disabled: true\nhttp:\n  bearer_token_env: TOKEN\n", Options{Getenv: func(string) string { return "tok" }})
	c := http.DefaultClient
	if code, h := get(t, c, r.httpURL+"/api/decisions", cred{user: "tok", pass: "tok"}); code != http.StatusUnauthorized || h.Get("WWW-Authenticate") != `Bearer realm="fleetwatch"` {
		t.Errorf("basic against bearer-only: %d %q", code, h.Get("WWW-Authenticate"))
	}
	if code, _ := get(t, c, r.httpURL+"/api/decisions", cred{bearer: "tok"}); code != http.StatusOK {
		t.Errorf("bearer: %d", code)
	}
}

// TestHTTPNoAuth: without authentication configured everything is open,
// as before.
func TestHTTPNoAuth(t *testing.T) {
	r := startServer(t, "probes:\n  disabled: true\n", Options{})
	for _, path := range []string{"/", "/metrics", "/api/decisions", "/healthz"} {
		if code, _ := get(t, http.DefaultClient, r.httpURL+path, cred{}); code != http.StatusOK {
			t.Errorf("GET %s: %d", path, code)
		}
	}
}

// TestHTTPAuthStartupErrors: what cannot work stops New with an error
// naming the key.
func TestHTTPAuthStartupErrors(t *testing.T) {
	pki := testkit.NewPKI(t, "ca")
	dir := t.TempDir()
	md5File := filepath.Join(dir, "md5")
	os.WriteFile(md5File, []byte("alice:$apr1$abc$0123456789abcdefghijkl\n"), 0o600)
	for _, tc := range []struct {
		name, http string
		want       string
	}{
		{"token unset", "bearer_token_env: FW_UNSET_TOKEN", "http.bearer_token_env: the environment variable FW_UNSET_TOKEN is empty"},
		{"users file missing", "basic_users_file: " + filepath.Join(dir, "nope"), "http.basic_users_file"},
		{"not bcrypt", "basic_users_file: " + md5File, md5File + ":1: user \"alice\": the hash is not bcrypt"},
		{"key does not match", fmt.Sprintf("tls_cert: %s\n  tls_key: %s", pki.ServerCert, pki.ClientKey), "http.tls_cert"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("probes:\n  disabled: true\nnats:\n  listen: 127.0.0.1:-1\nhttp:\n  listen: 127.0.0.1:0\n  "+tc.http+"\n"), "t.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg.Data = t.TempDir()
			s, err := New(cfg, Options{Getenv: func(string) string { return "" }})
			if err == nil {
				s.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseUsers(t *testing.T) {
	h, _ := bcrypt.GenerateFromPassword([]byte("x"), bcrypt.MinCost)
	for _, tc := range []struct {
		data  string
		users int
		err   string
	}{
		{"a:" + string(h) + "\n# c\n\nb:" + string(h), 2, ""},
		{"", 0, "no users"},
		{"a" + string(h), 0, "f:1: want user:bcrypt-hash"},
		{":" + string(h), 0, "f:1: want user:bcrypt-hash"},
		{"a:" + string(h) + "\na:" + string(h), 0, "f:2: user \"a\" appears twice"},
		{"a:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=", 0, "not bcrypt"},
	} {
		users, err := parseUsers([]byte(tc.data), "f")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrBadUsersFile) {
				t.Errorf("%q: err = %v, want %q", tc.data, err, tc.err)
			}
			continue
		}
		if err != nil || len(users) != tc.users {
			t.Errorf("%q: %d users, %v", tc.data, len(users), err)
		}
	}
}

func FuzzParseUsers(f *testing.F) {
	f.Add([]byte("alice:$2y$04$abcdefghijklmnopqrstuu5x5bLq2Dt5Eo2oV4w0GJ0YxF6xIxVCG\n"))
	f.Add([]byte("# only a comment\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		users, err := parseUsers(data, "f")
		if err == nil && len(users) == 0 {
			t.Error("no error and no users")
		}
		for u, h := range users {
			if u == "" || strings.Contains(u, ":") {
				t.Errorf("user %q", u)
			}
			if _, err := bcrypt.Cost(h); err != nil {
				t.Errorf("user %q: hash %q: %v", u, h, err)
			}
		}
	})
}
