// Package config is fleetwatch's YAML configuration file: its types, its
// strict decoding (an unknown key is an error naming the key and its line),
// and the one mapping from the file to every component's Settings
// (analyzer.Config, probes.Settings, the router's pools and knobs) and
// to the leaf adapters' (ingest, alert, haproxyctl, natsrv: adapters.go),
// on which serve and cmd add their wiring and flags. The rules on
// values live in the components' own validation (analyzer.New, probes.New,
// route.New); Validate runs them on the mapped settings and names the key
// and line of the file, so each rule is written once.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/probes"
)

// Config is the YAML configuration file of DESIGN.md "Configuration". Every
// field has a default (DefaultConfig); a pool or backend that is not listed is
// still tracked from its events with the global defaults.
type Config struct {
	Prefix   string         `yaml:"prefix"`
	NATS     NATSConfig     `yaml:"nats"`
	HTTP     HTTPConfig     `yaml:"http"`
	Analyzer AnalyzerConfig `yaml:"analyzer"`
	Limits   LimitsConfig   `yaml:"limits"`
	Pools    []PoolConfig   `yaml:"pools"`
	Route    RouteConfig    `yaml:"route"`
	Ingest   IngestConfig   `yaml:"ingest"`
	HA       HAConfig       `yaml:"ha"`
	Probes   ProbesConfig   `yaml:"probes"`
	Review   ReviewConfig   `yaml:"review"`
	Scrape   ScrapeConfig   `yaml:"scrape"` // reading the backends' metrics_url (load.go)
	Alerts   AlertsConfig   `yaml:"alerts"` // notifications to webhooks (alerts.go)
	Data     string         `yaml:"data"`   // data directory; default ./data
}

// NATSConfig says where NATS is. An empty URL starts the embedded server.
type NATSConfig struct {
	URL         string `yaml:"url"`
	Listen      string `yaml:"listen"`    // embedded server; default 127.0.0.1:4222
	StoreDir    string `yaml:"store_dir"` // embedded JetStream store; default <data>/nats
	NoJetStream bool   `yaml:"no_jetstream"`
}

// IngestConfig is how outcome events come in.
type IngestConfig struct {
	// Durable is the durable intake: the stream FW_INTAKE keeps every
	// outcome event as published until a collector takes it, so events
	// published while no serve runs, or while it reconnects, are not lost
	// (collector.Settings.Intake), and what its bounds discard is counted.
	// Default: on whenever the NATS server has JetStream (off, with a
	// warning and the loss stated on /healthz, when it has none); true
	// makes JetStream required; false is core NATS alone, which loses what
	// is published while no collector listens (DECISIONS.md "No silent
	// loss").
	Durable *bool `yaml:"durable"`
	// MaxAge and MaxBytes bound what FW_INTAKE keeps while nobody
	// consumes it; default 1h and 1 GiB.
	MaxAge   *Duration `yaml:"max_age"`
	MaxBytes int64     `yaml:"max_bytes"`

	// The adapters for proxies that do not publish on NATS
	// (docs/INTEGRATIONS.md; internal/ingest).

	// MaxBodyBytes bounds a body of serve's ingest endpoints
	// (/v1/outcomes, /v1/ingest/litellm, /v1/traces), after gzip; beyond
	// it the answer is 413. Default 4 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Upstreams map what a proxy calls an upstream to a pool and backend;
	// the configured backends' URLs (and their host:port) are mapped to
	// their pool and id without being listed here.
	Upstreams []UpstreamConfig `yaml:"upstreams"`
	// OnlyListed skips the events of upstreams that neither Upstreams nor
	// a configured backend's URL names.
	OnlyListed bool `yaml:"only_listed"`
	// DefaultPool is the pool of events from which no pool can be derived;
	// empty: such events are skipped.
	DefaultPool string `yaml:"default_pool"`
	// Source is the source written on the adapters' events; default
	// "fleetwatch-ingest".
	Source  string              `yaml:"source"`
	LiteLLM LiteLLMIngestConfig `yaml:"litellm"`
	OTLP    OTLPIngestConfig    `yaml:"otlp"`
	Nginx   AccessLogConfig     `yaml:"nginx"`
	HAProxy AccessLogConfig     `yaml:"haproxy"`
}

// UpstreamConfig maps one upstream of a proxy to a pool and backend.
type UpstreamConfig struct {
	// Match is the upstream as the adapter sees it: an nginx upstream
	// address, a HAProxy backend/server pair, a LiteLLM api_base, an OTLP
	// span's server.address:server.port.
	Match   string `yaml:"match"`
	Pool    string `yaml:"pool"`    // empty: the pool the adapter derives
	Backend string `yaml:"backend"` // empty: the upstream itself
}

// LiteLLMIngestConfig configures POST /v1/ingest/litellm.
type LiteLLMIngestConfig struct {
	// PoolField is the payload field naming the pool: model_group
	// (default, falling back to model), model, model_id or api_base.
	PoolField string `yaml:"pool_field"`
	// BackendField is the field naming the backend: api_base (default,
	// falling back to model_id), model_id, model or model_group.
	BackendField string `yaml:"backend_field"`
}

