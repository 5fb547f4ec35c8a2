// Package alert sends what an operator must hear about to webhooks: a
// breaker that opens, a pool whose backends are all open, a confirmed drift
// and the drift review digest. Three kinds of receiver are supported: a
// generic JSON webhook, a Slack-compatible incoming webhook (text and
// blocks) and Alertmanager's API (POST /api/v2/alerts), so that existing
// routing, silencing and inhibition apply.
//
// Alerts are grouped in episodes: a breaker episode starts when a backend
// opens and ends when it closes again (or expires), however often it
// reopens from half-open in between; a pool episode starts when every
// backend of the pool is open and ends when one closes again; a drift episode lasts while a backend is
// drifted. Each episode is notified once when it starts and once when it
// ends (resolved); Alertmanager receivers are re-sent the firing alerts every
// ResendInterval with an endsAt four intervals ahead, as Prometheus does, so
// an alert resolves by itself if fleetwatch goes away.
//
// The hooks (Transition, PoolState, Drift, Review) never block: each
// receiver has a bounded queue, and a notification that does not fit is
// dropped and counted. A receiver's worker sends at most RateLimit
// notifications per second (with bursts of Burst), retries a failed send with
// exponential backoff up to MaxAttempts, and counts every failed attempt.
package alert

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
)

// ErrInvalidSettings is wrapped by every error of New about its Settings.
var ErrInvalidSettings = errors.New("alert: invalid settings")

// Kind is a receiver's payload format.
type Kind string

// Receiver kinds.
const (
	KindWebhook      Kind = "webhook"      // fleetwatch's JSON (Notification)
	KindSlack        Kind = "slack"        // a Slack-compatible incoming webhook: text and blocks
	KindAlertmanager Kind = "alertmanager" // Alertmanager's POST /api/v2/alerts
)

// Event is what a notification is about.
type Event string

// Events.
const (
	EventBreakerOpen Event = "breaker_open"  // a backend's breaker opened (until it closes)
	EventPoolAllOpen Event = "pool_all_open" // every backend of a pool is open
	EventDrift       Event = "drift"         // a backend is drifted (confirmed, not suspect)
	EventReview      Event = "review"        // the drift review digest (no episode)
)

// Statuses of a Notification.
const (
	StatusFiring   = "firing"
	StatusResolved = "resolved"
)

// Receiver is one destination.
type Receiver struct {
	// Name identifies the receiver in metrics and logs. If empty, its
	// kind and index ("slack-0").
	Name string
	// Kind is the payload format. If empty, webhook.
	Kind Kind
	// URL is where notifications are posted; for Alertmanager its base URL
	// (http://alertmanager:9093), to which /api/v2/alerts is added.
	URL string
	// BearerToken, when set, is sent as "Authorization: Bearer TOKEN".
	BearerToken string
	// Events are the events sent to this receiver. If empty, all of them,
	// except the review digest for Alertmanager (a report, not an alert).
	Events []Event
}

// Settings configure a Notifier. The zero value works: no receiver, nothing
// is sent.
type Settings struct {
	Receivers []Receiver
	// QueueSize bounds each receiver's queue. If zero, 256 is used.
	QueueSize int
	// RateLimit is how many notifications per second a receiver is sent at
	// most, with bursts of Burst. If zero, 1 is used, and 10 for Burst.
	RateLimit float64
	Burst     int
	// Timeout bounds one HTTP request. If zero, 10s is used.
	Timeout time.Duration
	// MaxAttempts is how many times a notification is tried before it is
	// dropped. If zero, 5 is used.
	MaxAttempts int
	// Backoff is the wait before the first retry; it doubles at every
	// retry up to one minute. If zero, 1s is used.
	Backoff time.Duration
	// ResendInterval is how often Alertmanager receivers are sent the
	// firing alerts again. If zero, 1m is used.
	ResendInterval time.Duration
	// ExternalURL is the link notifications carry (the status page), and
	// Alertmanager's generatorURL. If empty, none.
	ExternalURL string
	// HTTPClient sends the notifications. If nil, a client without
	// redirects.
	HTTPClient *http.Client
	// Metrics receives the counters. If nil, a private set.
	Metrics *metrics.Set
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
}

