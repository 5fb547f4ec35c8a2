package route

import (
	"bytes"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// shadowDecision is a fresh decision for the fakes b0, b1, b2 of pool
// llama: b0 open, b1 closed at weight 1, b2 closed at weight 0.2.
func shadowDecision(mode fleetwatch.Shadow, now time.Time) *fleetwatch.Snapshot {
	return &fleetwatch.Snapshot{
		V: 1, Pool: "llama", Epoch: "e", Seq: 1, At: fleetwatch.At(now), TTLMs: 3600_000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, Shadow: mode,
		Backends: []fleetwatch.Backend{
			{Backend: "b0", State: fleetwatch.StateOpen, OpenUntil: new(fleetwatch.At(now.Add(time.Hour))), Drift: fleetwatch.DriftOK},
			{Backend: "b1", State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftOK},
			{Backend: "b2", State: fleetwatch.StateClosed, Weight: 0.2, Drift: fleetwatch.DriftOK},
		},
	}
}

// TestRouteShadowModes routes 300 requests through a router over three
// healthy fakes for a decision in each mode, and checks where they went
// and what the router counted and exposes.
func TestRouteShadowModes(t *testing.T) {
	const n = 300
	backends := testkit.StartFakeBackends(t, 3)
	for _, mode := range []fleetwatch.Shadow{fleetwatch.ShadowOff, fleetwatch.ShadowBreakers, fleetwatch.ShadowObserve} {
		t.Run(string(mode)+"-", func(t *testing.T) {
			set := metrics.NewSet()
			rt, err := New(Settings{Pools: []Pool{llamaPool(backends)}, Metrics: set, Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(rt)
			defer func() { srv.Close(); rt.Close() }()
			rt.Apply(shadowDecision(mode, time.Now()))
			c := testkit.NewChatClient(srv.URL)
			got := map[string]int{}
			for i := range n {
				r, err := c.Post("/v1/completions", map[string]any{"model": "llama", "prompt": fmt.Sprint("p", i)})
				if err != nil || r.Status != 200 {
					t.Fatalf("request %d: %v status %d", i, err, r.Status)
				}
				got[r.Backend]++
			}
			st, ok := rt.ShadowStats("llama")
			if !ok || st.Mode != mode {
				t.Fatalf("ShadowStats = %+v, %v; want mode %q", st, ok, mode)
			}
			switch mode {
			case fleetwatch.ShadowOff:
				// The decisions: b0 nothing, b2 far less than b1.
				if got["b0"] != 0 || got["b2"]*2 >= got["b1"] {
					t.Errorf("off: %v, want none on b0 and b2 well below b1", got)
				}
				if st.Picks != 0 {
					t.Errorf("off: %+v, want no shadow pick", st)
				}
			case fleetwatch.ShadowBreakers:
				// The breaker is followed; the weights are not.
				if got["b0"] != 0 || got["b1"] < n/4 || got["b2"] < n/4 {
					t.Errorf("breakers: %v, want none on b0 and b1, b2 alike", got)
				}
				if st.Picks != n || st.Excluded() != 0 || st.Differed == 0 {
					t.Errorf("breakers: %+v, want %d picks, some different, none excluded", st, n)
				}
			case fleetwatch.ShadowObserve:
				// Nothing is followed: the open b0 takes its third.
				if got["b0"] < n/5 || got["b1"] < n/5 || got["b2"] < n/5 {
					t.Errorf("observe: %v, want all three alike", got)
				}
				if st.Picks != n || st.ExcludedOpen != uint64(got["b0"]) || st.Differed < st.ExcludedOpen {
					t.Errorf("observe: %+v, want %d picks and the %d on b0 excluded", st, n, got["b0"])
				}
			}
			var b bytes.Buffer
			set.WritePrometheus(&b)
			text := b.String()
			wantMode := string(mode)
			if mode == fleetwatch.ShadowOff {
				wantMode = "off"
			}
			for _, line := range []string{
				fmt.Sprintf(`fleetwatch_route_shadow_mode{pool="llama",mode=%q} 1`, wantMode),
			} {
				if !strings.Contains(text, line+"\n") {
					t.Errorf("/metrics lacks %s", line)
				}
			}
			counters := []string{
				fmt.Sprintf(`fleetwatch_route_shadow_picks_total{pool="llama"} %d`, st.Picks),
				fmt.Sprintf(`fleetwatch_route_shadow_differed_total{pool="llama"} %d`, st.Differed),
				fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="llama",reason="open"} %d`, st.ExcludedOpen),
				fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="llama",reason="weight"} %d`, st.ExcludedWeight),
				fmt.Sprintf(`fleetwatch_route_shadow_excluded_total{pool="llama",reason="shed"} %d`, st.ExcludedShed),
			}
			for _, line := range counters {
				if has := strings.Contains(text, line+"\n"); has != mode.On() {
					t.Errorf("/metrics has %s: %v, want %v", line, has, mode.On())
				}
			}
		})
	}
}

// TestRouteShadowConfig: the pool's Shadow is the mode until the first
// decision, which then decides; an unknown mode is a configuration error.
func TestRouteShadowConfig(t *testing.T) {
	backends := testkit.StartFakeBackends(t, 2)
	pool := llamaPool(backends)
	pool.Shadow = "observe"
	rt, err := New(Settings{Pools: []Pool{pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if st, _ := rt.ShadowStats("llama"); st.Mode != fleetwatch.ShadowObserve {
		t.Errorf("before any decision: mode %q, want observe", st.Mode)
	}
	snap := shadowDecision(fleetwatch.ShadowOff, time.Now())
	snap.Backends = snap.Backends[:2]
	rt.Apply(snap)
	if st, _ := rt.ShadowStats("llama"); st.Mode != fleetwatch.ShadowOff {
		t.Errorf("after a decision in force: mode %q, want off", st.Mode)
	}
	if _, ok := rt.ShadowStats("other"); ok {
		t.Error("ShadowStats of an unknown pool: ok")
	}
	pool.Shadow = "dry-run"
	if _, err := New(Settings{Pools: []Pool{pool}}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "shadow") {
		t.Errorf("New with shadow dry-run = %v, want ErrConfig naming shadow", err)
	}
}

// TestRouteShadowUntried: the third-attempt fallback follows the decisions
// the picker follows: in observe mode an open backend may take it.
func TestRouteShadowUntried(t *testing.T) {
	backends := testkit.StartFakeBackends(t, 3)
	rt, err := New(Settings{Pools: []Pool{llamaPool(backends)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	p := rt.core.pools["llama"]
	for _, tt := range []struct {
		mode fleetwatch.Shadow
		want string
	}{{fleetwatch.ShadowOff, ""}, {fleetwatch.ShadowBreakers, "b2"}, {fleetwatch.ShadowObserve, "b0"}} {
		snap := shadowDecision(tt.mode, time.Now())
		snap.Seq = p.applied.Load().Seq + 1
		snap.Backends[2].Weight = 0 // b0 open, b2 at weight 0, b1 tried
		rt.Apply(snap)
		if got := p.untried([]string{"b1"}); got != tt.want {
			t.Errorf("%q: untried([b1]) = %q, want %q", tt.mode, got, tt.want)
		}
	}
}