// OTLPIngestConfig configures the OTLP/HTTP traces receiver.
type OTLPIngestConfig struct {
	// PoolAttribute: default gen_ai.request.model, falling back to
	// gen_ai.response.model.
	PoolAttribute string `yaml:"pool_attribute"`
	// BackendAttribute: default server.address:server.port, falling back
	// to gen_ai.provider.name and gen_ai.system.
	BackendAttribute string `yaml:"backend_attribute"`
	// TTFTAttributes are read, in seconds, as the time to first token;
	// empty: the GenAI conventions' and common instrumentations' names.
	TTFTAttributes []string `yaml:"ttft_attributes"`
	// TTFTEvents name span events whose first occurrence marks the first
	// token; empty: none.
	TTFTEvents []string `yaml:"ttft_events"`
}

// AccessLogConfig configures `fleetwatch ingest nginx|haproxy`.
type AccessLogConfig struct {
	File         string `yaml:"file"`          // the access log to follow; empty: none
	OffsetFile   string `yaml:"offset_file"`   // where the read offset is kept; default <data>/ingest-<proxy>.offset
	SyslogListen string `yaml:"syslog_listen"` // UDP host:port to receive syslog on; empty: none
	// Pool is the pool of lines without a "pool" field; empty: the
	// proxy's upstream group (nginx's $proxy_host, the HAProxy backend).
	Pool string `yaml:"pool"`
	// TTFT says what becomes ttft_ms: header (the upstream's time to the
	// response headers, default) or none.
	TTFT string `yaml:"ttft"`
}

// HAConfig is how several serve instances share a deployment (DECISIONS.md
// "High availability"). With JetStream every instance takes partition
// leases; a single instance simply owns every partition.
type HAConfig struct {
	// Partitions is how many partitions the pools are hashed into
	// (fleetwatch.PartitionOf); every instance of a deployment must use
	// the same number. Default 16; at most 1024.
	Partitions int `yaml:"partitions"`
	// LeaseTTL is how long a partition lease lives without renewal (the
	// lease bucket's TTL): a dead owner's partitions are taken over within
	// about LeaseTTL + 1s. Default 5s; at least 500ms.
	LeaseTTL *Duration `yaml:"lease_ttl"`
	// Replicas is the replica count of the JetStream assets serve creates
	// (FW_OUTCOMES, fw_decisions, fw_leases): 3 on a three-node cluster.
	// Default 1.
	Replicas int `yaml:"replicas"`
}

// Default HA settings.
const (
	DefaultPartitions = 16
	DefaultLeaseTTL   = 5 * time.Second
	MaxPartitions     = 1024
	MinLeaseTTL       = 500 * time.Millisecond
)

// HASettings returns the HA block with its defaults applied.
func (c *Config) HASettings() HAConfig {
	h := c.HA
	if h.Partitions == 0 {
		h.Partitions = DefaultPartitions
	}
	if h.LeaseTTL == nil {
		h.LeaseTTL = dur(DefaultLeaseTTL)
	}
	if h.Replicas == 0 {
		h.Replicas = 1
	}
	return h
}

// HTTPConfig is serve's HTTP listener. Without BearerTokenEnv and
// BasicUsersFile every endpoint is open, which Validate allows only on a
// loopback address or with Insecure set. /healthz is always open.
type HTTPConfig struct {
	Listen string `yaml:"listen"` // default 127.0.0.1:8080
	// BearerTokenEnv names the environment variable holding the token that
	// "Authorization: Bearer TOKEN" must carry; empty: no bearer token.
	BearerTokenEnv string `yaml:"bearer_token_env"`
	// BasicUsersFile is an htpasswd file of "user:bcrypt-hash" lines for
	// HTTP basic authentication; empty: no basic authentication.
	BasicUsersFile string `yaml:"basic_users_file"`
	// TLSCert and TLSKey are PEM files; both set: serve HTTPS only.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// Insecure allows a non-loopback Listen without authentication.
	Insecure bool `yaml:"insecure"`
}

// HasAuth reports whether the HTTP API asks for credentials.
func (h HTTPConfig) HasAuth() bool { return h.BearerTokenEnv != "" || h.BasicUsersFile != "" }

