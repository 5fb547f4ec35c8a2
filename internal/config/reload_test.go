package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const reloadBase = `prefix: fw
http:
  listen: 127.0.0.1:8080
analyzer:
  failure_rate: 0.5
pools:
  - id: p
    backends:
      - id: a
      - id: b
  - id: q
    backends:
      - id: x
probes:
  schedule: "@every 5m"
`

func mustParse(t *testing.T, data string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(data), "fleetwatch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestParseReload(t *testing.T) {
	prev := mustParse(t, reloadBase)
	tests := []struct {
		name string
		yaml string
		want []Change
	}{
		{"unchanged", reloadBase, nil},
		{
			"thresholds, schedule, pools and backends",
			`prefix: fw
http:
  listen: 127.0.0.1:8080
analyzer:
  failure_rate: 0.3
pools:
  - id: new
    mode: failover
  - id: p
    analyzer:
      min_requests: 10
    backends:
      - id: b
        priority: 1
      - id: c
probes:
  schedule: "@every 1m"
`,
			[]Change{
				{Key: "analyzer.failure_rate", Op: OpChanged, Line: 5},
				{Key: "pools[0]", Op: OpAdded, Line: 7, ID: "new"},
				{Key: "pools[1].analyzer.min_requests", Op: OpChanged, Line: 11},
				{Key: "pools[1].backends[0].priority", Op: OpChanged, Line: 14},
				{Key: "pools[1].backends[1]", Op: OpAdded, Line: 15, ID: "p/c"},
				{Key: "pools[1].backends[0]", Op: OpRemoved, ID: "p/a"},
				{Key: "pools[1]", Op: OpRemoved, ID: "q"},
				{Key: "probes.schedule", Op: OpChanged, Line: 17},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, got, err := ParseReload(prev, []byte(tc.yaml), "fleetwatch.yaml", nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("changes (-want +got):\n%s", diff)
			}
			if next == nil || len(next.Pools) == 0 {
				t.Errorf("no configuration returned")
			}
		})
	}
}

func TestParseReloadRefuses(t *testing.T) {
	prev := mustParse(t, reloadBase)
	t.Run("restart keys", func(t *testing.T) {
		data := `prefix: other
nats:
  url: nats://127.0.0.1:4333
http:
  listen: 127.0.0.1:9090
pools:
  - id: p
`
		_, _, err := ParseReload(prev, []byte(data), "f.yaml", nil)
		var re *RestartError
		if !errors.As(err, &re) || !errors.Is(err, ErrNeedsRestart) {
			t.Fatalf("err = %v, want a RestartError", err)
		}
		want := []Change{
			{Key: "prefix", Op: OpChanged, Line: 1},
			{Key: "nats.url", Op: OpChanged, Line: 3},
			{Key: "http.listen", Op: OpChanged, Line: 5},
		}
		if diff := cmp.Diff(want, re.Changes); diff != "" {
			t.Errorf("restart changes (-want +got):\n%s", diff)
		}
	})
	t.Run("wrong type names key and line", func(t *testing.T) {
		data := reloadBase + "review:\n  schedule: [1, 2]\n"
		_, _, err := ParseReload(prev, []byte(data), "f.yaml", nil)
		var ce *Error
		if !errors.As(err, &ce) || ce.Line != 17 || !strings.HasPrefix(ce.Key, "review.schedule") {
			t.Fatalf("err = %v, want review.schedule at line 17", err)
		}
		data = "analyzer:\n  min_requests: many\n"
		_, _, err = ParseReload(prev, []byte(data), "f.yaml", nil)
		if !errors.As(err, &ce) || ce.Key != "analyzer.min_requests" || ce.Line != 2 {
			t.Fatalf("err = %v, want analyzer.min_requests at line 2", err)
		}
	})
	t.Run("adjust applies the command line", func(t *testing.T) {
		// A flag that sets http.listen in both keeps it unchanged.
		data := "http:\n  listen: 127.0.0.1:9999\n"
		adjust := func(c *Config) error { c.HTTP.Listen = "127.0.0.1:8080"; return nil }
		if _, _, err := ParseReload(prev, []byte(data), "f.yaml", adjust); errors.Is(err, ErrNeedsRestart) {
			t.Errorf("err = %v, want the flag's value to win over the file", err)
		}
	})
}
