package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/config"
)

// natsFlags are the flags common to every subcommand that talks to NATS.
type natsFlags struct {
	url        string
	creds      string
	nkey       string
	user       string
	password   string
	tlsCA      string
	tlsCert    string
	tlsKey     string
	prefix     string
	configFile string
}

func (f *natsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "nats", "", "NATS server URL(s), comma separated (serve: empty starts an embedded server)")
	fs.StringVar(&f.creds, "creds", "", "NATS credentials file (user JWT and nkey seed)")
	fs.StringVar(&f.nkey, "nkey", "", "NATS nkey seed file (a user seed, SU...)")
	fs.StringVar(&f.user, "user", os.Getenv("NATS_USER"), "NATS user (default $NATS_USER)")
	fs.StringVar(&f.password, "password", os.Getenv("NATS_PASSWORD"), "NATS password (default $NATS_PASSWORD)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA certificate to verify the NATS server")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate for NATS TLS")
	fs.StringVar(&f.tlsKey, "tls-key", "", "client key for NATS TLS")
	fs.StringVar(&f.prefix, "prefix", "", "subject prefix (default \"fw\", or the config file's)")
	fs.StringVar(&f.configFile, "config", "", "YAML configuration file")
}

// loadConfig loads the --config file and applies the flags that override it.
func (f *natsFlags) loadConfig() (*config.Config, error) {
	cfg, err := config.Load(f.configFile)
	if err != nil {
		return nil, err
	}
	if f.prefix != "" {
		if err := fleetwatch.ValidatePrefix(f.prefix); err != nil {
			return nil, fmt.Errorf("--prefix: %w", err)
		}
		cfg.Prefix = f.prefix
	}
	if f.url != "" {
		cfg.NATS.URL = f.url
	}
	return cfg, nil
}

// options returns the nats.go options for the flags' authentication and
// TLS. The files they name must exist.
func (f *natsFlags) options() ([]nats.Option, error) {
	for _, file := range []struct{ flag, path string }{
		{"--creds", f.creds}, {"--nkey", f.nkey}, {"--tls-ca", f.tlsCA}, {"--tls-cert", f.tlsCert}, {"--tls-key", f.tlsKey},
	} {
		if file.path == "" {
			continue
		}
		if _, err := os.Stat(file.path); err != nil {
			return nil, fmt.Errorf("%s: %w", file.flag, err)
		}
	}
	if f.creds != "" && f.nkey != "" {
		return nil, errors.New("--creds and --nkey exclude each other (a creds file holds its own nkey seed)")
	}
	var opts []nats.Option
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	if f.nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(f.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %s: %w", f.nkey, err)
		}
		opts = append(opts, opt)
	}
	if f.user != "" || f.password != "" {
		opts = append(opts, nats.UserInfo(f.user, f.password))
	}
	if f.tlsCA != "" {
		opts = append(opts, nats.RootCAs(f.tlsCA))
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.tlsCert != "" {
		opts = append(opts, nats.ClientCert(f.tlsCert, f.tlsKey))
	}
	return opts, nil
}

// clientOptions are options plus reconnecting forever (a dead connection
// is retried; routers keep serving on the last decisions meanwhile).
func (f *natsFlags) clientOptions(name string, logf func(string, ...any)) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(10 * time.Second),
	}
	if logf != nil {
		opts = append(opts,
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					logf("nats: disconnected: %v", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) { logf("nats: reconnected to %s", nc.ConnectedUrlRedacted()) }),
		)
	}
	auth, err := f.options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	return opts, nil
}

// connectURL dials url (nats.DefaultURL when empty) with the flags'
// options. A TLS or authentication problem fails at once (connectProblem);
// a server that cannot be reached yet does not: nats.go keeps trying in
// the background (RetryOnFailedConnect) and connectURL returns at once.
func (f *natsFlags) connectURL(name, url string, logf func(string, ...any)) (*nats.Conn, error) {
	if url == "" {
		url = nats.DefaultURL
	}
	opts, err := f.clientOptions(name, logf)
	if err != nil {
		return nil, err
	}
	// One attempt without retrying, to see why it fails.
	nc, err := nats.Connect(url, append(slices.Clone(opts), nats.RetryOnFailedConnect(false))...)
	if err == nil {
		return nc, nil
	}
	if problem := connectProblem(url, err); problem != nil {
		return nil, problem
	}
	if nc, err = nats.Connect(url, opts...); err != nil {
		return nil, fmt.Errorf("nats: connect %s: %w", url, err)
	}
	return nc, nil
}

// check connects to url once with the flags' options and reports a TLS or
// authentication problem (connectProblem); an unreachable server is not
// one. serve calls it before New, whose connection retries forever.
func (f *natsFlags) check(url string) error {
	opts, err := f.options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name("fleetwatch check"), nats.RetryOnFailedConnect(false))...)
	if err != nil {
		return connectProblem(url, err)
	}
	nc.Close()
	return nil
}

// connectProblem turns a failed first connection into an error naming url
// and what to check, when retrying cannot help: the TLS handshake failed
// or the server refused the credentials. It returns nil for the others (a
// server that is down or unreachable may come up).
func connectProblem(url string, err error) error {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		alert   tls.AlertError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host):
		return fmt.Errorf("nats: connect %s: TLS: the server's certificate does not verify (check --tls-ca, and that the certificate names this host): %w", url, err)
	case errors.Is(err, nats.ErrTLS), errors.As(err, &alert), strings.Contains(err.Error(), "remote error: tls:"):
		// The server closed the handshake: most often it wants a client
		// certificate signed by a CA it trusts.
		return fmt.Errorf("nats: connect %s: TLS: the handshake failed (does the server require a client certificate? check --tls-cert and --tls-key): %w", url, err)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fmt.Errorf("nats: connect %s: TLS: the server requires TLS (use a tls:// URL, --tls-ca): %w", url, err)
	case errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Errorf("nats: connect %s: TLS: the server does not offer TLS: %w", url, err)
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return fmt.Errorf("nats: connect %s: authentication refused (check --user/--password, --creds or --nkey): %w", url, err)
	}
	return nil
}