// loopbackListen reports whether addr (host:port) listens on loopback
// only: an empty host or an unspecified address listens everywhere.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// AnalyzerConfig holds the analyzer settings. In a pool's `analyzer` block a
// nil field inherits the global value.
type AnalyzerConfig struct {
	Window               *Duration `yaml:"window"`
	Bucket               *Duration `yaml:"bucket"`
	MinRequests          *int      `yaml:"min_requests"`
	FailureRate          *float64  `yaml:"failure_rate"`
	ConsecutiveFailures  *int      `yaml:"consecutive_failures"`
	ConsecutiveStalls    *int      `yaml:"consecutive_stalls"`    // stalled outcomes in one run of failures that open a breaker; default 2
	ConsecutiveThrottled *int      `yaml:"consecutive_throttled"` // 429s with a retry hint in a row that open a breaker (held while a peer answers 429s too); default 5; negative: off
	ThrottledRunCounts   *string   `yaml:"throttled_run_counts"`  // which 429s make that run: hinted (default; a bare 429 is a full queue and ends it) or all
	ThrottleRate         *float64  `yaml:"throttle_rate"`
	ThrottleRateCounts   *string   `yaml:"throttle_rate_counts"` // which 429s the rate that opens a breaker counts: hinted (default; bare 429s, a full queue, only lower the weight) or all
	ThrottleRefuseRate   *float64  `yaml:"throttle_refuse_rate"` // open when 429s of every kind are this share of the newest quarter (a backend refusing everything while its peers serve); default 0.9, negative: off
	SlowFactor           *float64  `yaml:"slow_factor"`
	EWMAAlpha            *float64  `yaml:"ewma_alpha"`
	IdleGap              *Duration `yaml:"idle_gap"`
	OpenBase             *Duration `yaml:"open_base"`
	OpenMax              *Duration `yaml:"open_max"`
	HalfOpenWeight       *float64  `yaml:"half_open_weight"`
	HalfOpenSuccesses    *int      `yaml:"half_open_successes"`
	MaxOpenFraction      *float64  `yaml:"max_open_fraction"`
	Heartbeat            *Duration `yaml:"heartbeat"`
	LoadBeat             *Duration `yaml:"load_beat"` // how often a pool's loads go out between heartbeats (the compact feed); default 250ms, negative: with the snapshots only
	// ManyRoutersHeartbeat is a removed key, kept to say what replaced it.
	ManyRoutersHeartbeat *Duration `yaml:"many_routers_heartbeat"`
	TTL                  *Duration `yaml:"ttl"`
	Expiry               *Duration `yaml:"expiry"`
	MaxWeightStep        *float64  `yaml:"max_weight_step"`     // weight change per heartbeat; default 0.25
	OpenJitter           *float64  `yaml:"open_jitter"`         // relative jitter of open times; default 0.1, negative: none
	RecentMinRequests    *int      `yaml:"recent_min_requests"` // a rate rule may trip on the newest quarter of the window alone with this many requests there; default 10, negative: off
	PoolThrottleHold     *float64  `yaml:"pool_throttle_hold"`  // hold a 429 trip while the peers' recent median 429 rate is at least this; default 0.25, negative: off
	LoadMaxAge           *Duration `yaml:"load_max_age"`        // a backend's load report is published this long; default 3s
	ClientErrorRate      *float64  `yaml:"client_error_rate"`   // open when the 4xx rate is at least this and client_error_margin above the peers' median; default 0.5, negative: off
	ClientErrorMargin    *float64  `yaml:"client_error_margin"` // how far above the peers' median; default 0.4
}

// LimitsConfig bounds the pools and backends the analyzer tracks from
// events (analyzer.Limits); an absent key takes the analyzer's default.
type LimitsConfig struct {
	MaxPools           *int `yaml:"max_pools"`             // default 1,000
	MaxBackendsPerPool *int `yaml:"max_backends_per_pool"` // default 1,000
	MaxBackends        *int `yaml:"max_backends"`          // default 5,000
}

// PoolConfig is one pool of interchangeable backends.
type PoolConfig struct {
	ID                string   `yaml:"id"`
	Models            []string `yaml:"models"` // request `model` values routed here (route)
	Mode              string   `yaml:"mode"`   // balance (default) or failover
	AllOpen           string   `yaml:"all_open"`
	AffinityTolerance *float64 `yaml:"affinity_tolerance"`
	// MsPerCostUnit is the router's exchange rate between money and
	// latency: how many milliseconds of time to first token one unit of
	// cost_per_mtok is worth in the picker's score (route only). Absent or
	// 0: cost is ignored.
	MsPerCostUnit *float64 `yaml:"ms_per_cost_unit"`
	// ORCA is how route asks the pool's backends for ORCA load reports
	// (route.Pool.ORCA): text (default), json or off.
	ORCA string `yaml:"orca"`
	// Score is the router's picker score by name (p2c.Scores: load,
	// inflight, sqrt, seed); empty: p2c.DefaultScore (load).
	Score string `yaml:"score"`
	// Choices is how many candidates the router's picker samples and
	// compares; absent or 0: every candidate up to scan_routers routers, 3
	// up to 16 routers, 2 beyond (p2c.Settings.Choices).
	Choices *int `yaml:"choices"`
	// ScanRouters is the most routers a pool's snapshot may count for
	// the picker to compare every candidate rather than sample choices of
	// them (p2c.Settings.ScanRouters); absent or 0: 8.
	ScanRouters *int `yaml:"scan_routers"`
	// LoadStale is how old a published backend load may be before the
	// load score counts the backend by the router's own in-flight count
	// (p2c.Settings.LoadStale); absent: 2s.
	LoadStale *Duration `yaml:"load_stale"`
	// LoadBaselineAtReport is a removed key, kept to say so.
	LoadBaselineAtReport *bool `yaml:"load_baseline_at_report"`
	// LoadRunningWeight is how much a published load's running sequences
	// count against its waiting requests in the load score
	// (p2c.Settings.RunningWeight); absent: 1; 0: waiting only.
	LoadRunningWeight *float64        `yaml:"load_running_weight"`
	Analyzer          AnalyzerConfig  `yaml:"analyzer"`
	Backends          []BackendConfig `yaml:"backends"`

	// Shadow is the pool's shadow mode: off (default), breakers or
	// observe (analyzer.PoolConfig.Shadow, route.Pool.Shadow).
	Shadow string `yaml:"shadow"`

	// ProbeBudgetTokensPerDay is the probe budget of each of the pool's
	// backends (probes.Target.BudgetTokensPerDay); absent:
	// probes.budget_tokens_per_day; 0: unlimited.
	ProbeBudgetTokensPerDay *int64 `yaml:"probe_budget_tokens_per_day"`
}

