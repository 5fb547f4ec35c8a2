package config

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fleetwatch/fleetwatch/internal/alert"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
)

// TestIngestHTTPSettings: the ingest block reaches serve's HTTP adapters;
// unset, everything is the adapters' default and the source is
// fleetwatch-ingest.
func TestIngestHTTPSettings(t *testing.T) {
	c := mustParse(t, `
prefix: acme
pools:
  - id: chat
    backends:
      - id: a
        url: http://10.0.0.5:8000/v1
ingest:
  max_body_bytes: 1024
  source: edge
  only_listed: true
  upstreams:
    - match: litellm-b
      pool: chat
      backend: b
  litellm: {pool_field: model, backend_field: model_id}
  otlp:
    pool_attribute: p
    backend_attribute: b
    ttft_attributes: [t]
    ttft_events: [first]
`)
	got := c.IngestHTTPSettings()
	want := ingest.HTTPSettings{
		MaxBody: 1024,
		LiteLLM: ingest.LiteLLMSettings{PoolField: "model", BackendField: "model_id"},
		OTLP:    ingest.OTLPSettings{PoolAttribute: "p", BackendAttribute: "b", TTFTAttributes: []string{"t"}, TTFTEvents: []string{"first"}},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(ingest.HTTPSettings{}, "Mapping")); diff != "" {
		t.Errorf("HTTP settings (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ upstream, pool, backend, skip string }{
		{"10.0.0.5:8000", "chat", "a", ""},           // a configured backend's host:port
		{"http://10.0.0.5:8000", "chat", "a", ""},    // its URL without /v1
		{"litellm-b", "chat", "b", ""},               // ingest.upstreams
		{"10.9.9.9:80", "", "", ingest.SkipUnmapped}, // only_listed
	} {
		pool, backend, skip := got.Mapping.Resolve(tc.upstream, "", "")
		if pool != tc.pool || backend != tc.backend || skip != tc.skip {
			t.Errorf("Resolve(%s) = %q %q %q, want %q %q %q", tc.upstream, pool, backend, skip, tc.pool, tc.backend, tc.skip)
		}
	}
	if diff := cmp.Diff(ingest.EmitterSettings{Prefix: "acme", Source: "edge"}, c.IngestEmitterSettings("")); diff != "" {
		t.Errorf("emitter (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ingest.EmitterSettings{Prefix: "acme", Source: "edge"}, c.IngestEmitterSettings(ingest.AdapterNginx)); diff != "" {
		t.Errorf("a log adapter's emitter with ingest.source (-want +got):\n%s", diff)
	}

	d := Default()
	if diff := cmp.Diff(ingest.HTTPSettings{}, d.IngestHTTPSettings(), cmpopts.IgnoreFields(ingest.HTTPSettings{}, "Mapping")); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if pool, backend, skip := d.IngestHTTPSettings().Mapping.Resolve("10.0.0.1:80", "p", ""); pool != "p" || backend != "10.0.0.1:80" || skip != "" {
		t.Errorf("default mapping: %q %q %q, want the upstream itself", pool, backend, skip)
	}
	if pool, _, skip := d.IngestHTTPSettings().Mapping.Resolve("10.0.0.1:80", "", ""); pool != "" || skip != ingest.SkipNoPool {
		t.Errorf("no default_pool: pool %q skip %q, want skipped", pool, skip)
	}
	if got := d.IngestEmitterSettings(""); got != (ingest.EmitterSettings{Prefix: "fw", Source: DefaultIngestSource}) {
		t.Errorf("default emitter %+v", got)
	}
	if got := d.IngestEmitterSettings(ingest.AdapterHAProxy).Source; got != "fleetwatch-ingest-haproxy" {
		t.Errorf("default log source %q", got)
	}
	d.Ingest.DefaultPool = "misc"
	if pool, _, _ := d.IngestMapping().Resolve("10.0.0.1:80", "", ""); pool != "misc" {
		t.Errorf("default_pool: pool %q", pool)
	}
}

// TestLogIngestSettings: ingest.nginx and ingest.haproxy reach their own
// log adapter; the offset file defaults to <data>/ingest-<proxy>.offset.
func TestLogIngestSettings(t *testing.T) {
	c := mustParse(t, `
data: /var/lib/fw
ingest:
  nginx:
    file: /var/log/nginx/fw.log
    pool: chat
    ttft: none
  haproxy:
    offset_file: /tmp/h.offset
    syslog_listen: 127.0.0.1:5514
`)
	ignore := cmpopts.IgnoreFields(ingest.LogSettings{}, "Mapping")
	n := c.LogIngestSettings(ingest.AdapterNginx)
	want := LogIngestSettings{
		Ingester: ingest.LogSettings{Format: "nginx", Pool: "chat", NoTTFT: true},
		Emitter:  ingest.EmitterSettings{Prefix: "fw", Source: "fleetwatch-ingest-nginx"},
		Run:      ingest.LogRunSettings{File: "/var/log/nginx/fw.log", Tail: ingest.TailSettings{OffsetFile: filepath.Join("/var/lib/fw", "ingest-nginx.offset")}},
	}
	if diff := cmp.Diff(want, n, ignore); diff != "" {
		t.Errorf("nginx (-want +got):\n%s", diff)
	}
	if n.Ingester.Mapping == nil {
		t.Error("nginx: no mapping")
	}
	h := c.LogIngestSettings(ingest.AdapterHAProxy)
	want = LogIngestSettings{
		Ingester:     ingest.LogSettings{Format: "haproxy"},
		Emitter:      ingest.EmitterSettings{Prefix: "fw", Source: "fleetwatch-ingest-haproxy"},
		Run:          ingest.LogRunSettings{Tail: ingest.TailSettings{OffsetFile: "/tmp/h.offset"}},
		SyslogListen: "127.0.0.1:5514",
	}
	if diff := cmp.Diff(want, h, ignore); diff != "" {
		t.Errorf("haproxy (-want +got):\n%s", diff)
	}
	if got := Default().LogIngestSettings(ingest.AdapterHAProxy).Run.Tail.OffsetFile; got != filepath.Join("data", "ingest-haproxy.offset") {
		t.Errorf("default offset file %q", got)
	}
}

// TestAlertSettingsDefaults: without an alerts block the notifier's
// settings are zero (its defaults); durations reach it; a url_env whose
// variable is empty is an error naming the key.
func TestAlertSettingsDefaults(t *testing.T) {
	s, err := Default().AlertSettings(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(alert.Settings{}, s, cmpopts.IgnoreFields(alert.Settings{}, "HTTPClient", "Metrics", "Logf", "Now")); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	c := mustParse(t, "alerts:\n  timeout: 3s\n  receivers:\n    - url: http://a/\n    - url_env: HOOK\n")
	_, err = c.AlertSettings(func(string) string { return "" })
	var want = "alerts.receivers[1].url_env: the variable HOOK is empty or not set"
	if !errors.Is(err, alert.ErrInvalidSettings) || err.Error() != alert.ErrInvalidSettings.Error()+": "+want {
		t.Errorf("err = %v, want %s", err, want)
	}
	s, err = c.AlertSettings(func(string) string { return "http://b/" })
	if err != nil {
		t.Fatal(err)
	}
	if s.Timeout != 3*time.Second || len(s.Receivers) != 2 || s.Receivers[0].URL != "http://a/" || s.Receivers[1].URL != "http://b/" {
		t.Errorf("settings %+v", s)
	}
}

// TestHAProxySettings: the ingest.upstreams entries whose match is
// "backend/server" name the HAProxy backend of a pool and the server of a
// backend; others are not HAProxy's.
func TestHAProxySettings(t *testing.T) {
	c := mustParse(t, `
prefix: acme
ingest:
  upstreams:
    - {match: be_chat/srv1, pool: chat, backend: a}
    - {match: be_chat/srv2, pool: chat}
    - {match: 10.0.0.5:8000, pool: chat, backend: b}
    - {match: http://host/v1, pool: chat, backend: c}
    - {match: be_x/srv/y, pool: x, backend: d}
    - {match: be_none/srv3, backend: e}
`)
	want := haproxyctl.ControllerSettings{
		Prefix: "acme",
		Mapping: haproxyctl.Settings{
			Backends: map[string]string{"chat": "be_chat"},
			Servers:  map[string]string{"chat/a": "srv1"},
		},
	}
	if diff := cmp.Diff(want, c.HAProxySettings()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	want = haproxyctl.ControllerSettings{Prefix: "fw", Mapping: haproxyctl.Settings{Backends: map[string]string{}, Servers: map[string]string{}}}
	if diff := cmp.Diff(want, Default().HAProxySettings()); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

// TestNATSServerSettings: the embedded server listens on nats.listen
// (default 127.0.0.1:4222) with its store in nats.store_dir (default
// <data>/nats).
func TestNATSServerSettings(t *testing.T) {
	want := natsrv.Settings{Listen: "127.0.0.1:4222", StoreDir: filepath.Join("data", "nats"), ServerName: "fleetwatch"}
	if diff := cmp.Diff(want, Default().NATSServerSettings(), cmpopts.IgnoreFields(natsrv.Settings{}, "Logf")); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	c := mustParse(t, "data: /srv/fw\nnats:\n  listen: 127.0.0.1:14222\n  no_jetstream: true\n")
	want = natsrv.Settings{Listen: "127.0.0.1:14222", StoreDir: filepath.Join("/srv/fw", "nats"), NoJetStream: true, ServerName: "fleetwatch"}
	if diff := cmp.Diff(want, c.NATSServerSettings(), cmpopts.IgnoreFields(natsrv.Settings{}, "Logf")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	c = mustParse(t, "nats:\n  store_dir: /nats\n")
	if got := c.NATSServerSettings().StoreDir; got != "/nats" {
		t.Errorf("store_dir: %q", got)
	}
}
