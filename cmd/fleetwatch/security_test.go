package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// The password user of the secured test servers.
const secUser, secPassword = "fw", "fw-pass"

// nkeyUser is a generated user nkey: its seed file (for --nkey) and its
// public key (for the server).
type nkeyUser struct{ seedFile, public string }

func newNkeyUser(t *testing.T) nkeyUser {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(file, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return nkeyUser{seedFile: file, public: pub}
}

// startSecureEmbeddedNATS runs the embedded nats-server with JetStream on
// a random loopback port, requiring TLS with pki's server certificate
// (and, with verify, a client certificate signed by pki's CA), and
// knowing two users: secUser by password and nk by its nkey.
func startSecureEmbeddedNATS(t *testing.T, pki testkit.PKI, verify bool, nk nkeyUser) string {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, CaFile: pki.CA, Verify: verify})
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		TLS: true, TLSVerify: verify, TLSConfig: tc, TLSTimeout: 5,
		Users: []*server.User{{Username: secUser, Password: secPassword}},
		Nkeys: []*server.NkeyUser{{Nkey: nk.public}},
	}
	return runEmbeddedNATS(t, opts)
}

// startSecureDebianNATS runs Debian's nats-server binary with a
// configuration file equivalent to startSecureEmbeddedNATS with verify.
func startSecureDebianNATS(t *testing.T, pki testkit.PKI, nk nkeyUser) string {
	t.Helper()
	bin := debianNATSServer
	if _, err := os.Stat(bin); err != nil {
		bin = "/usr/bin/nats-server"
	}
	testkit.RequireTool(t, bin, "nats-server")
	conf := fmt.Sprintf(`
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 5
}
authorization {
  users: [
    { user: %q, password: %q }
    { nkey: %q }
  ]
}
`, pki.ServerCert, pki.ServerKey, pki.CA, secUser, secPassword, nk.public)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return startNATSServerProcess(t, bin, nil, "-c", path, "-js", "-sd", t.TempDir())
}

// runCmd runs one fleetwatch command in process and returns its exit code
// and output.
func runCmd(ctx context.Context, args ...string) (int, string, string) {
	var stdout, stderr syncBuffer
	code := Run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// bgCmd is a fleetwatch command running in process until its context
// ends.
type bgCmd struct {
	stdout, stderr syncBuffer
	cancel         context.CancelFunc
	done           chan int
}

func startCmd(t *testing.T, args ...string) *bgCmd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &bgCmd{cancel: cancel, done: make(chan int, 1)}
	go func() { c.done <- Run(ctx, args, &c.stdout, &c.stderr) }()
	t.Cleanup(func() {
		cancel()
		if code := <-c.done; code != 0 {
			t.Errorf("fleetwatch %s exited %d:\n%s", args[0], code, c.stderr.String())
		}
	})
	return c
}

// wait waits for re in the command's stdout and returns its first submatch.
func (c *bgCmd) wait(t *testing.T, re *regexp.Regexp, what string) string {
	t.Helper()
	var got string
	eventually(t, 60*time.Second, what, func() bool {
		select {
		case code := <-c.done:
			c.done <- code
			t.Fatalf("exited %d before %s:\n%s", code, what, c.stderr.String())
		default:
		}
		if m := re.FindStringSubmatch(c.stdout.String()); m != nil {
			got = m[1]
			return true
		}
		return false
	})
	return got
}

var serveHTTPLine = regexp.MustCompile(`HTTP on (https?://\S+)`)

