package analyzer

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/google/go-cmp/cmp"
)

func TestSettingsWithDefaults(t *testing.T) {
	want := Settings{
		Window: 30 * time.Second, Bucket: time.Second, MinRequests: 20, FailureRate: 0.5,
		ConsecutiveFailures: 5, ConsecutiveStalls: 2, ConsecutiveThrottled: 5, ThrottledRunCounts: "hinted", ThrottleRate: 0.5, ThrottleRateCounts: "hinted", ThrottleRefuseRate: 0.9, SlowFactor: 5, EWMAAlpha: 0.2,
		IdleGap: 5 * time.Minute, OpenBase: 30 * time.Second, OpenMax: 5 * time.Minute,
		OpenJitter: 0.1, HalfOpenWeight: 0.05, HalfOpenSuccesses: 5, MaxOpenFraction: 0.5,
		Heartbeat: time.Second, LoadBeat: 250 * time.Millisecond, TTL: 5 * time.Second, Expiry: 10 * time.Minute, MaxWeightStep: 0.25,
		RecentMinRequests: 10, PoolThrottleHold: 0.25, LoadMaxAge: 3 * time.Second,
		ClientErrorRate: 0.5, ClientErrorMargin: 0.4,
	}
	if diff := cmp.Diff(want, Settings{}.WithDefaults()); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	custom := Settings{Window: time.Minute, MinRequests: 7}
	got := custom.WithDefaults()
	want.Window, want.MinRequests = time.Minute, 7
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("custom (-want +got):\n%s", diff)
	}
	if custom.Bucket != 0 {
		t.Error("WithDefaults mutated its receiver")
	}
}

func TestSettingsOverride(t *testing.T) {
	global := Settings{MinRequests: 50, FailureRate: 0.3}.WithDefaults()
	got := global.Override(Settings{FailureRate: 0.8, Heartbeat: 2 * time.Second})
	want := global
	want.FailureRate, want.Heartbeat = 0.8, 2*time.Second
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("override (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(global, global.Override(Settings{})); diff != "" {
		t.Errorf("empty override changed settings (-want +got):\n%s", diff)
	}
}

func TestSettingsValidate(t *testing.T) {
	tests := []struct {
		name    string
		s       Settings
		wantKey string // "" = valid
	}{
		{"zero value is valid", Settings{}, ""},
		{"negative window", Settings{Window: -5 * time.Second}, "analyzer.window"},
		{"negative bucket", Settings{Bucket: -1}, "analyzer.bucket"},
		{"bucket longer than window", Settings{Window: time.Second, Bucket: 2 * time.Second}, "analyzer.bucket"},
		{"window not a multiple of bucket", Settings{Window: 2500 * time.Millisecond}, "analyzer.window"},
		{"too many buckets", Settings{Window: 2 * time.Hour}, "analyzer.window"},
		{"negative min_requests", Settings{MinRequests: -1}, "analyzer.min_requests"},
		{"failure_rate above 1", Settings{FailureRate: 1.5}, "analyzer.failure_rate"},
		{"failure_rate of 1 is valid", Settings{FailureRate: 1}, ""},
		{"negative consecutive_failures", Settings{ConsecutiveFailures: -2}, "analyzer.consecutive_failures"},
		{"negative consecutive_stalls", Settings{ConsecutiveStalls: -1}, "analyzer.consecutive_stalls"},
		{"negative throttle_rate", Settings{ThrottleRate: -0.1}, "analyzer.throttle_rate"},
		{"slow_factor of at most 1", Settings{SlowFactor: 0.9}, "analyzer.slow_factor"},
		{"ewma_alpha above 1", Settings{EWMAAlpha: 2}, "analyzer.ewma_alpha"},
		{"negative idle_gap", Settings{IdleGap: -time.Second}, "analyzer.idle_gap"},
		{"negative open_base", Settings{OpenBase: -time.Second}, "analyzer.open_base"},
		{"open_max below open_base", Settings{OpenMax: 10 * time.Second}, "analyzer.open_max"},
		{"open_jitter above 0.5", Settings{OpenJitter: 0.7}, "analyzer.open_jitter"},
		{"negative open_jitter disables it", Settings{OpenJitter: -1}, ""},
		{"half_open_weight above 1", Settings{HalfOpenWeight: 1.1}, "analyzer.half_open_weight"},
		{"negative half_open_successes", Settings{HalfOpenSuccesses: -1}, "analyzer.half_open_successes"},
		{"max_open_fraction above 1", Settings{MaxOpenFraction: 1.5}, "analyzer.max_open_fraction"},
		{"negative heartbeat", Settings{Heartbeat: -time.Second}, "analyzer.heartbeat"},
		{"ttl below heartbeat", Settings{TTL: 500 * time.Millisecond}, "analyzer.ttl"},
		{"expiry below window", Settings{Expiry: 10 * time.Second}, "analyzer.expiry"},
		{"max_weight_step above 1", Settings{MaxWeightStep: 2}, "analyzer.max_weight_step"},
		{"negative recent_min_requests disables the quarter trip", Settings{RecentMinRequests: -1}, ""},
		{"pool_throttle_hold above 1", Settings{PoolThrottleHold: 1.5}, "analyzer.pool_throttle_hold"},
		{"pool_throttle_hold NaN", Settings{PoolThrottleHold: math.NaN()}, "analyzer.pool_throttle_hold"},
		{"negative pool_throttle_hold disables the hold", Settings{PoolThrottleHold: -1}, ""},
		{"throttled_run_counts unknown", Settings{ThrottledRunCounts: "bare"}, "analyzer.throttled_run_counts"},
		{"throttled_run_counts all", Settings{ThrottledRunCounts: RunCountsAll}, ""},
		{"throttle_rate_counts unknown", Settings{ThrottleRateCounts: "bare"}, "analyzer.throttle_rate_counts"},
		{"throttle_rate_counts all", Settings{ThrottleRateCounts: RunCountsAll}, ""},
		{"throttle_refuse_rate above 1", Settings{ThrottleRefuseRate: 1.1}, "analyzer.throttle_refuse_rate"},
		{"throttle_refuse_rate NaN", Settings{ThrottleRefuseRate: math.NaN()}, "analyzer.throttle_refuse_rate"},
		{"throttle_refuse_rate of 1 is valid", Settings{ThrottleRefuseRate: 1}, ""},
		{"negative throttle_refuse_rate turns the rule off", Settings{ThrottleRefuseRate: -1}, ""},
		{"client_error_rate above 1", Settings{ClientErrorRate: 1.2}, "analyzer.client_error_rate"},
		{"client_error_rate NaN", Settings{ClientErrorRate: math.NaN()}, "analyzer.client_error_rate"},
		{"negative client_error_rate turns the rule off", Settings{ClientErrorRate: -1}, ""},
		{"client_error_rate of 1 is valid", Settings{ClientErrorRate: 1}, ""},
		{"client_error_margin above 1", Settings{ClientErrorMargin: 1.5}, "analyzer.client_error_margin"},
		{"negative client_error_margin", Settings{ClientErrorMargin: -0.1}, "analyzer.client_error_margin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.wantKey == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSettings) {
				t.Fatalf("Validate = %v, want ErrInvalidSettings", err)
			}
			var se *SettingError
			if !errors.As(err, &se) {
				t.Fatalf("Validate = %T, want *SettingError", err)
			}
			if se.Key != tt.wantKey {
				t.Fatalf("key %q, want %q (error %v)", se.Key, tt.wantKey, err)
			}
		})
	}
	// The message style of STYLE.md item 2, checked once.
	var se *SettingError
	if errors.As(Settings{Window: -5 * time.Second}.Validate(), &se) && se.Error() != "analyzer.window = -5s: must be > 0" {
		t.Errorf("message %q", se.Error())
	}
}

