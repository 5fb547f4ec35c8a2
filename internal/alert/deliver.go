package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// Lifecycle errors of the Notifier (docs/DECISIONS.md "Lifecycles").
var (
	// ErrRunning is returned by Run while the first Run runs.
	ErrRunning = errors.New("alert: already running")
	// ErrClosed is returned by Run after Close, or after the first Run
	// returned (Run may be called once).
	ErrClosed = errors.New("alert: closed")
)

// errPermanent marks an answer that a retry cannot change (a 4xx other than
// 408 and 429: the payload or the URL is wrong).
var errPermanent = errors.New("alert: rejected")

// receiver is one destination with its queue and counters.
type receiver struct {
	r     Receiver
	name  string
	s     *Settings
	queue chan Notification

	sent, failures                  *metrics.Counter
	queueFull, gaveUp, rejectedDrop *metrics.Counter
}

func newReceiver(r Receiver, name string, s *Settings) *receiver {
	if r.Kind == "" {
		r.Kind = KindWebhook
	}
	label := fmt.Sprintf("{receiver=%s}", promlabel.Quote(name))
	dropped := func(reason string) *metrics.Counter {
		return s.Metrics.NewCounter(fmt.Sprintf("fleetwatch_alert_dropped_total{receiver=%s,reason=%q}", promlabel.Quote(name), reason))
	}
	rc := &receiver{
		r: r, name: name, s: s,
		queue:        make(chan Notification, s.QueueSize),
		sent:         s.Metrics.NewCounter("fleetwatch_alert_sent_total" + label),
		failures:     s.Metrics.NewCounter("fleetwatch_alert_send_failures_total" + label),
		queueFull:    dropped("queue_full"),
		gaveUp:       dropped("gave_up"),
		rejectedDrop: dropped("rejected"),
	}
	s.Metrics.NewGauge("fleetwatch_alert_queue_length"+label, func() float64 { return float64(len(rc.queue)) })
	return rc
}

// wants reports whether the receiver takes notifications of event e.
func (rc *receiver) wants(e Event) bool {
	if len(rc.r.Events) > 0 {
		return slices.Contains(rc.r.Events, e)
	}
	return !(rc.r.Kind == KindAlertmanager && e == EventReview)
}

// offer queues note, or drops and counts it when the queue is full.
func (rc *receiver) offer(note Notification) {
	select {
	case rc.queue <- note:
	default:
		rc.queueFull.Inc()
	}
}

// Run delivers the queued notifications until ctx ends, and re-sends the
// firing episodes to Alertmanager receivers every ResendInterval. What is
// still queued when ctx ends is not sent. It returns nil then. Run may be
// called once: it returns ErrRunning while that Run runs, and ErrClosed
// after it returned or after Close.
func (n *Notifier) Run(ctx context.Context) error {
	n.mu.Lock()
	switch {
	case n.closed || (n.ran && !n.running):
		n.mu.Unlock()
		return ErrClosed
	case n.running:
		n.mu.Unlock()
		return ErrRunning
	}
	n.ran, n.running = true, true
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.running = false
		n.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { // Close ends Run as ctx does
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	})
	for _, rc := range n.receivers {
		wg.Go(func() { rc.work(ctx) })
	}
	if slices.ContainsFunc(n.receivers, func(rc *receiver) bool { return rc.r.Kind == KindAlertmanager }) {
		wg.Go(func() { n.resend(ctx) })
	}
	wg.Wait()
	return nil
}

// Close stops a running Run (without waiting for it) and makes every later
// Run return ErrClosed. It is idempotent, safe concurrently with Run, and
// returns nil.
func (n *Notifier) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		close(n.stop)
	})
	return nil
}

// resend queues the firing episodes for the Alertmanager receivers every
// ResendInterval: Alertmanager resolves an alert that is not sent again
// before its endsAt.
func (n *Notifier) resend(ctx context.Context) {
	tick := time.NewTicker(n.s.ResendInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, note := range n.Active() {
			for _, rc := range n.receivers {
				if rc.r.Kind == KindAlertmanager && rc.wants(note.Event) {
					rc.offer(note)
				}
			}
		}
	}
}

// work sends the queued notifications one at a time, within the rate
// limit, until ctx ends.
func (rc *receiver) work(ctx context.Context) {
	bucket := tokenBucket{rate: rc.s.RateLimit, burst: float64(rc.s.Burst)}
	for {
		var note Notification
		select {
		case <-ctx.Done():
			return
		case note = <-rc.queue:
		}
		if wait := bucket.take(rc.s.Now()); wait > 0 && !sleep(ctx, wait) {
			return
		}
		rc.deliver(ctx, note)
	}
}