// BackendConfig is one backend of a pool.
type BackendConfig struct {
	ID          string   `yaml:"id"`
	URL         string   `yaml:"url"`         // OpenAI-compatible base URL, for probes and route
	APIKeyEnv   string   `yaml:"api_key_env"` // environment variable holding the API key
	Priority    int      `yaml:"priority"`
	CostPerMTok *float64 `yaml:"cost_per_mtok"`
	// ProbeModel is the model the drift probes ask for; default: the first
	// of the pool's models that GET /v1/models lists, else its first id.
	ProbeModel string `yaml:"probe_model"`
	// ProbeEndpoint is the API the probes use: chat (default) or
	// completions.
	ProbeEndpoint string `yaml:"probe_endpoint"`
	// MetricsURL is the backend's Prometheus metrics, which serve reads
	// for its load (load.go): an http(s) URL, or "auto" for the url's
	// host with the path /metrics. Empty: not read.
	MetricsURL string `yaml:"metrics_url"`
	// ProbeBudgetTokensPerDay is the most tokens the drift probes of this
	// backend may spend in any 24 hours; absent: the pool's
	// probe_budget_tokens_per_day, else probes.budget_tokens_per_day; 0:
	// unlimited.
	ProbeBudgetTokensPerDay *int64 `yaml:"probe_budget_tokens_per_day"`
}

// ProbesConfig configures drift probes.
type ProbesConfig struct {
	Schedule   string    `yaml:"schedule"` // cron spec; default "@every 5m"
	Suite      string    `yaml:"suite"`    // suite name or a file path; default default-v1
	Timeout    *Duration `yaml:"timeout"`  // default 30s
	Quarantine bool      `yaml:"quarantine"`
	Disabled   bool      `yaml:"disabled"`
	Enrol      int       `yaml:"enrol"`     // enrolment cycles; default 8
	EnrolMin   *Duration `yaml:"enrol_min"` // minimum enrolment span; default 2h
	// BudgetTokensPerDay is the default probe budget of every backend:
	// the most tokens its drift probes may spend in any 24 hours
	// (docs/DRIFT.md "Probe budget"); default 0, unlimited.
	BudgetTokensPerDay int64 `yaml:"budget_tokens_per_day"`
}

// ReviewConfig configures the drift review.
type ReviewConfig struct {
	Schedule string `yaml:"schedule"` // cron spec; default "0 9 * * 1-5"
	Dir      string `yaml:"dir"`      // default <data>/reviews
}

// RouteConfig is the `route` block: what `fleetwatch route` (feed/route)
// takes from the file besides the pools.
// Every key has a flag of the same name (--max-attempts for max_attempts,
// --max-body for max_body_bytes) that wins when given; a key left out is
// route's default (route.Default*, p2c.DefaultRetryRatio).
type RouteConfig struct {
	StallFloor    *Duration `yaml:"stall_floor"`    // first-token deadline floor; default 10s, negative: no deadline
	StallMultiple *float64  `yaml:"stall_multiple"` // deadline = max(floor, this x the pool's p95 TTFT); default 8
	MaxAttempts   *int      `yaml:"max_attempts"`   // attempts per request, the first included; default 3, 1: no retries
	IdleGap       *Duration `yaml:"idle_gap"`       // silence after which the next request to a backend is marked cold; default 5m
	MaxBodyBytes  *int64    `yaml:"max_body_bytes"` // largest request body accepted; default 32 MiB
	HeaderTimeout *Duration `yaml:"header_timeout"` // wait for a backend's response headers (a timeout outcome, retried); default 0: as long as the client
	RetryRatio    *float64  `yaml:"retry_ratio"`    // retries allowed per first attempt (the retry budget); default 0.2, negative: no budget
	PrefixFrom    string    `yaml:"prefix_from"`    // what the affinity prefix hash is computed from: system (default) or none
	Why           bool      `yaml:"why"`            // decision visibility headers on every response (state, weight, reason class, decision age); default false
	Feed          string    `yaml:"feed"`           // the feed followed: compact (default; the JSON snapshots when the server has no fw_feed bucket) or json
}