// checkCommandsOverSecureNATS runs serve, watch, route, the drift commands
// and a short bench against url with the flags auth, and checks that each
// one works: serve ingests events and publishes decisions that watch and
// route receive, and the drift commands get serve's answers.
func checkCommandsOverSecureNATS(t *testing.T, url string, auth []string, clientOpts []nats.Option) {
	backend := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "b1"}))
	t.Cleanup(backend.Close)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fleetwatch.yaml")
	cfg := fmt.Sprintf("pools:\n  - id: sec-pool\n    models: [sec]\n    backends:\n      - id: b1\n        url: %s\nprobes:\n  schedule: \"@every 1h\"\n", backend.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	with := func(args ...string) []string {
		return append(append(args, "--nats", url, "--config", cfgPath), auth...)
	}

	srv := startCmd(t, with("serve", "--http", "127.0.0.1:0", "--data", filepath.Join(dir, "data"))...)
	base := srv.wait(t, serveHTTPLine, "serve's HTTP line")
	_, body := testkit.HTTPGet(t, base+"/healthz")
	var health struct{ NATS, JetStream bool }
	if err := json.Unmarshal([]byte(body), &health); err != nil || !health.NATS || !health.JetStream {
		t.Fatalf("serve /healthz %s: want NATS and JetStream", body)
	}

	// Outcome events, published with the same credentials, until the test
	// ends.
	pub, err := nats.Connect(url, clientOpts...)
	if err != nil {
		t.Fatalf("test publisher: %v", err)
	}
	t.Cleanup(pub.Close)
	stop := make(chan struct{})
	var publishing sync.WaitGroup
	publishing.Go(func() {
		for {
			ev := fmt.Sprintf(`{"v":1,"pool":"sec-pool","backend":"b1","ts":%q,"status":200,"outcome":"ok","ttft_ms":120}`, fleetwatch.FormatTime(time.Now()))
			pub.Publish(fleetwatch.Subjects{}.Outcomes()+".sec", []byte(ev))
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() { close(stop); publishing.Wait() })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, out, errOut := runCmd(ctx, with("watch", "sec-pool", "--once", "--json")...)
	var snap fleetwatch.Snapshot
	if code != 0 || json.Unmarshal([]byte(strings.Split(out, "\n")[0]), &snap) != nil || snap.Pool != "sec-pool" {
		t.Errorf("watch: exit %d, output %q, stderr:\n%s", code, out, errOut)
	}

	rt := startCmd(t, with("route", "--listen", "127.0.0.1:0", "--source", "sec-router")...)
	routeBase := rt.wait(t, routeListenLine, "route's listening line")
	eventually(t, 60*time.Second, "route to apply a decision", func() bool {
		n, _ := metricValue(t, routeBase+"/metrics", "fleetwatch_feed_snapshots_applied_total")
		return n > 0
	})
	res, err := http.Post(routeBase+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"sec","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a request through route: %s", res.Status)
	}

	code, out, errOut = runCmd(ctx, with("drift", "status", "--json")...)
	if code != 0 || !strings.Contains(out, `"b1"`) {
		t.Errorf("drift status: exit %d, output %q, stderr:\n%s", code, out, errOut)
	}
	code, out, errOut = runCmd(ctx, with("drift", "review", "--json", "--since", "1h")...)
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Errorf("drift review: exit %d, output %q, stderr:\n%s", code, out, errOut)
	}
	// serve's prober does the re-baseline and answers.
	code, out, errOut = runCmd(ctx, append(with("drift", "rebaseline", "--by", "sec-test"), "sec-pool", "b1")...)
	if code != 0 || !strings.Contains(out, "re-baseline of sec-pool/b1 done by serve") {
		t.Errorf("drift rebaseline: exit %d, output %q, stderr:\n%s", code, out, errOut)
	}
}

func secureClientOptions(pki testkit.PKI, extra ...nats.Option) []nats.Option {
	return append([]nats.Option{nats.RootCAs(pki.CA)}, extra...)
}

