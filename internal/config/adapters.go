package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/alert"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

// The mapping to the leaf adapters' settings: the ingest adapters (serve's
// HTTP endpoints and `fleetwatch ingest nginx|haproxy`), the notifier, the
// HAProxy driver and the embedded NATS server. Like mapping.go it sets
// what the file says and leaves the rest zero (the adapter's default);
// the adapters check the values. The caller adds its wiring (connections,
// metrics, clocks, logs) and applies its flags on top.

// DefaultIngestSource is the source of the events the ingest adapters
// publish when ingest.source is not set; `fleetwatch ingest <proxy>`
// appends "-<proxy>".
const DefaultIngestSource = "fleetwatch-ingest"

// IngestMapping is the adapters' upstream mapping (IngestUpstreams:
// configured backends' URLs, then ingest.upstreams), with
// ingest.only_listed and ingest.default_pool.
func (c *Config) IngestMapping() *ingest.Mapping {
	var entries []ingest.Upstream
	for _, u := range c.IngestUpstreams() {
		entries = append(entries, ingest.Upstream{Match: u.Match, Pool: u.Pool, Backend: u.Backend})
	}
	return ingest.NewMapping(entries, c.Ingest.OnlyListed, c.Ingest.DefaultPool)
}

// IngestEmitterSettings is the emitter's settings for the events of
// adapter: the prefix and ingest.source, by default DefaultIngestSource
// for serve's HTTP adapters (adapter "") and DefaultIngestSource-<adapter>
// for a log adapter (nginx, haproxy).
func (c *Config) IngestEmitterSettings(adapter string) ingest.EmitterSettings {
	source := c.Ingest.Source
	if source == "" {
		source = DefaultIngestSource
		if adapter != "" {
			source += "-" + adapter
		}
	}
	return ingest.EmitterSettings{Prefix: c.Prefix, Source: source}
}

// IngestHTTPSettings is the file's part of serve's HTTP ingest adapters
// (POST /v1/outcomes, /v1/ingest/litellm, /v1/traces): the mapping, the
// body bound and the LiteLLM and OTLP field names. The caller adds the
// emitter (IngestEmitterSettings("")) and the metrics.
func (c *Config) IngestHTTPSettings() ingest.HTTPSettings {
	in := c.Ingest
	return ingest.HTTPSettings{
		Mapping: c.IngestMapping(),
		MaxBody: in.MaxBodyBytes,
		LiteLLM: ingest.LiteLLMSettings{PoolField: in.LiteLLM.PoolField, BackendField: in.LiteLLM.BackendField},
		OTLP: ingest.OTLPSettings{
			PoolAttribute: in.OTLP.PoolAttribute, BackendAttribute: in.OTLP.BackendAttribute,
			TTFTAttributes: in.OTLP.TTFTAttributes, TTFTEvents: in.OTLP.TTFTEvents,
		},
	}
}

// LogIngestSettings is the file's part of `fleetwatch ingest <proxy>`.
type LogIngestSettings struct {
	// Ingester has the format, the pool, ttft and the mapping; the caller
	// adds the emitter (Emitter) and the metrics.
	Ingester ingest.LogSettings
	Emitter  ingest.EmitterSettings
	// Run has the file to follow and its offset file (default
	// <data>/ingest-<proxy>.offset); the caller adds the ingester, the
	// syslog socket, the tail's start and poll, and the log.
	Run ingest.LogRunSettings
	// SyslogListen is the UDP address to receive syslog on; empty: none.
	SyslogListen string
}

// LogIngestSettings maps the ingest.<proxy> block (proxy is
// ingest.AdapterNginx or ingest.AdapterHAProxy) for the log adapter.
func (c *Config) LogIngestSettings(proxy string) LogIngestSettings {
	lc := c.Ingest.Nginx
	if proxy == ingest.AdapterHAProxy {
		lc = c.Ingest.HAProxy
	}
	offset := lc.OffsetFile
	if offset == "" {
		offset = filepath.Join(c.Data, "ingest-"+proxy+".offset")
	}
	return LogIngestSettings{
		Ingester:     ingest.LogSettings{Format: proxy, Pool: lc.Pool, NoTTFT: lc.TTFT == "none", Mapping: c.IngestMapping()},
		Emitter:      c.IngestEmitterSettings(proxy),
		Run:          ingest.LogRunSettings{File: lc.File, Tail: ingest.TailSettings{OffsetFile: offset}},
		SyslogListen: lc.SyslogListen,
	}
}

// AlertSettings maps the alerts block to the notifier's settings; getenv
// reads the URLs and tokens the file names by variable. A variable named
// for a URL that is empty is an error (alert.ErrInvalidSettings) naming
// the key. The caller adds the metrics and the log.
func (c *Config) AlertSettings(getenv func(string) string) (alert.Settings, error) {
	a := c.Alerts
	s := alert.Settings{
		QueueSize: a.QueueSize, RateLimit: a.RateLimit, Burst: a.Burst,
		MaxAttempts: a.MaxAttempts, ExternalURL: a.ExternalURL,
	}
	for _, d := range []struct {
		dst *time.Duration
		v   *Duration
	}{{&s.Timeout, a.Timeout}, {&s.Backoff, a.Backoff}, {&s.ResendInterval, a.ResendInterval}} {
		if d.v != nil {
			*d.dst = d.v.Duration
		}
	}
	for i, r := range a.Receivers {
		rc := alert.Receiver{Name: r.Name, Kind: alert.Kind(r.Kind), URL: r.ReceiverURL(getenv)}
		if rc.URL == "" && r.URLEnv != "" {
			return s, fmt.Errorf("%w: alerts.receivers[%d].url_env: the variable %s is empty or not set", alert.ErrInvalidSettings, i, r.URLEnv)
		}
		if r.BearerTokenEnv != "" {
			rc.BearerToken = getenv(r.BearerTokenEnv)
		}
		for _, e := range r.Events {
			rc.Events = append(rc.Events, alert.Event(e))
		}
		s.Receivers = append(s.Receivers, rc)
	}
	return s, nil
}

// HAProxySettings is the file's part of `fleetwatch haproxy`: the prefix,
// and the pool -> HAProxy backend and backend -> server names read from
// the ingest.upstreams entries whose match is "backend/server" (the same
// entries `fleetwatch ingest haproxy` uses the other way round). The
// caller adds the runtime API, Mapping.Drain, the interval, the metrics
// and the log.
func (c *Config) HAProxySettings() haproxyctl.ControllerSettings {
	m := haproxyctl.Settings{Backends: map[string]string{}, Servers: map[string]string{}}
	for _, u := range c.Ingest.Upstreams {
		be, srv, ok := strings.Cut(u.Match, "/")
		if !ok || strings.Contains(u.Match, "://") || strings.Contains(srv, "/") || u.Pool == "" {
			continue
		}
		m.Backends[u.Pool] = be
		if u.Backend != "" {
			m.Servers[u.Pool+"/"+u.Backend] = srv
		}
	}
	return haproxyctl.ControllerSettings{Mapping: m, Prefix: c.Prefix}
}

// NATSServerSettings is the embedded NATS server serve starts when
// nats.url is not set: nats.listen, the store (StoreDir) and JetStream or
// not, named "fleetwatch". The caller adds the log.
func (c *Config) NATSServerSettings() natsrv.Settings {
	return natsrv.Settings{
		Listen:      c.NATS.Listen,
		StoreDir:    c.StoreDir(),
		NoJetStream: c.NATS.NoJetStream,
		ServerName:  "fleetwatch",
	}
}
