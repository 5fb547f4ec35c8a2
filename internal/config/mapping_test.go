package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/collector"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
	"github.com/fleetwatch/fleetwatch/probes"
)

// mapped is everything the file turns into: the components' settings, and
// the values serve reads from the file directly.
type mapped struct {
	Analyzer  analyzer.Config
	Collector collector.Settings
	Probes    probes.Settings
	Review    probes.ReviewSettings
	StoreDir  string
	Route     []route.Pool
	Scrape    ScrapeSettings
	Upstreams []UpstreamConfig // the ingest adapters' mapping
	RouteSet  route.Settings   // the route block (the router's knobs)
	Direct    map[string]any
}

// directKeys are read by serve (or route) from the Config as they are, not
// through a component's Settings; each must still exist in the file.
var directKeys = map[string]func(c *Config) any{
	"prefix":                   func(c *Config) any { return c.Prefix },
	"nats.url":                 func(c *Config) any { return c.NATS.URL },
	"nats.listen":              func(c *Config) any { return c.NATS.Listen },
	"nats.no_jetstream":        func(c *Config) any { return c.NATS.NoJetStream },
	"http.listen":              func(c *Config) any { return c.HTTP.Listen },
	"ha.partitions":            func(c *Config) any { return c.HA.Partitions }, // serve's leases
	"ha.lease_ttl":             func(c *Config) any { return c.HA.LeaseTTL },
	"ha.replicas":              func(c *Config) any { return c.HA.Replicas },         // also the collector's StreamReplicas
	"http.bearer_token_env":    func(c *Config) any { return c.HTTP.BearerTokenEnv }, // serve.New reads the variable
	"http.basic_users_file":    func(c *Config) any { return c.HTTP.BasicUsersFile },
	"http.tls_cert":            func(c *Config) any { return c.HTTP.TLSCert },
	"http.tls_key":             func(c *Config) any { return c.HTTP.TLSKey },
	"http.insecure":            func(c *Config) any { return c.HTTP.Insecure },
	"probes.disabled":          func(c *Config) any { return c.Probes.Disabled },
	"probes.suite":             func(c *Config) any { return c.Probes.Suite }, // probes.LoadSuite(name)
	"pools[0].models":          func(c *Config) any { return poolsField(c, func(p PoolConfig) any { return p.Models }) },
	"pools[0].backends[0].url": func(c *Config) any { return poolsField(c, func(p PoolConfig) any { return backendURLs(p) }) },
	"data":                     func(c *Config) any { return c.Data },
	// The ingest adapters' keys: serve and `fleetwatch ingest` read them
	// into internal/ingest's settings (serve/ingest.go, cmd's ingest.go).
	"ingest.max_body_bytes":         func(c *Config) any { return c.Ingest.MaxBodyBytes },
	"ingest.only_listed":            func(c *Config) any { return c.Ingest.OnlyListed },
	"ingest.default_pool":           func(c *Config) any { return c.Ingest.DefaultPool },
	"ingest.source":                 func(c *Config) any { return c.Ingest.Source },
	"ingest.litellm.pool_field":     func(c *Config) any { return c.Ingest.LiteLLM.PoolField },
	"ingest.litellm.backend_field":  func(c *Config) any { return c.Ingest.LiteLLM.BackendField },
	"ingest.otlp.pool_attribute":    func(c *Config) any { return c.Ingest.OTLP.PoolAttribute },
	"ingest.otlp.backend_attribute": func(c *Config) any { return c.Ingest.OTLP.BackendAttribute },
	"ingest.otlp.ttft_attributes":   func(c *Config) any { return c.Ingest.OTLP.TTFTAttributes },
	"ingest.otlp.ttft_events":       func(c *Config) any { return c.Ingest.OTLP.TTFTEvents },
	"ingest.nginx.file":             func(c *Config) any { return c.Ingest.Nginx.File },
	"ingest.nginx.offset_file":      func(c *Config) any { return c.Ingest.Nginx.OffsetFile },
	"ingest.nginx.syslog_listen":    func(c *Config) any { return c.Ingest.Nginx.SyslogListen },
	"ingest.nginx.pool":             func(c *Config) any { return c.Ingest.Nginx.Pool },
	"ingest.nginx.ttft":             func(c *Config) any { return c.Ingest.Nginx.TTFT },
	"ingest.haproxy.file":           func(c *Config) any { return c.Ingest.HAProxy.File },
	"ingest.haproxy.offset_file":    func(c *Config) any { return c.Ingest.HAProxy.OffsetFile },
	"ingest.haproxy.syslog_listen":  func(c *Config) any { return c.Ingest.HAProxy.SyslogListen },
	"ingest.haproxy.pool":           func(c *Config) any { return c.Ingest.HAProxy.Pool },
	"ingest.haproxy.ttft":           func(c *Config) any { return c.Ingest.HAProxy.TTFT },
	"pools[0].backends[0].api_key_env": func(c *Config) any {
		return poolsField(c, func(p PoolConfig) any { return p.Backends[0].APIKeyEnv })
	},
	// serve maps the alerts block to alert.Settings (internal/serve
	// TestAlertSettingsReachEveryField ties that side).
	"alerts.queue_size":                    func(c *Config) any { return c.Alerts.QueueSize },
	"alerts.rate_limit":                    func(c *Config) any { return c.Alerts.RateLimit },
	"alerts.burst":                         func(c *Config) any { return c.Alerts.Burst },
	"alerts.timeout":                       func(c *Config) any { return c.Alerts.Timeout },
	"alerts.max_attempts":                  func(c *Config) any { return c.Alerts.MaxAttempts },
	"alerts.backoff":                       func(c *Config) any { return c.Alerts.Backoff },
	"alerts.resend_interval":               func(c *Config) any { return c.Alerts.ResendInterval },
	"alerts.external_url":                  func(c *Config) any { return c.Alerts.ExternalURL },
	"alerts.receivers[0].name":             func(c *Config) any { return c.Alerts.Receivers[0].Name },
	"alerts.receivers[0].kind":             func(c *Config) any { return c.Alerts.Receivers[0].Kind },
	"alerts.receivers[0].url":              func(c *Config) any { return c.Alerts.Receivers[0].URL },
	"alerts.receivers[0].url_env":          func(c *Config) any { return c.Alerts.Receivers[0].URLEnv },
	"alerts.receivers[0].bearer_token_env": func(c *Config) any { return c.Alerts.Receivers[0].BearerTokenEnv },
	"alerts.receivers[0].events":           func(c *Config) any { return c.Alerts.Receivers[0].Events },
}