// minLoadStale is the least load_stale: the compact feed moves loads every
// 250ms, and the picker's load decay factors, exp(span / load_stale) over
// a span up to feed.MaxRepeatSpan, must stay float64s (at most exp(600)).
const minLoadStale = 50 * time.Millisecond

// Feeds a router follows (route.feed).
const (
	FeedCompact = "compact"
	FeedJSON    = "json"
)

// Duration is a time.Duration written as a Go duration string in YAML.
type Duration struct{ time.Duration }

// UnmarshalYAML parses a Go duration string ("30s", "5m").
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration string such as \"30s\"", n.Line)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (want e.g. \"30s\", \"5m\")", n.Line, n.Value)
	}
	d.Duration = v
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func dur(d time.Duration) *Duration { return &Duration{d} }

// Default returns the defaults of DESIGN.md "Configuration". The
// analyzer block is left nil: its defaults live in analyzer.Settings, so
// there is one source of truth for them.
func Default() *Config {
	return &Config{
		Prefix: fleetwatch.DefaultPrefix,
		NATS:   NATSConfig{Listen: "127.0.0.1:4222"},
		HTTP:   HTTPConfig{Listen: "127.0.0.1:8080"},
		Probes: ProbesConfig{Schedule: "@every 5m", Suite: "default-v1", Timeout: dur(30 * time.Second)},
		Review: ReviewConfig{Schedule: "0 9 * * 1-5"},
		Data:   "./data",
	}
}

// Error is a configuration problem, naming the key and, when known,
// the line of the file.
type Error struct {
	File string
	Line int    // 0 when unknown
	Key  string // dotted path, e.g. "pools[0].backends[1].url"
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads path (or returns the defaults when path is ""), decodes it
// strictly (an unknown key is an error) and validates it.
func Load(path string) (*Config, error) {
	if path == "" {
		cfg := Default()
		return cfg, cfg.Validate()
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

var lineRe = regexp.MustCompile(`line (\d+): `)

// Parse decodes data, the contents of file (used in errors only), over the
// defaults and validates the result.
func Parse(data []byte, file string) (*Config, error) {
	cfg := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, configYAMLError(err, nil, file)
	}
	lines := keyLines(&root)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, configYAMLError(err, lines, file)
	}
	if err := cfg.validate(lines, file); err != nil {
		return nil, err
	}
	return cfg, nil
}

// configYAMLError turns a yaml error into a Error naming the key at
// the reported line.
func configYAMLError(err error, lines map[string]int, file string) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: unmarshal errors:\n")
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = strings.TrimSpace(strings.Split(msg, "\n")[0])
	ce := &Error{File: file, Msg: msg}
	if m := lineRe.FindStringSubmatch(msg); m != nil {
		ce.Line, _ = strconv.Atoi(m[1])
		ce.Msg = strings.Replace(msg, m[0], "", 1)
		for k, l := range lines {
			if l == ce.Line && (ce.Key == "" || len(k) > len(ce.Key)) {
				ce.Key = k
			}
		}
	}
	ce.Msg = strings.ReplaceAll(ce.Msg, "config.", "")
	return ce
}

// keyLines maps every key path of the document to its line.
func keyLines(root *yaml.Node) map[string]int {
	lines := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				if path != "" {
					k = path + "." + k
				}
				lines[k] = n.Content[i].Line
				walk(n.Content[i+1], k)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				k := fmt.Sprintf("%s[%d]", path, i)
				lines[k] = c.Line
				walk(c, k)
			}
		}
	}
	walk(root, "")
	return lines
}

// Validate checks every value and names the key of the first bad one (Parse
// also names its line).
func (c *Config) Validate() error { return c.validate(nil, "") }