// withDefaults returns s with its zero fields set.
func (s Settings) withDefaults() Settings {
	if s.QueueSize == 0 {
		s.QueueSize = 256
	}
	if s.RateLimit == 0 {
		s.RateLimit = 1
	}
	if s.Burst == 0 {
		s.Burst = 10
	}
	if s.Timeout == 0 {
		s.Timeout = 10 * time.Second
	}
	if s.MaxAttempts == 0 {
		s.MaxAttempts = 5
	}
	if s.Backoff == 0 {
		s.Backoff = time.Second
	}
	if s.ResendInterval == 0 {
		s.ResendInterval = time.Minute
	}
	if s.HTTPClient == nil {
		s.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if s.Metrics == nil {
		s.Metrics = metrics.NewSet()
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	return s
}

// Validate reports the first receiver or setting that is wrong, naming its
// key as in the configuration file ("alerts.receivers[1].url").
func (s Settings) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("%w: alerts.%s: %s", ErrInvalidSettings, key, fmt.Sprintf(format, args...))
	}
	names := map[string]bool{}
	for i, r := range s.Receivers {
		key := fmt.Sprintf("receivers[%d]", i)
		switch r.Kind {
		case "", KindWebhook, KindSlack, KindAlertmanager:
		default:
			return bad(key+".kind", "%q: want webhook, slack or alertmanager", r.Kind)
		}
		if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad(key+".url", "%q: want an http(s) URL", redact(r.URL))
		}
		name := receiverName(r, i)
		if names[name] {
			return bad(key+".name", "%q: duplicate receiver name", name)
		}
		names[name] = true
		for j, e := range r.Events {
			switch e {
			case EventBreakerOpen, EventPoolAllOpen, EventDrift, EventReview:
			default:
				return bad(fmt.Sprintf("%s.events[%d]", key, j), "%q: want breaker_open, pool_all_open, drift or review", e)
			}
		}
	}
	for _, c := range []struct {
		key string
		bad bool
	}{
		{"queue_size", s.QueueSize < 0}, {"rate_limit", s.RateLimit < 0}, {"burst", s.Burst < 0},
		{"timeout", s.Timeout < 0}, {"max_attempts", s.MaxAttempts < 0}, {"backoff", s.Backoff < 0},
		{"resend_interval", s.ResendInterval < 0},
	} {
		if c.bad {
			return bad(c.key, "must be >= 0 (0 means the default)")
		}
	}
	return nil
}

// redact keeps a URL's scheme and host: webhook URLs carry secrets in
// their paths.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(not a URL)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

func receiverName(r Receiver, i int) string {
	if r.Name != "" {
		return r.Name
	}
	kind := r.Kind
	if kind == "" {
		kind = KindWebhook
	}
	return fmt.Sprintf("%s-%d", kind, i)
}

// Notification is one message: an episode starting (firing) or ending
// (resolved), or a review digest. It is the generic webhook's JSON body.
type Notification struct {
	V      int    `json:"v"`
	Event  Event  `json:"event"`
	Status string `json:"status"`
	// Key names the episode: the same for its firing and resolved
	// notifications, and for every re-send.
	Key     string `json:"key"`
	Pool    string `json:"pool"`
	Backend string `json:"backend,omitempty"`
	// Summary is one line; Reason the sentence with the numbers; Cause the
	// analyzer's cause of a breaker transition.
	Summary  string          `json:"summary"`
	Reason   string          `json:"reason,omitempty"`
	Cause    string          `json:"cause,omitempty"`
	StartsAt fleetwatch.Time `json:"starts_at"`
	// EndsAt is when a resolved episode ended; null while firing.
	EndsAt *fleetwatch.Time `json:"ends_at"`
	URL    string           `json:"url,omitempty"`
	// Drift and Review carry the drift alert or the review digest.
	Drift  *fleetwatch.DriftAlert  `json:"drift,omitempty"`
	Review *fleetwatch.DriftReview `json:"review,omitempty"`
}

// Notifier turns transitions, pool states and drift alerts into
// notifications and delivers them. Its hooks are safe for concurrent use
// and never block.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): Run may be called once. A
// Run while it runs returns ErrRunning; a Run after Close, or after the
// first Run returned, returns ErrClosed. Close is idempotent and safe
// concurrently with Run.
type Notifier struct {
	s         Settings
	receivers []*receiver

	mu       sync.Mutex               // guards episodes, ran, running, closed
	episodes map[string]*Notification // active episodes by key (their firing notification)
	ran      bool                     // Run was called (and took the notifier)
	running  bool                     // that Run has not returned yet
	closed   bool

	deduplicated *metrics.Counter
	closeOnce    sync.Once
	stop         chan struct{}
}

// New returns a Notifier for s (validated, with defaults applied to a
// copy). It starts nothing: Run delivers.
func New(s Settings) (*Notifier, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	s = s.withDefaults()
	n := &Notifier{
		s:            s,
		episodes:     map[string]*Notification{},
		deduplicated: s.Metrics.NewCounter("fleetwatch_alert_deduplicated_total"),
		stop:         make(chan struct{}),
	}
	for i, r := range s.Receivers {
		n.receivers = append(n.receivers, newReceiver(r, receiverName(r, i), &n.s))
	}
	return n, nil
}

