package config

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/feed/p2c"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

// ms_per_cost_unit reaches the pool's picker as the score's exchange rate
// (its inverse, CostWeightPerMs); absent, the caller's setting stays.
func TestRoutePoolsCostExchangeRate(t *testing.T) {
	c, err := Parse([]byte(`pools:
  - id: cheap-aware
    ms_per_cost_unit: 250
    backends: [{id: a, url: "http://127.0.0.1:1", cost_per_mtok: 0.5}]
  - id: cost-blind
    backends: [{id: b, url: "http://127.0.0.1:2"}]
`), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pools := c.RoutePools(func(string) string { return "" }, p2c.Settings{RetryRatio: 0.3})
	if len(pools) != 2 {
		t.Fatalf("pools = %+v", pools)
	}
	if got := pools[0].Picker.CostWeightPerMs; math.Abs(got-1.0/250) > 1e-15 {
		t.Errorf("cheap-aware CostWeightPerMs = %v, want 1/250", got)
	}
	if got := pools[1].Picker.CostWeightPerMs; got != 0 {
		t.Errorf("cost-blind CostWeightPerMs = %v, want 0 (the picker's default: cost ignored)", got)
	}
	for _, p := range pools {
		if p.Picker.RetryRatio != 0.3 {
			t.Errorf("pool %s lost the caller's picker settings: %+v", p.ID, p.Picker)
		}
	}
}

// score, choices, scan_routers, load_stale and load_running_weight reach
// the pool's picker; absent, the caller's settings stay.
func TestRoutePoolsPickerKeys(t *testing.T) {
	c, err := Parse([]byte(`pools:
  - id: tuned
    score: inflight
    choices: 2
    scan_routers: 12
    load_stale: 500ms
    load_running_weight: 0
    backends: [{id: a, url: "http://127.0.0.1:1"}]
  - id: plain
    backends: [{id: b, url: "http://127.0.0.1:2"}]
`), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pools := c.RoutePools(func(string) string { return "" }, p2c.Settings{Choices: 5})
	tuned, plain := pools[0].Picker, pools[1].Picker
	if tuned.Score.Name != "inflight" || tuned.Score.Rank == nil || tuned.Choices != 2 || tuned.ScanRouters != 12 || tuned.LoadStale != 500*time.Millisecond || tuned.RunningWeight != -1 {
		t.Errorf("tuned pool's picker: score %q, choices %d, scan_routers %d, load_stale %v, running weight %v",
			tuned.Score.Name, tuned.Choices, tuned.ScanRouters, tuned.LoadStale, tuned.RunningWeight)
	}
	if plain.Score.Rank != nil || plain.Choices != 5 || plain.ScanRouters != 0 || plain.LoadStale != 0 || plain.RunningWeight != 0 {
		t.Errorf("plain pool's picker: score %q, choices %d, scan_routers %d, load_stale %v, running weight %v; want the caller's",
			plain.Score.Name, plain.Choices, plain.ScanRouters, plain.LoadStale, plain.RunningWeight)
	}
}

// The route block's keys reach route.Settings; absent, the caller's values
// stay (zero: route's defaults).
func TestRouteSettingsStallDeadline(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       route.Settings
	}{
		{"absent", "prefix: fw\n", route.Settings{MaxAttempts: 2}},
		{"both", "route:\n  stall_floor: 3s\n  stall_multiple: 6\n",
			route.Settings{MaxAttempts: 2, StallFloor: 3 * time.Second, StallMultiple: 6}},
		{"off", "route:\n  stall_floor: -1s\n", route.Settings{MaxAttempts: 2, StallFloor: -time.Second}},
		{"knobs", "route:\n  max_attempts: 5\n  idle_gap: 1m\n  max_body_bytes: 1024\n  header_timeout: 2s\n  prefix_from: none\n",
			route.Settings{MaxAttempts: 5, IdleGap: time.Minute, MaxBody: 1024, HeaderTimeout: 2 * time.Second, PrefixFrom: route.PrefixNone}},
		{"one attempt", "route:\n  max_attempts: 1\n", route.Settings{MaxAttempts: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), "fw.yaml")
			if err != nil {
				t.Fatal(err)
			}
			got := c.RouteSettings(route.Settings{MaxAttempts: 2})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

// route.retry_ratio reaches every pool's picker, over the caller's.
func TestRoutePoolsRetryRatio(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want float64
	}{
		{"", 0.5},
		{"route: {retry_ratio: 0.1}\n", 0.1},
		{"route: {retry_ratio: -1}\n", -1},
	} {
		c, err := Parse([]byte(tc.yaml+"pools:\n  - id: a\n  - id: b\n"), "fw.yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range c.RoutePools(func(string) string { return "" }, p2c.Settings{RetryRatio: 0.5}) {
			if p.Picker.RetryRatio != tc.want {
				t.Errorf("%q: pool %s retry ratio %v, want %v", tc.yaml, p.ID, p.Picker.RetryRatio, tc.want)
			}
		}
	}
}