// validate is Validate; lines maps key paths to lines (nil when there is no
// file).
func (c *Config) validate(lines map[string]int, file string) error {
	fail := func(key, format string, args ...any) error {
		line := 0
		for k := key; k != ""; k = parentKey(k) {
			if l, ok := lines[k]; ok {
				line = l
				break
			}
		}
		return &Error{File: file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	if err := fleetwatch.ValidatePrefix(c.Prefix); err != nil {
		return fail("prefix", "%q: must be dot-separated tokens of letters, digits, '-' and '_'", c.Prefix)
	}
	if c.NATS.URL == "" && c.NATS.Listen != "" {
		if _, _, err := net.SplitHostPort(c.NATS.Listen); err != nil {
			return fail("nats.listen", "%q: want host:port", c.NATS.Listen)
		}
	}
	if c.HTTP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			return fail("http.listen", "%q: want host:port", c.HTTP.Listen)
		}
	}
	if err := c.HTTP.validate(fail); err != nil {
		return err
	}
	// Pool and backend ids, modes, tolerances, priorities, costs and the
	// analyzer's ranges are the analyzer's rules (analyzer.New checks them
	// and names the key); the file adds the line. What is left here is what
	// only the file knows: explicit zeros, models, URLs.
	if err := c.Analyzer.validate("analyzer", fail); err != nil {
		return err
	}
	for _, l := range []struct {
		key string
		v   *int
	}{{"max_pools", c.Limits.MaxPools}, {"max_backends_per_pool", c.Limits.MaxBackendsPerPool}, {"max_backends", c.Limits.MaxBackends}} {
		if l.v != nil && *l.v == 0 {
			return fail("limits."+l.key, "0: must be > 0")
		}
	}
	if err := c.validatePools(fail); err != nil {
		return err
	}
	if _, err := analyzer.New(c.AnalyzerSettings(0)); err != nil {
		var se *analyzer.SettingError
		if errors.As(err, &se) {
			return fail(se.Key, "%s: %s", se.Value, se.Problem)
		}
		return fail("analyzer", "%v", err)
	}
	if c.Probes.Schedule != "" {
		if _, err := probes.ParseSchedule(c.Probes.Schedule); err != nil {
			return fail("probes.schedule", "%q: %v", c.Probes.Schedule, err)
		}
	}
	if c.Ingest.MaxAge != nil && c.Ingest.MaxAge.Duration <= 0 {
		return fail("ingest.max_age", "%v: must be > 0", c.Ingest.MaxAge.Duration)
	}
	if c.Ingest.MaxBytes < 0 {
		return fail("ingest.max_bytes", "%d: must be >= 0", c.Ingest.MaxBytes)
	}
	if err := c.Ingest.validate(fail); err != nil {
		return err
	}
	if err := c.validateHA(fail); err != nil {
		return err
	}
	if c.Ingest.Durable != nil && *c.Ingest.Durable && c.NATS.NoJetStream {
		return fail("ingest.durable", "true: the durable intake needs JetStream (nats.no_jetstream is true)")
	}
	if err := c.Route.validate(fail); err != nil {
		return err
	}
	if c.Probes.Timeout != nil && c.Probes.Timeout.Duration <= 0 {
		return fail("probes.timeout", "%v: must be > 0", c.Probes.Timeout.Duration)
	}
	if c.Probes.Enrol < 0 {
		return fail("probes.enrol", "%d: must be >= 0", c.Probes.Enrol)
	}
	if c.Probes.BudgetTokensPerDay < 0 {
		return fail("probes.budget_tokens_per_day", "%d: must be >= 0 (0: unlimited)", c.Probes.BudgetTokensPerDay)
	}
	if c.Review.Schedule != "" {
		if _, err := probes.ParseSchedule(c.Review.Schedule); err != nil {
			return fail("review.schedule", "%q: %v", c.Review.Schedule, err)
		}
	}
	if err := c.validateLoad(fail); err != nil {
		return err
	}
	return c.Alerts.validate(fail)
}

// validatePools checks what only the file knows of the pools: explicit
// zeros, scores and choices, models routed to two pools, backend URLs and
// probe endpoints.
func (c *Config) validatePools(fail func(key, format string, args ...any) error) error {
	models := map[string]string{}
	for i, p := range c.Pools {
		key := fmt.Sprintf("pools[%d]", i)
		if err := p.Analyzer.validate(key+".analyzer", fail); err != nil {
			return err
		}
		if v := p.MsPerCostUnit; v != nil && (!(*v >= 0) || math.IsInf(*v, 0)) {
			return fail(key+".ms_per_cost_unit", "%v: must be a finite number >= 0", *v)
		}
		if _, ok := p2c.ScoreByName(p.Score); p.Score != "" && !ok {
			return fail(key+".score", "%q: want one of %s", p.Score, scoreNames())
		}
		if v := p.Choices; v != nil && *v < 0 {
			return fail(key+".choices", "%d: must be >= 0 (0: by the number of routers)", *v)
		}
		if v := p.ScanRouters; v != nil && *v < 0 {
			return fail(key+".scan_routers", "%d: must be >= 0 (0: 8); a negative value no longer turns the scan off (choices: 3 samples at every router count)", *v)
		}
		if p.LoadBaselineAtReport != nil {
			return fail(key+".load_baseline_at_report", "removed: the load score always counts a router's change from the first snapshot after the load report")
		}
		if v := p.LoadRunningWeight; v != nil && (*v < 0 || *v > 1) {
			return fail(key+".load_running_weight", "%v: must be in [0, 1]", *v)
		}
		if v := p.LoadStale; v != nil && v.Duration < minLoadStale {
			return fail(key+".load_stale", "%v: must be at least %v", v.Duration, minLoadStale)
		}
		if v := p.ProbeBudgetTokensPerDay; v != nil && *v < 0 {
			return fail(key+".probe_budget_tokens_per_day", "%d: must be >= 0 (0: unlimited)", *v)
		}
		for j, m := range p.Models {
			if other, dup := models[m]; dup && other != p.ID {
				return fail(fmt.Sprintf("%s.models[%d]", key, j), "%q: already routed to pool %q", m, other)
			}
			models[m] = p.ID
		}
		for j, b := range p.Backends {
			bkey := fmt.Sprintf("%s.backends[%d]", key, j)
			if v := b.ProbeBudgetTokensPerDay; v != nil && *v < 0 {
				return fail(bkey+".probe_budget_tokens_per_day", "%d: must be >= 0 (0: unlimited)", *v)
			}
			if b.URL == "" {
				continue
			}
			if u, err := url.Parse(b.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fail(bkey+".url", "%q: want an http(s) base URL", b.URL)
			}
			t := probes.Target{Pool: p.ID, Backend: b.ID, URL: b.URL, Endpoint: b.ProbeEndpoint}
			if _, err := probes.New(probes.Settings{Targets: []probes.Target{t}}); errors.Is(err, probes.ErrInvalidTarget) {
				return fail(bkey+".probe_endpoint", "%q: want chat or completions", b.ProbeEndpoint)
			}
		}
	}
	return nil
}