// deliver sends note, retrying with exponential backoff, and counts the
// outcome.
func (rc *receiver) deliver(ctx context.Context, note Notification) {
	body, err := rc.payload(note)
	if err != nil { // a programmer's error: the types always encode
		rc.s.Logf("alert %s: encode: %v", rc.name, err)
		rc.rejectedDrop.Inc()
		return
	}
	backoff := rc.s.Backoff
	for attempt := 1; ; attempt++ {
		err := rc.post(ctx, body)
		if err == nil {
			rc.sent.Inc()
			return
		}
		if ctx.Err() != nil {
			return
		}
		rc.failures.Inc()
		switch {
		case errors.Is(err, errPermanent):
			rc.s.Logf("alert %s: %s %s not accepted: %v", rc.name, note.Event, note.Status, err)
			rc.rejectedDrop.Inc()
			return
		case attempt >= rc.s.MaxAttempts:
			rc.s.Logf("alert %s: %s %s dropped after %d attempts: %v", rc.name, note.Event, note.Status, attempt, err)
			rc.gaveUp.Inc()
			return
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// post sends one request.
func (rc *receiver) post(ctx context.Context, body []byte) error {
	target := rc.r.URL
	if rc.r.Kind == KindAlertmanager {
		target = strings.TrimSuffix(target, "/") + "/api/v2/alerts"
	}
	ctx, cancel := context.WithTimeout(ctx, rc.s.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fleetwatch-alert")
	if rc.r.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+rc.r.BearerToken)
	}
	resp, err := rc.s.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests:
		return fmt.Errorf("%w: HTTP %d", errPermanent, code)
	default:
		return fmt.Errorf("alert: HTTP %d", code)
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tokenBucket is the rate limit of one receiver: rate tokens per second up
// to burst. It is used by one goroutine.
type tokenBucket struct {
	rate, burst float64
	tokens      float64
	at          time.Time
}

// take takes a token at now and returns how long to wait before sending
// (0 when a token was there).
func (b *tokenBucket) take(now time.Time) time.Duration {
	if b.at.IsZero() {
		b.tokens, b.at = b.burst, now
	}
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = min(b.burst, b.tokens+dt*b.rate)
		b.at = now
	}
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// payload encodes note in the receiver's format.
func (rc *receiver) payload(note Notification) ([]byte, error) {
	switch rc.r.Kind {
	case KindSlack:
		return json.Marshal(slackMessage(note))
	case KindAlertmanager:
		return json.Marshal([]amAlert{alertmanagerAlert(note, rc.s.Now(), rc.s.ResendInterval)})
	}
	return json.Marshal(note)
}

// amAlert is one alert of Alertmanager's POST /api/v2/alerts
// (postableAlert in its OpenAPI specification).
type amAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     string            `json:"startsAt"`
	EndsAt       string            `json:"endsAt,omitempty"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// alertNames are the alertname labels of the events.
var alertNames = map[Event]string{
	EventBreakerOpen: "FleetwatchBreakerOpen",
	EventPoolAllOpen: "FleetwatchPoolAllOpen",
	EventDrift:       "FleetwatchDrift",
	EventReview:      "FleetwatchDriftReview",
}

// alertmanagerAlert maps a notification to an Alertmanager alert. The
// labels identify the episode (Alertmanager deduplicates by labels); a
// firing alert ends four re-send intervals from now unless it is sent
// again, a resolved one at its end.
func alertmanagerAlert(note Notification, now time.Time, resend time.Duration) amAlert {
	a := amAlert{
		Labels:      map[string]string{"alertname": alertNames[note.Event], "source": "fleetwatch", "pool": note.Pool},
		Annotations: map[string]string{"summary": note.Summary},
		StartsAt:    fleetwatch.FormatTime(note.StartsAt.Time),
		EndsAt:      fleetwatch.FormatTime(now.Add(4 * resend)),
	}
	if note.Backend != "" {
		a.Labels["backend"] = note.Backend
	}
	switch note.Event {
	case EventPoolAllOpen:
		a.Labels["severity"] = "critical"
	default:
		a.Labels["severity"] = "warning"
	}
	if note.Reason != "" {
		a.Annotations["description"] = note.Reason
	}
	if note.Cause != "" {
		a.Annotations["cause"] = note.Cause
	}
	if note.EndsAt != nil {
		a.EndsAt = fleetwatch.FormatTime(note.EndsAt.Time)
	}
	a.GeneratorURL = note.URL
	return a
}

// slack is a Slack-compatible incoming-webhook message: text for
// notifications and clients without blocks, and blocks.
type slack struct {
	Text   string       `json:"text"`
	Blocks []slackBlock `json:"blocks"`
}

type slackBlock struct {
	Type     string      `json:"type"`
	Text     *slackText  `json:"text,omitempty"`
	Elements []slackText `json:"elements,omitempty"`
}

type slackText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// slackEscape escapes the three characters Slack's mrkdwn gives meaning
// to: ids and reasons are arbitrary strings.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

func slackMessage(note Notification) slack {
	status := "FIRING"
	if note.Status == StatusResolved {
		status = "RESOLVED"
	}
	if note.Event == EventReview {
		status = "REVIEW"
	}
	head := fmt.Sprintf("[%s] fleetwatch: %s", status, note.Summary)
	body := "*" + slackEscape.Replace(head) + "*"
	if note.Reason != "" {
		body += "\n" + slackEscape.Replace(note.Reason)
	}
	if note.Review != nil {
		for _, d := range note.Review.BackendsDrifted {
			body += "\n• " + slackEscape.Replace(d.Pool+" / "+d.Backend)
		}
	}
	context := fmt.Sprintf("since %s", fleetwatch.FormatTime(note.StartsAt.Time))
	if note.EndsAt != nil && note.Event != EventReview {
		context += ", ended " + fleetwatch.FormatTime(note.EndsAt.Time)
	}
	if note.URL != "" {
		context += " · <" + note.URL + "|status page>"
	}
	return slack{
		Text: head,
		Blocks: []slackBlock{
			{Type: "section", Text: &slackText{Type: "mrkdwn", Text: body}},
			{Type: "context", Elements: []slackText{{Type: "mrkdwn", Text: context}}},
		},
	}
}
