package config

import "strconv"

// AlertsConfig is where serve sends its notifications (internal/alert):
// breaker trips, pools with every backend open, confirmed drift and the
// drift review digest. Without receivers nothing is sent. The values are
// checked by the alert package when serve starts (alert.Settings.Validate,
// whose errors name these keys); the file checks what only it knows.
type AlertsConfig struct {
	Receivers []AlertReceiverConfig `yaml:"receivers"`
	// QueueSize bounds each receiver's queue (default 256); RateLimit and
	// Burst bound its sends per second (default 1, bursts of 10).
	QueueSize int     `yaml:"queue_size"`
	RateLimit float64 `yaml:"rate_limit"`
	Burst     int     `yaml:"burst"`
	// Timeout bounds one request (default 10s); a failed send is tried
	// MaxAttempts times (default 5), waiting Backoff (default 1s) and then
	// twice as long each time.
	Timeout     *Duration `yaml:"timeout"`
	MaxAttempts int       `yaml:"max_attempts"`
	Backoff     *Duration `yaml:"backoff"`
	// ResendInterval is how often Alertmanager receivers get the firing
	// alerts again (default 1m).
	ResendInterval *Duration `yaml:"resend_interval"`
	// ExternalURL is the status page's address, linked from notifications
	// and sent as Alertmanager's generatorURL.
	ExternalURL string `yaml:"external_url"`
}

// AlertReceiverConfig is one receiver. Its URL is given in the file or,
// because webhook URLs (Slack's above all) are secrets, read from the
// environment variable URLEnv.
type AlertReceiverConfig struct {
	Name           string   `yaml:"name"`             // metrics label; default <kind>-<index>
	Kind           string   `yaml:"kind"`             // webhook (default), slack or alertmanager
	URL            string   `yaml:"url"`              // Alertmanager: its base URL
	URLEnv         string   `yaml:"url_env"`          // environment variable holding the URL
	BearerTokenEnv string   `yaml:"bearer_token_env"` // environment variable holding a bearer token
	Events         []string `yaml:"events"`           // breaker_open, pool_all_open, drift, review; default all (Alertmanager: not review)
}

// ReceiverURL returns the receiver's URL: URL, or the value of URLEnv read
// with getenv.
func (r AlertReceiverConfig) ReceiverURL(getenv func(string) string) string {
	if r.URL != "" || r.URLEnv == "" {
		return r.URL
	}
	return getenv(r.URLEnv)
}

// validate checks what only the file knows: a URL or a variable naming
// one (not both), variable names, and durations.
func (a *AlertsConfig) validate(fail func(key, format string, args ...any) error) error {
	for i, r := range a.Receivers {
		key := "alerts.receivers[" + strconv.Itoa(i) + "]"
		switch {
		case r.URL == "" && r.URLEnv == "":
			return fail(key+".url", "missing: set url or url_env")
		case r.URL != "" && r.URLEnv != "":
			return fail(key+".url_env", "%q: set url or url_env, not both", r.URLEnv)
		}
		for _, env := range []struct{ key, v string }{{"url_env", r.URLEnv}, {"bearer_token_env", r.BearerTokenEnv}} {
			if env.v != "" && !envNameRe.MatchString(env.v) {
				return fail(key+"."+env.key, "%q: want the name of an environment variable", env.v)
			}
		}
	}
	for _, d := range []struct {
		key string
		v   *Duration
	}{{"timeout", a.Timeout}, {"backoff", a.Backoff}, {"resend_interval", a.ResendInterval}} {
		if d.v != nil && d.v.Duration <= 0 {
			return fail("alerts."+d.key, "%v: must be > 0", d.v.Duration)
		}
	}
	return nil
}