// validateHA checks the ha block's ranges.
func (c *Config) validateHA(fail func(key, format string, args ...any) error) error {
	if c.HA.Partitions < 0 || c.HA.Partitions > MaxPartitions {
		return fail("ha.partitions", "%d: must be between 1 and %d (0: the default %d)", c.HA.Partitions, MaxPartitions, DefaultPartitions)
	}
	if c.HA.LeaseTTL != nil && c.HA.LeaseTTL.Duration < MinLeaseTTL {
		return fail("ha.lease_ttl", "%v: must be at least %v", c.HA.LeaseTTL.Duration, MinLeaseTTL)
	}
	if c.HA.Replicas < 0 || c.HA.Replicas > 5 {
		return fail("ha.replicas", "%d: must be between 1 and 5 (0: the default 1)", c.HA.Replicas)
	}
	return nil
}

// validate checks the HTTP keys: an exposed listener needs authentication
// or an explicit http.insecure.
func (h *HTTPConfig) validate(fail func(key, format string, args ...any) error) error {
	if h.BearerTokenEnv != "" && !envNameRe.MatchString(h.BearerTokenEnv) {
		return fail("http.bearer_token_env", "%q: want the name of an environment variable (not the token)", h.BearerTokenEnv)
	}
	if h.TLSCert != "" && h.TLSKey == "" {
		return fail("http.tls_key", "missing: http.tls_cert needs http.tls_key")
	}
	if h.TLSKey != "" && h.TLSCert == "" {
		return fail("http.tls_cert", "missing: http.tls_key needs http.tls_cert")
	}
	if h.Listen != "" && !loopbackListen(h.Listen) && !h.HasAuth() && !h.Insecure {
		return fail("http.listen", "%q is not a loopback address and the HTTP API has no authentication: "+
			"set http.bearer_token_env or http.basic_users_file, or http.insecure: true to serve it to anyone who can connect",
			h.Listen)
	}
	return nil
}

func parentKey(k string) string {
	if i := strings.LastIndexAny(k, ".["); i > 0 {
		return k[:i]
	}
	return ""
}

// validate rejects an explicit zero where zero is not a valid value: the
// analyzer reads zero as "use the default", which would silently ignore
// what the file says. Ranges are checked by the analyzer itself (see
// Config.Validate), so there is one definition of each bound.
func (a *AnalyzerConfig) validate(key string, fail func(key, format string, args ...any) error) error {
	for _, c := range []struct {
		name string
		zero bool
	}{
		{"window", a.Window != nil && a.Window.Duration == 0},
		{"bucket", a.Bucket != nil && a.Bucket.Duration == 0},
		{"idle_gap", a.IdleGap != nil && a.IdleGap.Duration == 0},
		{"open_base", a.OpenBase != nil && a.OpenBase.Duration == 0},
		{"open_max", a.OpenMax != nil && a.OpenMax.Duration == 0},
		{"heartbeat", a.Heartbeat != nil && a.Heartbeat.Duration == 0},
		{"load_beat", a.LoadBeat != nil && a.LoadBeat.Duration == 0},
		{"ttl", a.TTL != nil && a.TTL.Duration == 0},
		{"expiry", a.Expiry != nil && a.Expiry.Duration == 0},
		{"load_max_age", a.LoadMaxAge != nil && a.LoadMaxAge.Duration == 0},
		{"min_requests", a.MinRequests != nil && *a.MinRequests == 0},
		{"consecutive_failures", a.ConsecutiveFailures != nil && *a.ConsecutiveFailures == 0},
		{"consecutive_stalls", a.ConsecutiveStalls != nil && *a.ConsecutiveStalls == 0},
		{"consecutive_throttled", a.ConsecutiveThrottled != nil && *a.ConsecutiveThrottled == 0},
		{"throttled_run_counts", a.ThrottledRunCounts != nil && *a.ThrottledRunCounts == ""},
		{"throttle_rate_counts", a.ThrottleRateCounts != nil && *a.ThrottleRateCounts == ""},
		{"throttle_refuse_rate", a.ThrottleRefuseRate != nil && *a.ThrottleRefuseRate == 0},
		{"half_open_successes", a.HalfOpenSuccesses != nil && *a.HalfOpenSuccesses == 0},
		{"failure_rate", a.FailureRate != nil && *a.FailureRate == 0},
		{"throttle_rate", a.ThrottleRate != nil && *a.ThrottleRate == 0},
		{"slow_factor", a.SlowFactor != nil && *a.SlowFactor == 0},
		{"ewma_alpha", a.EWMAAlpha != nil && *a.EWMAAlpha == 0},
		{"half_open_weight", a.HalfOpenWeight != nil && *a.HalfOpenWeight == 0},
		{"max_open_fraction", a.MaxOpenFraction != nil && *a.MaxOpenFraction == 0},
		{"max_weight_step", a.MaxWeightStep != nil && *a.MaxWeightStep == 0},
		{"recent_min_requests", a.RecentMinRequests != nil && *a.RecentMinRequests == 0},
		{"pool_throttle_hold", a.PoolThrottleHold != nil && *a.PoolThrottleHold == 0},
		{"client_error_rate", a.ClientErrorRate != nil && *a.ClientErrorRate == 0},
		{"client_error_margin", a.ClientErrorMargin != nil && *a.ClientErrorMargin == 0},
	} {
		if c.zero {
			return fail(key+"."+c.name, "0: must be > 0")
		}
	}
	if a.ManyRoutersHeartbeat != nil {
		return fail(key+".many_routers_heartbeat", "removed: snapshots go out every heartbeat whatever the routers, and the loads every load_beat (250ms) on the compact feed; use load_beat")
	}
	return nil
}

