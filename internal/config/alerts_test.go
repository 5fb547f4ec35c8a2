package config

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
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
