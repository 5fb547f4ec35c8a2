package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/alert"
)

func TestAlertsKeys(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		wantKey  string
		wantLine int
	}{
		{"no url", "alerts:\n  receivers:\n    - kind: slack\n", "alerts.receivers[0].url", 3},
		{"url and url_env", "alerts:\n  receivers:\n    - url: http://a/\n      url_env: HOOK\n", "alerts.receivers[0].url_env", 4},
		{"a token in place of a variable", "alerts:\n  receivers:\n    - url: http://a/\n      bearer_token_env: s3cr3t-t0ken!\n", "alerts.receivers[0].bearer_token_env", 4},
		{"zero timeout", "alerts:\n  timeout: 0s\n", "alerts.timeout", 2},
		{"unknown key", "alerts:\n  receivers:\n    - url: http://a/\n      channel: ops\n", "alerts.receivers[0].channel", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "fw.yaml")
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a *config.Error", err)
			}
			if ce.Key != tt.wantKey || ce.Line != tt.wantLine {
				t.Errorf("key %q line %d, want %q line %d (%v)", ce.Key, ce.Line, tt.wantKey, tt.wantLine, err)
			}
		})
	}
	cfg, err := Parse([]byte("alerts:\n  receivers:\n    - kind: slack\n      url_env: HOOK\n"), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOOK": "https://hooks.example/T0/B0/X"}
	got := cfg.Alerts.Receivers[0].ReceiverURL(func(k string) string { return env[k] })
	if diff := cmp.Diff("https://hooks.example/T0/B0/X", got); diff != "" {
		t.Errorf("url (-want +got):\n%s", diff)
	}
}

// TestAlertSettingsReachEveryField: with every key of the alerts block
// set, every field of the notifier's settings that the file owns is set.
func TestAlertSettingsReachEveryField(t *testing.T) {
	yaml := `
alerts:
  receivers:
    - name: x
      kind: slack
      url_env: HOOK
      bearer_token_env: TOKEN
      events: [drift]
  queue_size: 7
  rate_limit: 0.5
  burst: 3
  timeout: 3s
  max_attempts: 2
  backoff: 2s
  resend_interval: 30s
  external_url: http://fw.example/
`
	cfg, err := Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOOK": "https://hooks.example/x", "TOKEN": "t"}
	s, err := cfg.AlertSettings(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	wiring := map[string]bool{"HTTPClient": true, "Metrics": true, "Logf": true, "Now": true}
	check := func(v reflect.Value) {
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			if !wiring[name] && v.Field(i).IsZero() {
				t.Errorf("%s.%s is reached by no key of the file", v.Type().Name(), name)
			}
		}
	}
	check(reflect.ValueOf(s))
	if len(s.Receivers) != 1 {
		t.Fatalf("receivers %+v", s.Receivers)
	}
	check(reflect.ValueOf(s.Receivers[0]))
	if err := s.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	delete(env, "HOOK")
	if _, err := cfg.AlertSettings(func(k string) string { return env[k] }); !errors.Is(err, alert.ErrInvalidSettings) ||
		!strings.Contains(err.Error(), "alerts.receivers[0].url_env") {
		t.Errorf("an unset url_env: %v", err)
	}
}
