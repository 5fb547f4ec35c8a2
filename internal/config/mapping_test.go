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
	"github.com/fleetwatch/fleetwatch/internal/alert"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
	"github.com/fleetwatch/fleetwatch/internal/natsrv"
	"github.com/fleetwatch/fleetwatch/probes"
)

// mapped is everything the file turns into: the components' and the
// adapters' settings, and the values serve reads from the file directly.
type mapped struct {
	Analyzer   analyzer.Config
	Collector  collector.Settings
	Probes     probes.Settings
	Review     probes.ReviewSettings
	Route      []route.Pool
	Scrape     ScrapeSettings
	RouteSet   route.Settings // the route block (the router's knobs)
	IngestHTTP ingest.HTTPSettings
	Emitter    ingest.EmitterSettings // serve's HTTP adapters'
	Nginx      LogIngestSettings
	HAProxyLog LogIngestSettings
	Alerts     alert.Settings
	HAProxy    haproxyctl.ControllerSettings
	NATSServer natsrv.Settings
	Direct     map[string]any
}

// directKeys are read by serve from the Config as they are, not through
// a component's or an adapter's Settings; each must still exist in the
// file.
var directKeys = map[string]func(c *Config) any{
	"nats.url":              func(c *Config) any { return c.NATS.URL }, // empty: the embedded server
	"http.listen":           func(c *Config) any { return c.HTTP.Listen },
	"ha.partitions":         func(c *Config) any { return c.HA.Partitions }, // serve's leases
	"ha.lease_ttl":          func(c *Config) any { return c.HA.LeaseTTL },
	"http.bearer_token_env": func(c *Config) any { return c.HTTP.BearerTokenEnv }, // serve.New reads the variable
	"http.basic_users_file": func(c *Config) any { return c.HTTP.BasicUsersFile },
	"http.tls_cert":         func(c *Config) any { return c.HTTP.TLSCert },
	"http.tls_key":          func(c *Config) any { return c.HTTP.TLSKey },
	"http.insecure":         func(c *Config) any { return c.HTTP.Insecure },
	"probes.disabled":       func(c *Config) any { return c.Probes.Disabled },
	"probes.suite":          func(c *Config) any { return c.Probes.Suite }, // drift.LoadSuite(name)
	"route.feed":            func(c *Config) any { return c.Route.Feed },   // the router's watcher (RouteConfig.CompactFeed)
}

// removedKeys are keys kept only to say what replaced them: setting one is
// a configuration error (TestConfigErrorsNameKeyAndLine).
var removedKeys = []string{"many_routers_heartbeat", "load_baseline_at_report"}

