package serve

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/alert"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// hookSink is a real webhook receiver on loopback.
type hookSink struct {
	*httptest.Server
	mu    sync.Mutex
	notes []alert.Notification
}

func newHookSink(t *testing.T) *hookSink {
	h := &hookSink{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n alert.Notification
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("webhook body %s: %v", body, err)
		}
		h.mu.Lock()
		h.notes = append(h.notes, n)
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookSink) has(event alert.Event, status, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.notes {
		if n.Event == event && n.Status == status && n.Key == key {
			return true
		}
	}
	return false
}

// TestExplainAndAlerts runs serve with a webhook receiver against a real
// NATS server: a backend that fails five times in a row opens, the webhook
// hears of the trip and of its pool being all open, and /api/explain says
// why, with the rule that fired and the transition.
func TestExplainAndAlerts(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	hook := newHookSink(t)
	yaml := "nats: {url: \"" + url + "\"}\nprobes: {disabled: true}\n" +
		"alerts:\n  rate_limit: 100\n  receivers:\n    - name: ops\n      url_env: OPS_HOOK\n"
	env := map[string]string{"OPS_HOOK": hook.URL + "/hook"}
	p := startServer(t, yaml, Options{Getenv: func(k string) string { return env[k] }})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	snaps := testkit.SubscribeSnapshots(t, nc)
	testkit.WaitConsuming(t, nc, snaps, "warmup", "w")
	for range 5 {
		testkit.Publish(t, nc, "fw.outcomes.edge-1", testkit.Event("solo", "bad", 500, 3))
	}
	testkit.Eventually(t, 10*time.Second, "solo/bad to open", func() bool {
		b, ok := snaps.Backend("solo", "bad")
		return ok && b.State == fleetwatch.StateOpen
	})
	testkit.Eventually(t, 10*time.Second, "the webhook to hear of the trip and the all-open pool", func() bool {
		return hook.has(alert.EventBreakerOpen, alert.StatusFiring, "breaker/solo/bad") &&
			hook.has(alert.EventPoolAllOpen, alert.StatusFiring, "pool/solo")
	})

	code, body := testkit.HTTPGet(t, p.httpURL+"/api/explain?pool=solo&backend=bad")
	if code != http.StatusOK {
		t.Fatalf("explain: %d %s", code, body)
	}
	var got Explained
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("explain: %v: %s", err, body)
	}
	if len(got.Backends) != 1 {
		t.Fatalf("explain: %d backends", len(got.Backends))
	}
	e := got.Backends[0]
	if e.State != fleetwatch.StateOpen || e.Verdict != fleetwatch.StateOpen || e.Counts["error"] != 5 || e.WeightParts.Fixed != "open" {
		t.Errorf("explanation: state %s verdict %s counts %v weight %+v", e.State, e.Verdict, e.Counts, e.WeightParts)
	}
	if !strings.Contains(e.Reason, "5 consecutive failures") || e.Rules[0].Rule != analyzer.CauseConsecutive {
		t.Errorf("reason %q, rules %+v", e.Reason, e.Rules)
	}
	testkit.Eventually(t, 10*time.Second, "the transition in the log", func() bool {
		all, _ := p.explain("solo", "bad", time.Now())
		return len(all.Backends) == 1 && len(all.Backends[0].Transitions) > 0 &&
			all.Backends[0].Transitions[0].To == fleetwatch.StateOpen && all.Backends[0].Transitions[0].Cause == analyzer.CauseConsecutive
	})

	for _, c := range []struct {
		query string
		code  int
	}{
		{"pool=solo", http.StatusOK},
		{"", http.StatusBadRequest},
		{"pool=nowhere", http.StatusNotFound},
		{"pool=solo&backend=nobody", http.StatusNotFound},
	} {
		if code, body := testkit.HTTPGet(t, p.httpURL+"/api/explain?"+c.query); code != c.code {
			t.Errorf("/api/explain?%s: %d %s, want %d", c.query, code, body, c.code)
		}
	}
	_, metricsText := testkit.HTTPGet(t, p.httpURL+"/metrics")
	if !strings.Contains(metricsText, `fleetwatch_alert_sent_total{receiver="ops"}`) {
		t.Errorf("/metrics lacks the receiver's counters")
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
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOOK": "https://hooks.example/x", "TOKEN": "t"}
	s, err := alertSettings(cfg, func(k string) string { return env[k] })
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
	if _, err := alertSettings(cfg, func(k string) string { return env[k] }); !errors.Is(err, alert.ErrInvalidSettings) ||
		!strings.Contains(err.Error(), "alerts.receivers[0].url_env") {
		t.Errorf("an unset url_env: %v", err)
	}
}