// TestNATSTLSAndCredentials runs every command that talks to NATS against
// servers that require TLS: with a password over server-only TLS, and with
// an nkey plus a client certificate where the server verifies client
// certificates, in the embedded server and in Debian's nats-server.
func TestNATSTLSAndCredentials(t *testing.T) {
	t.Parallel() // its own servers and processes: overlaps the rest of the package
	if testing.Short() {
		t.Skip("runs several commands end to end")
	}
	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	nk := newNkeyUser(t)
	nkeyOpt, err := nats.NkeyOptionFromSeed(nk.seedFile)
	if err != nil {
		t.Fatal(err)
	}
	clientCert := []string{"--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey}
	t.Run("embedded/tls+password", func(t *testing.T) {
		url := startSecureEmbeddedNATS(t, pki, false, nk)
		checkCommandsOverSecureNATS(t, url,
			[]string{"--tls-ca", pki.CA, "--user", secUser, "--password", secPassword},
			secureClientOptions(pki, nats.UserInfo(secUser, secPassword)))
	})
	t.Run("embedded/client-cert+nkey", func(t *testing.T) {
		url := startSecureEmbeddedNATS(t, pki, true, nk)
		checkCommandsOverSecureNATS(t, url,
			append([]string{"--tls-ca", pki.CA, "--nkey", nk.seedFile}, clientCert...),
			secureClientOptions(pki, nkeyOpt, nats.ClientCert(pki.ClientCert, pki.ClientKey)))
	})
	t.Run("debian-nats-server/client-cert+password", func(t *testing.T) {
		url := startSecureDebianNATS(t, pki, nk)
		checkCommandsOverSecureNATS(t, url,
			append([]string{"--tls-ca", pki.CA, "--user", secUser, "--password", secPassword}, clientCert...),
			secureClientOptions(pki, nats.UserInfo(secUser, secPassword), nats.ClientCert(pki.ClientCert, pki.ClientKey)))
	})
	t.Run("debian-nats-server/client-cert+nkey", func(t *testing.T) {
		url := startSecureDebianNATS(t, pki, nk)
		checkCommandsOverSecureNATS(t, url,
			append([]string{"--tls-ca", pki.CA, "--nkey", nk.seedFile}, clientCert...),
			secureClientOptions(pki, nkeyOpt, nats.ClientCert(pki.ClientCert, pki.ClientKey)))
	})
}

// TestNATSSecurityErrorsDebian: the errors of TestNATSSecurityErrors with
// Debian's nats-server and a configuration file.
func TestNATSSecurityErrorsDebian(t *testing.T) {
	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	wrong := testkit.NewPKI(t, "some-other-ca")
	nk := newNkeyUser(t)
	url := startSecureDebianNATS(t, pki, nk)
	clientCert := []string{"--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey}
	for _, tc := range []struct {
		name string
		auth []string
		want string
	}{
		{"wrong CA", append([]string{"--tls-ca", wrong.CA, "--nkey", nk.seedFile}, clientCert...), "TLS: the server's certificate does not verify"},
		{"no client certificate", []string{"--tls-ca", pki.CA, "--nkey", nk.seedFile}, "TLS: the handshake failed"},
		{"wrong password", append([]string{"--tls-ca", pki.CA, "--user", secUser, "--password", "nope"}, clientCert...), "authentication refused"},
	} {
		for _, cmd := range [][]string{{"watch", "--once"}, {"drift", "status"}, {"serve", "--http", "127.0.0.1:0", "--no-probes", "--data", t.TempDir()}} {
			code, _, errOut := runCmd(context.Background(), append(append(cmd, "--nats", url), tc.auth...)...)
			if code != 1 || !strings.Contains(errOut, "nats: connect "+url+": "+tc.want) {
				t.Errorf("%s, %s: exit %d, stderr:\n%s", tc.name, cmd[0], code, errOut)
			}
		}
	}
}

// TestNATSSecurityErrors: a wrong CA, a missing client certificate and
// refused credentials make every command fail at once with an error that
// names the server URL and what to check, instead of retrying forever.
func TestNATSSecurityErrors(t *testing.T) {
	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	wrong := testkit.NewPKI(t, "some-other-ca")
	nk := newNkeyUser(t)
	other := newNkeyUser(t)
	plainTLS := startSecureEmbeddedNATS(t, pki, false, nk)
	verifying := startSecureEmbeddedNATS(t, pki, true, nk)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fleetwatch.yaml")
	if err := os.WriteFile(cfgPath, []byte("pools:\n  - id: p\n    models: [m]\n    backends:\n      - id: b\n        url: http://127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	commands := [][]string{
		{"serve", "--http", "127.0.0.1:0", "--data", filepath.Join(dir, "data"), "--no-probes"},
		{"route", "--listen", "127.0.0.1:0"},
		{"watch", "--once"},
		{"drift", "status"},
		{"drift", "review"},
		{"drift", "rebaseline", "--by", "t"},
		{"bench", "--events", "10", "--trips", "1", "--rounds", "1"},
	}
	for _, tc := range []struct {
		name, url string
		auth      []string
		want      []string
	}{
		{"wrong CA", plainTLS, []string{"--tls-ca", wrong.CA, "--user", secUser, "--password", secPassword},
			[]string{"TLS: the server's certificate does not verify", "--tls-ca"}},
		{"system roots", plainTLS, []string{"--user", secUser, "--password", secPassword},
			[]string{"TLS: the server's certificate does not verify", "--tls-ca"}},
		{"no client certificate", verifying, []string{"--tls-ca", pki.CA, "--nkey", nk.seedFile},
			[]string{"TLS", "--tls-cert"}},
		{"wrong password", plainTLS, []string{"--tls-ca", pki.CA, "--user", secUser, "--password", "nope"},
			[]string{"authentication refused", "--user/--password"}},
		{"unknown nkey", plainTLS, []string{"--tls-ca", pki.CA, "--nkey", other.seedFile},
			[]string{"authentication refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range commands {
				if cmd[0] == "bench" && strings.Contains(tc.want[0], "TLS") {
					// bench starts its daemon (serve.New, whose connection
					// retries forever) before its own clients, which then
					// fail as above; only after serve.New's timeouts.
					continue
				}
				args := append(append(append([]string{}, cmd...), "--nats", tc.url, "--config", cfgPath), tc.auth...)
				if cmd[0] == "drift" && cmd[1] == "rebaseline" {
					args = append(args, "p", "b")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				code, _, errOut := runCmd(ctx, args...)
				cancel()
				if code != 1 {
					t.Errorf("%s: exit %d, want 1; stderr:\n%s", strings.Join(cmd, " "), code, errOut)
					continue
				}
				for _, w := range append([]string{"nats: connect " + tc.url}, tc.want...) {
					if !strings.Contains(errOut, w) {
						t.Errorf("%s: stderr does not say %q:\n%s", strings.Join(cmd, " "), w, errOut)
					}
				}
			}
		})
	}
}

// TestNATSFlagErrors: flag mistakes are reported before connecting.
func TestNATSFlagErrors(t *testing.T) {
	nk := newNkeyUser(t)
	dir := t.TempDir()
	notSeed := filepath.Join(dir, "not-a-seed")
	os.WriteFile(notSeed, []byte("hello\n"), 0o600)
	cfgPath := filepath.Join(dir, "route.yaml")
	os.WriteFile(cfgPath, []byte("pools:\n  - id: p\n    models: [m]\n    backends:\n      - id: b\n        url: http://127.0.0.1:1\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--creds", "/nonexistent/user.creds"}, "--creds: "},
		{[]string{"--tls-ca", "/nonexistent/ca.pem"}, "--tls-ca: "},
		{[]string{"--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"}, "--tls-cert: "},
		{[]string{"--nkey", notSeed}, "--nkey " + notSeed},
		{[]string{"--nkey", nk.seedFile, "--creds", nk.seedFile}, "--creds and --nkey exclude each other"},
		{[]string{"--tls-cert", nk.seedFile}, "--tls-cert and --tls-key go together"},
	} {
		for _, cmd := range []string{"watch", "route", "serve"} {
			code, _, errOut := runCmd(context.Background(), append([]string{cmd, "--nats", "nats://127.0.0.1:1", "--config", cfgPath}, tc.args...)...)
			if code != 1 || !strings.Contains(errOut, tc.want) {
				t.Errorf("%s %v: exit %d, stderr %q, want %q", cmd, tc.args, code, errOut, tc.want)
			}
		}
	}
}

// startJWTEmbeddedNATS runs the embedded nats-server in operator mode
// (decentralized JWT authentication) with TLS, and returns its URL and a
// .creds file of a user of a JetStream-enabled account.
func startJWTEmbeddedNATS(t *testing.T, pki testkit.PKI) (url, creds string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, err := okp.PublicKey()
	must(err)
	account := func(jetStream bool) (nkeys.KeyPair, string, string) {
		akp, err := nkeys.CreateAccount()
		must(err)
		apub, err := akp.PublicKey()
		must(err)
		ac := jwt.NewAccountClaims(apub)
		if jetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		must(err)
		return akp, apub, ajwt
	}
	_, sysPub, sysJWT := account(false)
	akp, apub, ajwt := account(true)
	oc := jwt.NewOperatorClaims(opub)
	oc.SystemAccount = sysPub
	ojwt, err := oc.Encode(okp)
	must(err)
	oc, err = jwt.DecodeOperatorClaims(ojwt)
	must(err)

	ukp, err := nkeys.CreateUser()
	must(err)
	upub, err := ukp.PublicKey()
	must(err)
	useed, err := ukp.Seed()
	must(err)
	uc := jwt.NewUserClaims(upub)
	ujwt, err := uc.Encode(akp)
	must(err)
	credsData, err := jwt.FormatUserConfig(ujwt, useed)
	must(err)
	creds = filepath.Join(t.TempDir(), "user.creds")
	must(os.WriteFile(creds, credsData, 0o600))

	resolver := &server.MemAccResolver{}
	must(resolver.Store(sysPub, sysJWT))
	must(resolver.Store(apub, ajwt))
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.ServerCert, KeyFile: pki.ServerKey})
	must(err)
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		TLS: true, TLSConfig: tc, TLSTimeout: 5,
		TrustedOperators: []*jwt.OperatorClaims{oc},
		AccountResolver:  resolver,
		SystemAccount:    sysPub,
	}
	ns, err := server.NewServer(opts)
	must(err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded nats-server not ready")
	}
	return ns.ClientURL(), creds
}