func removed(key string) bool {
	return slices.ContainsFunc(removedKeys, func(k string) bool { return strings.HasSuffix(key, "."+k) })
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

func mapAll(t *testing.T, c *Config) mapped {
	t.Helper()
	env := func(name string) string { return "key-of-" + name }
	as, err := c.AlertSettings(env)
	if err != nil {
		t.Fatal(err)
	}
	m := mapped{
		Analyzer:   c.AnalyzerSettings(1),
		Collector:  c.CollectorSettings(),
		Probes:     c.ProbeSettings(env),
		Review:     c.ReviewSettings(),
		Route:      c.RoutePools(env, p2c.Settings{}),
		Scrape:     c.ScrapeSettings(),
		RouteSet:   c.RouteSettings(route.Settings{}),
		IngestHTTP: c.IngestHTTPSettings(),
		Emitter:    c.IngestEmitterSettings(""),
		Nginx:      c.LogIngestSettings(ingest.AdapterNginx),
		HAProxyLog: c.LogIngestSettings(ingest.AdapterHAProxy),
		Alerts:     as,
		HAProxy:    c.HAProxySettings(),
		NATSServer: c.NATSServerSettings(),
		Direct:     map[string]any{},
	}
	for k, f := range directKeys {
		m.Direct[k] = f(c)
	}
	return m
}

// mappedEqual compares two mappings, the ingest mapping's table included.
func mappedEqual(a, b mapped) bool {
	return cmp.Equal(a, b, cmp.AllowUnexported(ingest.Mapping{}))
}

// baseConfig has one pool with one backend, so that the keys below pools
// have somewhere to go.
func baseConfig() *Config {
	c := Default()
	c.Pools = []PoolConfig{{ID: "p", Backends: []BackendConfig{{ID: "b", URL: "http://127.0.0.1:1"}}}}
	c.Ingest.Upstreams = []UpstreamConfig{{Match: "10.0.0.1:80"}}
	// By variable, so that both url (which wins) and url_env change the
	// mapping.
	c.Alerts.Receivers = []AlertReceiverConfig{{URLEnv: "HOOK"}}
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

// enumValues are the string keys only some values of which change the
// mapping: set them to one.
var enumValues = map[string]string{"ingest.nginx.ttft": "none", "ingest.haproxy.ttft": "none"}

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
		if w, ok := enumValues[key]; ok {
			v.SetString(w)
			return
		}
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
	base := mapAll(t, baseConfig())
	all := baseConfig()
	for _, key := range leaves {
		if removed(key) {
			continue
		}
		c := baseConfig()
		setKey(t, c, key)
		setKey(t, all, key)
		if mappedEqual(base, mapAll(t, c)) {
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
	// A HAProxy backend/server pair, for the HAProxy driver's names.
	all.Ingest.Upstreams[0].Match = "be/srv"
	m := mapAll(t, all)
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
	// The adapters' settings the file does not set: connections,
	// metrics, logs, clocks, and what the commands' flags set.
	for _, f := range []string{
		"ingest.HTTPSettings.Emitter", "ingest.HTTPSettings.Metrics",
		"ingest.EmitterSettings.MaxMessage",
		"ingest.LogSettings.Emitter", "ingest.LogSettings.Metrics",
		"ingest.LogRunSettings.Ingester", "ingest.LogRunSettings.Syslog", "ingest.LogRunSettings.Flush", "ingest.LogRunSettings.Logf",
		"ingest.TailSettings.Path", "ingest.TailSettings.FromStart", "ingest.TailSettings.Poll", "ingest.TailSettings.MaxLine",
		"ingest.TailSettings.OnRotate", "ingest.TailSettings.OnTruncate", "ingest.TailSettings.OnLongLine",
		"alert.Settings.HTTPClient", "alert.Settings.Metrics", "alert.Settings.Logf", "alert.Settings.Now",
		"haproxyctl.ControllerSettings.Runtime", "haproxyctl.ControllerSettings.Pools", "haproxyctl.ControllerSettings.Interval",
		"haproxyctl.ControllerSettings.Metrics", "haproxyctl.ControllerSettings.Logf", "haproxyctl.Settings.Drain",
		"natsrv.Settings.Logf", "natsrv.Settings.Debug", "natsrv.Settings.Cluster",
	} {
		wiring[f] = true
	}
	reached("ingest.HTTPSettings", reflect.ValueOf(m.IngestHTTP))
	reached("ingest.LiteLLMSettings", reflect.ValueOf(m.IngestHTTP.LiteLLM))
	reached("ingest.OTLPSettings", reflect.ValueOf(m.IngestHTTP.OTLP))
	reached("ingest.EmitterSettings", reflect.ValueOf(m.Emitter))
	for _, ls := range []LogIngestSettings{m.Nginx, m.HAProxyLog} {
		reached("config.LogIngestSettings", reflect.ValueOf(ls))
		reached("ingest.LogSettings", reflect.ValueOf(ls.Ingester))
		reached("ingest.LogRunSettings", reflect.ValueOf(ls.Run))
		reached("ingest.TailSettings", reflect.ValueOf(ls.Run.Tail))
	}
	reached("alert.Settings", reflect.ValueOf(m.Alerts))
	if len(m.Alerts.Receivers) != 1 {
		t.Fatalf("alert receivers = %+v", m.Alerts.Receivers)
	}
	reached("alert.Receiver", reflect.ValueOf(m.Alerts.Receivers[0]))
	reached("haproxyctl.ControllerSettings", reflect.ValueOf(m.HAProxy))
	if len(m.HAProxy.Mapping.Backends) != 1 || len(m.HAProxy.Mapping.Servers) != 1 {
		t.Errorf("HAProxy names = %+v, want one backend and one server", m.HAProxy.Mapping)
	}
	reached("natsrv.Settings", reflect.ValueOf(m.NATSServer))
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