func poolsField(c *Config, f func(PoolConfig) any) any {
	if len(c.Pools) == 0 {
		return nil
	}
	return f(c.Pools[0])
}

func backendURLs(p PoolConfig) []string {
	var urls []string
	for _, b := range p.Backends {
		urls = append(urls, b.URL)
	}
	return urls
}

func mapAll(c *Config) mapped {
	env := func(name string) string { return "key-of-" + name }
	m := mapped{
		Analyzer:  c.AnalyzerSettings(1),
		Collector: c.CollectorSettings(),
		Probes:    c.ProbeSettings(env),
		Review:    c.ReviewSettings(),
		StoreDir:  c.StoreDir(),
		Route:     c.RoutePools(env, p2c.Settings{}),
		Scrape:    c.ScrapeSettings(),
		Upstreams: c.IngestUpstreams(),
		RouteSet:  c.RouteSettings(route.Settings{}),
		Direct:    map[string]any{},
	}
	for k, f := range directKeys {
		m.Direct[k] = f(c)
	}
	return m
}

// baseConfig has one pool with one backend, so that the keys below pools
// have somewhere to go.
func baseConfig() *Config {
	c := Default()
	c.Pools = []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "b", URL: "http://127.0.0.1:1"}}}}
	c.Ingest.Upstreams = []UpstreamConfig{{Match: "10.0.0.1:80"}}
	c.Alerts.Receivers = []AlertReceiverConfig{{URL: "http://127.0.0.1:2"}}
	return c
}

// setKey sets the key path (as yamlKeys lists it) of c to a value that
// differs from any default, and reports whether it found the key.
func setKey(t *testing.T, c *Config, key string) {
	t.Helper()
	v := reflect.ValueOf(c).Elem()
	for _, part := range strings.Split(key, ".") {
		idx := -1
		if i := strings.Index(part, "["); i >= 0 {
			idx = 0
			part = part[:i]
		}
		f, ok := fieldByTag(v, part)
		if !ok {
			t.Fatalf("key %s: no field for %q", key, part)
		}
		v = f
		if idx >= 0 {
			v = v.Index(idx)
		}
	}
	setLeaf(t, key, v)
}