// validate checks the adapters' keys.
func (in *IngestConfig) validate(fail func(key, format string, args ...any) error) error {
	if in.MaxBodyBytes < 0 {
		return fail("ingest.max_body_bytes", "%d: must be >= 0", in.MaxBodyBytes)
	}
	for i, u := range in.Upstreams {
		key := fmt.Sprintf("ingest.upstreams[%d]", i)
		if strings.TrimSpace(u.Match) == "" {
			return fail(key+".match", "missing: want the upstream as the proxy names it")
		}
		if u.Pool != "" && fleetwatch.ValidatePoolID(u.Pool) != nil {
			return fail(key+".pool", "%q: not a valid pool id", u.Pool)
		}
		if u.Backend != "" && fleetwatch.ValidateBackendID(u.Backend) != nil {
			return fail(key+".backend", "%q: not a valid backend id", u.Backend)
		}
	}
	if in.DefaultPool != "" && fleetwatch.ValidatePoolID(in.DefaultPool) != nil {
		return fail("ingest.default_pool", "%q: not a valid pool id", in.DefaultPool)
	}
	fields := []string{"", "model_group", "model", "model_id", "api_base"}
	if !slices.Contains(fields, in.LiteLLM.PoolField) {
		return fail("ingest.litellm.pool_field", "%q: want model_group, model, model_id or api_base", in.LiteLLM.PoolField)
	}
	if !slices.Contains(fields, in.LiteLLM.BackendField) {
		return fail("ingest.litellm.backend_field", "%q: want api_base, model_id, model or model_group", in.LiteLLM.BackendField)
	}
	for name, a := range map[string]AccessLogConfig{"nginx": in.Nginx, "haproxy": in.HAProxy} {
		if a.SyslogListen != "" {
			if _, _, err := net.SplitHostPort(a.SyslogListen); err != nil {
				return fail("ingest."+name+".syslog_listen", "%q: want host:port", a.SyslogListen)
			}
		}
		if a.Pool != "" && fleetwatch.ValidatePoolID(a.Pool) != nil {
			return fail("ingest."+name+".pool", "%q: not a valid pool id", a.Pool)
		}
		if a.TTFT != "" && a.TTFT != "header" && a.TTFT != "none" {
			return fail("ingest."+name+".ttft", "%q: want header or none", a.TTFT)
		}
	}
	return nil
}

// IngestUpstreams is the adapters' upstream mapping: every configured
// backend's URL (with and without a trailing "/v1", and its host:port)
// mapped to its pool and id, then ingest.upstreams, which win.
func (c *Config) IngestUpstreams() []UpstreamConfig {
	var out []UpstreamConfig
	for _, p := range c.Pools {
		for _, b := range p.Backends {
			if b.URL == "" {
				continue
			}
			base := strings.TrimRight(b.URL, "/")
			matches := []string{base}
			if trimmed, ok := strings.CutSuffix(base, "/v1"); ok {
				matches = append(matches, trimmed)
			} else {
				matches = append(matches, base+"/v1")
			}
			if u, err := url.Parse(b.URL); err == nil && u.Host != "" {
				host := u.Host
				if u.Port() == "" {
					port := "80"
					if u.Scheme == "https" {
						port = "443"
					}
					host = net.JoinHostPort(u.Hostname(), port)
				}
				matches = append(matches, host)
			}
			for _, m := range matches {
				out = append(out, UpstreamConfig{Match: m, Pool: p.ID, Backend: b.ID})
			}
		}
	}
	return append(out, c.Ingest.Upstreams...)
}