func TestNewValidatesConfig(t *testing.T) {
	neg := -1.0
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
		wantKey string
	}{
		{"zero config", Config{}, nil, ""},
		{"global settings", Config{Settings: Settings{MinRequests: -3}}, ErrInvalidSettings, "analyzer.min_requests"},
		{"pool override", Config{Pools: []PoolConfig{{ID: "a"}, {ID: "b", Settings: Settings{FailureRate: 3}}}}, ErrInvalidSettings, "pools[1].analyzer.failure_rate"},
		{"override checked against global", Config{Settings: Settings{OpenBase: time.Minute}, Pools: []PoolConfig{{ID: "a", Settings: Settings{OpenMax: 50 * time.Second}}}}, ErrInvalidSettings, "pools[0].analyzer.open_max"},
		{"empty pool id", Config{Pools: []PoolConfig{{}}}, ErrInvalidConfig, "pools[0].id"},
		{"duplicate pool", Config{Pools: []PoolConfig{{ID: "a"}, {ID: "a"}}}, ErrInvalidConfig, "pools[1].id"},
		{"bad mode", Config{Pools: []PoolConfig{{ID: "a", Mode: "random"}}}, ErrInvalidConfig, "pools[0].mode"},
		{"bad all_open", Config{Pools: []PoolConfig{{ID: "a", AllOpen: "panic"}}}, ErrInvalidConfig, "pools[0].all_open"},
		{"negative tolerance", Config{Pools: []PoolConfig{{ID: "a", AffinityTolerance: -1}}}, ErrInvalidConfig, "pools[0].affinity_tolerance"},
		{"empty backend id", Config{Pools: []PoolConfig{{ID: "a", Backends: []BackendConfig{{ID: ""}}}}}, ErrInvalidConfig, "pools[0].backends[0].id"},
		{"duplicate backend", Config{Pools: []PoolConfig{{ID: "a", Backends: []BackendConfig{{ID: "x"}, {ID: "x"}}}}}, ErrInvalidConfig, "pools[0].backends[1].id"},
		{"negative cost", Config{Pools: []PoolConfig{{ID: "a", Backends: []BackendConfig{{ID: "x", CostPerMTok: &neg}}}}}, ErrInvalidConfig, "pools[0].backends[0].cost_per_mtok"},
		{"valid pools", Config{Pools: []PoolConfig{{ID: "a", Mode: fleetwatch.ModeFailover, AllOpen: fleetwatch.AllOpenSpread, Backends: []BackendConfig{{ID: "x"}, {ID: "y"}}}}}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.cfg)
			if tt.wantErr == nil {
				if err != nil || a == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New = %v, want %v", err, tt.wantErr)
			}
			var se *SettingError
			if !errors.As(err, &se) || se.Key != tt.wantKey {
				t.Fatalf("New = %v, want key %q", err, tt.wantKey)
			}
		})
	}
}