func fieldByTag(v reflect.Value, name string) (reflect.Value, bool) {
	for i := 0; i < v.NumField(); i++ {
		if strings.Split(v.Type().Field(i).Tag.Get("yaml"), ",")[0] == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// onByDefault are the boolean keys whose default is not false: setting
// them means setting them false.
var onByDefault = map[string]bool{"ingest.durable": true}

func setLeaf(t *testing.T, key string, v reflect.Value) {
	t.Helper()
	switch v.Type() {
	case reflect.TypeOf(&Duration{}):
		v.Set(reflect.ValueOf(&Duration{7 * time.Second}))
		return
	case reflect.TypeOf(Duration{}):
		v.Set(reflect.ValueOf(Duration{7 * time.Second}))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		setLeaf(t, key, p.Elem())
		v.Set(p)
	case reflect.String:
		v.SetString("x-" + key)
	case reflect.Int, reflect.Int64:
		v.SetInt(7)
	case reflect.Float64:
		v.SetFloat(0.7)
	case reflect.Bool:
		v.SetBool(!onByDefault[key])
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.String {
			v.Set(reflect.ValueOf([]string{"x-" + key}))
			return
		}
		t.Fatalf("key %s: a slice of %v is not a leaf", key, v.Type().Elem())
	default:
		t.Fatalf("key %s: cannot set a %v", key, v.Type())
	}
}

// leafKeys are the keys of the file that hold values (not blocks).
func leafKeys() []string {
	var leaves []string
	keys := yamlKeys(reflect.TypeOf(Config{}), "")
	// A pool's analyzer block has the keys of the global one.
	for _, k := range keys {
		if after, ok := strings.CutPrefix(k, "analyzer."); ok {
			keys = append(keys, "pools[0].analyzer."+after)
		}
	}
	for _, k := range keys {
		if !slices.ContainsFunc(keys, func(o string) bool {
			return strings.HasPrefix(o, k+".") || strings.HasPrefix(o, k+"[")
		}) {
			leaves = append(leaves, k)
		}
	}
	return leaves
}

// TestMappingReachesEverySetting: every key of the file changes what the
// mapping produces (a key that maps nowhere fails), and with every key set,
// every field of the components' settings is reached (a setting no key
// reaches fails), except the fields listed as wiring.
func TestMappingReachesEverySetting(t *testing.T) {
	leaves := leafKeys()
	if len(leaves) < 40 {
		t.Fatalf("only %d keys found: %v", len(leaves), leaves)
	}
	base := mapAll(baseConfig())
	all := baseConfig()
	for _, key := range leaves {
		c := baseConfig()
		setKey(t, c, key)
		setKey(t, all, key)
		if cmp.Equal(base, mapAll(c)) {
			t.Errorf("key %s reaches no setting: setting it changes nothing the mapping produces", key)
		}
	}
	for k := range directKeys {
		if !slices.Contains(leaves, k) {
			t.Errorf("directKeys names %s, which is not a key of the file", k)
		}
	}

	// ingest.durable true in all (no_jetstream, set too, turns its
	// default off); the capture it replaces is reached by its default.
	all.Ingest.Durable = new(true)
	m := mapAll(all)
	// Fields the file does not set: they are the caller's wiring.
	wiring := map[string]bool{
		"analyzer.Config.Epoch": true, "analyzer.Config.Seed": true,
		"probes.Settings.Suite": true, "probes.Settings.Store": true, "probes.Settings.States": true, "probes.Settings.Sink": true,
		"probes.Settings.Jitter": true, "probes.Settings.Params": true, "probes.Settings.HTTPClient": true,
		"probes.Settings.Metrics": true, "probes.Settings.Now": true, "probes.Settings.Logf": true, "probes.Settings.Owns": true,
		"probes.ReviewSettings.LastReview": true, "probes.ReviewSettings.DefaultSince": true,
		"probes.ReviewSettings.Alerts": true, "probes.ReviewSettings.Statuses": true,
		"probes.ReviewSettings.Publish": true, "probes.ReviewSettings.Now": true, "probes.ReviewSettings.Logf": true,
		// The collector's tuning has no key: its defaults are measured
		// (BENCHMARKS.md), and serve sets the hooks.
		"collector.Settings.Subscriptions": true, "collector.Settings.PendingMsgs": true, "collector.Settings.PendingBytes": true,
		"collector.Settings.BatchSize": true, "collector.Settings.FlushInterval": true, "collector.Settings.StreamFlushInterval": true,
		"collector.Settings.StreamBatchBytes": true, "collector.Settings.RejectRate": true, "collector.Settings.RejectBurst": true,
		"collector.Settings.StreamMaxBytes": true, "collector.Settings.Now": true,
		"collector.Settings.Metrics": true, "collector.Settings.Logf": true, "collector.Settings.OnUrgent": true, "collector.Settings.CountsIntakeLoss": true, "collector.Settings.CatchUp": true,
		// ingest.durable unset reaches Capture (TestIntakeMode), true
		// reaches Intake: never both in one file.
		"collector.Settings.Capture":          true,
		"collector.Settings.MaxRejectSources": true, "collector.Settings.StreamSubject": true, "collector.Settings.StreamHeader": true,
	}
	var unreached []string
	reached := func(name string, v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			full := name + "." + f.Name
			if f.IsExported() && !wiring[full] && v.Field(i).IsZero() {
				unreached = append(unreached, full)
			}
		}
	}
	reached("analyzer.Config", reflect.ValueOf(m.Analyzer))
	reached("analyzer.Settings", reflect.ValueOf(m.Analyzer.Settings))
	reached("analyzer.Limits", reflect.ValueOf(m.Analyzer.Limits))
	if len(m.Analyzer.Pools) != 1 || len(m.Analyzer.Pools[0].Backends) != 1 {
		t.Fatalf("pools = %+v", m.Analyzer.Pools)
	}
	reached("analyzer.PoolConfig", reflect.ValueOf(m.Analyzer.Pools[0]))
	reached("analyzer.PoolConfig.Settings", reflect.ValueOf(m.Analyzer.Pools[0].Settings))
	reached("analyzer.BackendConfig", reflect.ValueOf(m.Analyzer.Pools[0].Backends[0]))
	reached("collector.Settings", reflect.ValueOf(m.Collector))
	reached("probes.Settings", reflect.ValueOf(m.Probes))
	if len(m.Probes.Targets) != 1 {
		t.Fatalf("targets = %+v", m.Probes.Targets)
	}
	reached("probes.Target", reflect.ValueOf(m.Probes.Targets[0]))
	reached("probes.ReviewSettings", reflect.ValueOf(m.Review))
	reached("config.ScrapeSettings", reflect.ValueOf(m.Scrape))
	if len(m.Scrape.Targets) != 1 {
		t.Fatalf("scrape targets = %+v", m.Scrape.Targets)
	}
	reached("config.ScrapeTarget", reflect.ValueOf(m.Scrape.Targets[0]))
	if len(m.Route) != 1 {
		t.Fatalf("route pools = %+v", m.Route)
	}
	reached("p2c.Settings.RetryRatio", reflect.ValueOf(struct{ RetryRatio float64 }{m.Route[0].Picker.RetryRatio}))
	// The router's settings the file does not set: the pools (above),
	// the caller's identity and wiring.
	for _, f := range []string{"Pools", "Transport", "Source", "Publisher", "Metrics", "Now", "Seed", "Logf", "Rewrite", "SkipResponseChecks", "ErrorHandler"} {
		wiring["route.Settings."+f] = true
	}
	reached("route.Settings", reflect.ValueOf(m.RouteSet))
	for _, f := range unreached {
		t.Errorf("setting %s is reached by no key of the file", f)
	}
}

// TestIntakeMode: ingest.durable unset is the capture whenever JetStream
// is on, true the durable intake, false neither.
func TestIntakeMode(t *testing.T) {
	for _, tc := range []struct {
		durable                 *bool
		noJetStream             bool
		wantIntake, wantCapture bool
	}{
		{nil, false, false, true},
		{nil, true, false, false},
		{new(true), false, true, false},
		{new(false), false, false, false},
	} {
		c := Default()
		c.Ingest.Durable, c.NATS.NoJetStream = tc.durable, tc.noJetStream
		s := c.CollectorSettings()
		if s.Intake != tc.wantIntake || s.Capture != tc.wantCapture {
			t.Errorf("durable %v, no_jetstream %v: intake %v capture %v, want %v %v",
				tc.durable, tc.noJetStream, s.Intake, s.Capture, tc.wantIntake, tc.wantCapture)
		}
	}
}
