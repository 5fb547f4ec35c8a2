package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/config"
)

// natsFlags are the flags common to every subcommand that talks to NATS.
type natsFlags struct {
	url        string
	creds      string
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
	fs.StringVar(&f.creds, "creds", "", "NATS credentials file")
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
// TLS.
func (f *natsFlags) options() ([]nats.Option, error) {
	var opts []nats.Option
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
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
// options. With RetryOnFailedConnect it returns at once even when the
// server is not up yet; nats.go keeps trying in the background.
func (f *natsFlags) connectURL(name, url string, logf func(string, ...any)) (*nats.Conn, error) {
	if url == "" {
		url = nats.DefaultURL
	}
	opts, err := f.clientOptions(name, logf)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect %s: %w", url, err)
	}
	return nc, nil
}