// Transition is the hook for breaker transitions: a backend that opens
// starts a breaker episode (a reopening from half-open continues it), one
// that closes or expires ends it.
func (n *Notifier) Transition(t analyzer.Transition) {
	key := "breaker/" + t.Pool + "/" + t.Backend
	switch t.To {
	case fleetwatch.StateOpen:
		summary := fmt.Sprintf("breaker open: %s in pool %s", t.Backend, t.Pool)
		if t.Cause == analyzer.CauseQuota {
			summary = fmt.Sprintf("out of quota: %s in pool %s", t.Backend, t.Pool)
		}
		n.start(key, Notification{
			Event: EventBreakerOpen, Pool: t.Pool, Backend: t.Backend, Cause: t.Cause, Reason: t.Reason,
			Summary: summary, StartsAt: fleetwatch.At(t.At),
		})
	case fleetwatch.StateClosed:
		n.end(key, t.At, t.Reason)
	case "":
		n.end(key, t.At, "expired: "+t.Reason)
	}
}

// PoolState is the hook for a pool's state: how many of its backends are
// open and how many closed, of total. A pool episode starts when every
// backend is open and ends when one is closed again (or the pool has none):
// a backend probing half-open is not enough, so a pool whose probes keep
// failing is one episode, not one per probe.
func (n *Notifier) PoolState(pool string, open, closed, total int, at time.Time) {
	key := "pool/" + pool
	switch {
	case total > 0 && open == total:
		n.start(key, Notification{
			Event: EventPoolAllOpen, Pool: pool,
			Summary:  fmt.Sprintf("every backend of pool %s is open", pool),
			Reason:   fmt.Sprintf("all %d backends open: routers follow the pool's all_open policy", total),
			StartsAt: fleetwatch.At(at),
		})
	case closed > 0 || total == 0:
		n.end(key, at, fmt.Sprintf("%d of %d backends closed again", closed, total))
	}
}

// Drift is the hook for drift alerts: drifted starts a drift episode, ok
// ends it; suspect is not confirmed and says nothing.
func (n *Notifier) Drift(a fleetwatch.DriftAlert) {
	key := "drift/" + a.Pool + "/" + a.Backend
	switch a.Status {
	case fleetwatch.DriftDrifted:
		n.start(key, Notification{
			Event: EventDrift, Pool: a.Pool, Backend: a.Backend, Reason: a.Reason,
			Summary:  fmt.Sprintf("drift confirmed: %s in pool %s (score %.2f, threshold %.2f)", a.Backend, a.Pool, a.Score, a.Threshold),
			StartsAt: a.At, Drift: &a,
		})
	case fleetwatch.DriftOK:
		n.end(key, a.At.Time, a.Reason)
	}
}

// Review is the hook for the drift review digest, sent as it is (there is
// no episode to deduplicate).
func (n *Notifier) Review(r fleetwatch.DriftReview) {
	summary := fmt.Sprintf("drift review: %d alerts, %d backends drifted", len(r.Alerts), len(r.BackendsDrifted))
	n.enqueue(Notification{
		V: 1, Event: EventReview, Status: StatusFiring, Key: "review/" + fleetwatch.FormatTime(r.At.Time),
		Summary: summary, Reason: r.Summary, StartsAt: r.At, EndsAt: &r.At, URL: n.s.ExternalURL, Review: &r,
	})
}

// start notifies a firing episode unless it is already active.
func (n *Notifier) start(key string, note Notification) {
	note.V, note.Key, note.Status, note.URL = 1, key, StatusFiring, n.s.ExternalURL
	n.mu.Lock()
	if _, active := n.episodes[key]; active {
		n.mu.Unlock()
		n.deduplicated.Inc()
		return
	}
	n.episodes[key] = &note
	n.mu.Unlock()
	n.enqueue(note)
}

// end notifies the end of an active episode.
func (n *Notifier) end(key string, at time.Time, reason string) {
	n.mu.Lock()
	firing, active := n.episodes[key]
	delete(n.episodes, key)
	n.mu.Unlock()
	if !active {
		return
	}
	note := *firing
	note.Status = StatusResolved
	ends := fleetwatch.At(at)
	note.EndsAt = &ends
	if reason != "" {
		note.Reason = reason
	}
	n.enqueue(note)
}

// Active returns the firing episodes' notifications, for the re-sends and
// the tests.
func (n *Notifier) Active() []Notification {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Notification, 0, len(n.episodes))
	for _, e := range n.episodes {
		out = append(out, *e)
	}
	return out
}

// enqueue hands note to every receiver that takes its event, without
// blocking.
func (n *Notifier) enqueue(note Notification) {
	for _, r := range n.receivers {
		if r.wants(note.Event) {
			r.offer(note)
		}
	}
}
