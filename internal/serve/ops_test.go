package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/alert"
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
