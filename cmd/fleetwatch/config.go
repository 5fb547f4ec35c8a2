package main

import "time"

// Config is the YAML configuration file of DESIGN.md "Configuration". Every
// field has a default (DefaultConfig); a pool or backend that is not listed is
// still tracked from its events with the global defaults.
type Config struct {
	Prefix   string         `yaml:"prefix"`
	NATS     NATSConfig     `yaml:"nats"`
	HTTP     HTTPConfig     `yaml:"http"`
	Analyzer AnalyzerConfig `yaml:"analyzer"`
	Pools    []PoolConfig   `yaml:"pools"`
	Probes   ProbesConfig   `yaml:"probes"`
	Review   ReviewConfig   `yaml:"review"`
	Data     string         `yaml:"data"` // data directory; default ./data
}

// NATSConfig says where NATS is. An empty URL starts the embedded server.
type NATSConfig struct {
	URL         string `yaml:"url"`
	Listen      string `yaml:"listen"`    // embedded server; default 127.0.0.1:4222
	StoreDir    string `yaml:"store_dir"` // embedded JetStream store; default <data>/nats
	NoJetStream bool   `yaml:"no_jetstream"`
}

// HTTPConfig is serve's HTTP listener.
type HTTPConfig struct {
	Listen string `yaml:"listen"` // default 127.0.0.1:8080
}

// AnalyzerConfig holds the analyzer settings. In a pool's `analyzer` block a
// nil field inherits the global value.
type AnalyzerConfig struct {
	Window              *Duration `yaml:"window"`
	Bucket              *Duration `yaml:"bucket"`
	MinRequests         *int      `yaml:"min_requests"`
	FailureRate         *float64  `yaml:"failure_rate"`
	ConsecutiveFailures *int      `yaml:"consecutive_failures"`
	ThrottleRate        *float64  `yaml:"throttle_rate"`
	SlowFactor          *float64  `yaml:"slow_factor"`
	EWMAAlpha           *float64  `yaml:"ewma_alpha"`
	IdleGap             *Duration `yaml:"idle_gap"`
	OpenBase            *Duration `yaml:"open_base"`
	OpenMax             *Duration `yaml:"open_max"`
	HalfOpenWeight      *float64  `yaml:"half_open_weight"`
	HalfOpenSuccesses   *int      `yaml:"half_open_successes"`
	MaxOpenFraction     *float64  `yaml:"max_open_fraction"`
	Heartbeat           *Duration `yaml:"heartbeat"`
	TTL                 *Duration `yaml:"ttl"`
	Expiry              *Duration `yaml:"expiry"`
}

// PoolConfig is one pool of interchangeable backends.
type PoolConfig struct {
	ID                string          `yaml:"id"`
	Models            []string        `yaml:"models"` // request `model` values routed here (route)
	Mode              string          `yaml:"mode"`   // balance (default) or failover
	AllOpen           string          `yaml:"all_open"`
	AffinityTolerance *float64        `yaml:"affinity_tolerance"`
	Analyzer          AnalyzerConfig  `yaml:"analyzer"`
	Backends          []BackendConfig `yaml:"backends"`
}

// BackendConfig is one backend of a pool.
type BackendConfig struct {
	ID          string   `yaml:"id"`
	URL         string   `yaml:"url"`         // OpenAI-compatible base URL, for probes and route
	APIKeyEnv   string   `yaml:"api_key_env"` // environment variable holding the API key
	Priority    int      `yaml:"priority"`
	CostPerMTok *float64 `yaml:"cost_per_mtok"`
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
}

// ReviewConfig configures the drift review.
type ReviewConfig struct {
	Schedule string `yaml:"schedule"` // cron spec; default "0 9 * * 1-5"
	Dir      string `yaml:"dir"`      // default <data>/reviews
}

// Duration is a time.Duration written as a Go duration string in YAML.
type Duration struct{ time.Duration }