// TestNATSCredsFile runs the commands with a .creds file (user JWT and
// nkey seed) against a server in operator mode, over TLS; a creds file of
// another operator is refused with the authentication error.
func TestNATSCredsFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs several commands end to end")
	}
	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	url, creds := startJWTEmbeddedNATS(t, pki)
	checkCommandsOverSecureNATS(t, url,
		[]string{"--tls-ca", pki.CA, "--creds", creds},
		secureClientOptions(pki, nats.UserCredentials(creds)))

	_, strangerCreds := startJWTEmbeddedNATS(t, pki)
	code, _, errOut := runCmd(context.Background(), "drift", "status", "--nats", url, "--tls-ca", pki.CA, "--creds", strangerCreds)
	if code != 1 || !strings.Contains(errOut, "nats: connect "+url+": authentication refused") {
		t.Errorf("a creds file of another operator: exit %d, stderr:\n%s", code, errOut)
	}
}

// TestServeHTTPSecurity: serve refuses an exposed listener without
// authentication, and with a token and TLS prints its https address and
// guards everything but /healthz.
func TestServeHTTPSecurity(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := runCmd(context.Background(), "serve", "--http", "0.0.0.0:0", "--nats-listen", "127.0.0.1:-1", "--data", filepath.Join(dir, "d1"))
	if code != 1 || !strings.Contains(errOut, `http.listen: "0.0.0.0:0" is not a loopback address`) || !strings.Contains(errOut, "http.insecure: true") {
		t.Errorf("serve on 0.0.0.0 without authentication: exit %d, stderr:\n%s", code, errOut)
	}

	pki := testkit.NewPKI(t, "fleetwatch-test-ca")
	t.Setenv("FW_SEC_HTTP_TOKEN", "tok-123")
	cfgPath := filepath.Join(dir, "fleetwatch.yaml")
	cfg := fmt.Sprintf("http:\n  bearer_token_env: FW_SEC_HTTP_TOKEN\n  tls_cert: %s\n  tls_key: %s\n", pki.ServerCert, pki.ServerKey)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startCmd(t, "serve", "--config", cfgPath, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--no-probes", "--data", filepath.Join(dir, "d2"))
	base := srv.wait(t, serveHTTPLine, "serve's HTTP line")
	if !strings.HasPrefix(base, "https://127.0.0.1:") {
		t.Fatalf("serve prints %s, want an https address", base)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(pki.CA)
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", http.StatusOK},
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "tok-12", http.StatusUnauthorized},
		{"/metrics", "tok-123", http.StatusOK},
		{"/api/decisions", "tok-123", http.StatusOK},
		{"/", "", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest(http.MethodGet, base+tc.path, nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d", tc.path, tc.token, res.StatusCode, tc.want)
		}
	}
}
