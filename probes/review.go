package probes

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	fleetwatch "github.com/fleetwatch/fleetwatch"
)

// BuildReview gathers the alerts in [since, now) into the review digest.
// statuses, when known (serve knows them, the `drift review` command reads
// only the stream), decide which backends are drifted now; otherwise each
// backend's latest alert does. Probe errors are counted in the summary.
func BuildReview(now, since time.Time, alerts []fleetwatch.DriftAlert, statuses []BackendStatus) fleetwatch.DriftReview {
	var in []fleetwatch.DriftAlert
	for _, a := range alerts {
		if !a.At.Before(since) && a.At.Before(now) {
			in = append(in, a)
		}
	}
	slices.SortStableFunc(in, func(a, b fleetwatch.DriftAlert) int {
		return cmp.Or(a.At.Compare(b.At.Time), strings.Compare(a.Pool, b.Pool), strings.Compare(a.Backend, b.Backend))
	})
	r := fleetwatch.DriftReview{V: fleetwatch.ProtocolVersion, At: fleetwatch.At(now), Since: fleetwatch.At(since),
		Alerts: in, BackendsDrifted: []fleetwatch.DriftedEntry{}}
	if r.Alerts == nil {
		r.Alerts = []fleetwatch.DriftAlert{}
	}
	latest := latestAlerts(alerts, now)
	errs := 0
	if statuses != nil {
		for _, s := range statuses {
			errs += s.Errors
			if s.Status != fleetwatch.DriftSuspect && s.Status != fleetwatch.DriftDrifted {
				continue
			}
			e := fleetwatch.DriftedEntry{Pool: s.Pool, Backend: s.Backend, Status: s.Status, Since: fleetwatch.At(s.Since), Score: finite(s.Score)}
			if a, ok := latest[[2]string{s.Pool, s.Backend}]; ok && a.Status == s.Status {
				e.Score = a.Score
			}
			r.BackendsDrifted = append(r.BackendsDrifted, e)
		}
	} else {
		for _, k := range sortedPairs(latest) {
			a := latest[k]
			if a.Status == fleetwatch.DriftSuspect || a.Status == fleetwatch.DriftDrifted {
				r.BackendsDrifted = append(r.BackendsDrifted, fleetwatch.DriftedEntry{Pool: a.Pool, Backend: a.Backend, Status: a.Status, Since: a.At, Score: a.Score})
			}
		}
	}
	slices.SortFunc(r.BackendsDrifted, func(a, b fleetwatch.DriftedEntry) int {
		return cmp.Or(strings.Compare(a.Pool, b.Pool), strings.Compare(a.Backend, b.Backend))
	})
	drifted, suspect := 0, 0
	var names []string
	for _, e := range r.BackendsDrifted {
		if e.Status == fleetwatch.DriftDrifted {
			drifted++
		} else {
			suspect++
		}
		names = append(names, fmt.Sprintf("%s/%s (%s)", e.Pool, e.Backend, e.Status))
	}
	r.Summary = fmt.Sprintf("%d alert(s) since %s; %d backend(s) drifted, %d suspect", len(in), fleetwatch.FormatTime(since), drifted, suspect)
	if len(names) > 0 {
		r.Summary += ": " + strings.Join(names, ", ")
	}
	if errs > 0 {
		r.Summary += fmt.Sprintf("; %d probe error(s) (not verdicts)", errs)
	}
	r.Summary += spendSummary(statuses)
	return r
}

// spendSummary is the digest summary's part on the probes' spend of the
// last 24 hours: tokens, money where every spending backend's price is
// known, and the backends whose last cycle skipped tiers for the budget.
func spendSummary(statuses []BackendStatus) string {
	var tokens int64
	var money float64
	priced, spending, skipping := true, 0, 0
	for _, s := range statuses {
		b := s.Budget
		if b == nil {
			continue
		}
		if b.SpentTotal > 0 {
			spending++
			tokens += b.SpentTotal
			if b.CostTotal != nil {
				money += *b.CostTotal
			} else {
				priced = false
			}
		}
		if b.SkipNote() != "" {
			skipping++
		}
	}
	if spending == 0 && skipping == 0 {
		return ""
	}
	out := fmt.Sprintf("; probes spent %d tokens in the last 24 h", tokens)
	if priced && spending > 0 {
		out += fmt.Sprintf(" (cost %.4g)", money)
	}
	if skipping > 0 {
		out += fmt.Sprintf("; %d backend(s) skipped probe tiers for the budget", skipping)
	}
	return out
}

// writeSpend writes the Markdown table of the probes' spend: per backend,
// the budget, the tokens of the last 24 hours by tier, the money where
// the price is known, and the tiers skipped.
func writeSpend(b *strings.Builder, statuses []BackendStatus) {
	var rows []BackendStatus
	for _, s := range statuses {
		if s.Budget != nil && (s.Budget.TokensPerDay > 0 || s.Budget.SpentTotal > 0) {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n## Probe spend (last 24 h)\n\n| pool | backend | budget/day | teacher | sampled | tool-call | total | cost | skipped |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range rows {
		bs := s.Budget
		budget := "unlimited"
		if bs.TokensPerDay > 0 {
			budget = fmt.Sprint(bs.TokensPerDay)
		}
		cost := "-"
		if bs.CostTotal != nil {
			cost = fmt.Sprintf("%.4g", *bs.CostTotal)
		}
		skipped := "-"
		if note := bs.SkipNote(); note != "" {
			skipped = note
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %d | %d | %d | %s | %s |\n", mdCell(s.Pool), mdCell(s.Backend), budget,
			bs.Spent[TierTeacher], bs.Spent[TierSampled], bs.Spent[TierTools], bs.SpentTotal, cost, skipped)
	}
}

// latestAlerts is each backend's most recent alert before now.
func latestAlerts(alerts []fleetwatch.DriftAlert, now time.Time) map[[2]string]fleetwatch.DriftAlert {
	m := map[[2]string]fleetwatch.DriftAlert{}
	for _, a := range alerts {
		if !a.At.Before(now) {
			continue
		}
		k := [2]string{a.Pool, a.Backend}
		if old, ok := m[k]; !ok || !a.At.Before(old.At.Time) {
			m[k] = a
		}
	}
	return m
}

func sortedPairs[V any](m map[[2]string]V) [][2]string {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	return keys
}

// RenderMarkdown renders a digest as Markdown: a table per pool (backend,
// status, since when, score vs threshold, evidence, metadata change), the
// alerts of the period, and the probe errors when statuses are known.
func RenderMarkdown(r fleetwatch.DriftReview, statuses []BackendStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Drift review %s\n\n", r.At.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Period: %s to %s. %s.\n", fleetwatch.FormatTime(r.Since.Time), fleetwatch.FormatTime(r.At.Time), r.Summary)

	type row struct {
		backend, status, since, score, evidence, meta string
	}
	pools := map[string]map[string]*row{}
	get := func(pool, backend string) *row {
		if pools[pool] == nil {
			pools[pool] = map[string]*row{}
		}
		if pools[pool][backend] == nil {
			pools[pool][backend] = &row{backend: backend, status: "ok", evidence: "-", meta: "-", score: "-", since: "-"}
		}
		return pools[pool][backend]
	}
	for _, s := range statuses {
		rw := get(s.Pool, s.Backend)
		rw.status = string(s.Status)
		if s.Status != fleetwatch.DriftOK && s.Status != fleetwatch.DriftUnknown && s.Peers == s.Status && s.Baseline != s.Status {
			rw.status += " (peers)"
		}
		if s.Enrolling {
			rw.status = fmt.Sprintf("enrolling (%d cycles)", s.EnrolCycles)
		}
		if !s.Since.IsZero() {
			rw.since = fleetwatch.FormatTime(s.Since)
		}
	}
	latest := latestAlerts(r.Alerts, r.At.Add(time.Millisecond))
	for _, k := range sortedPairs(latest) {
		a := latest[k]
		rw := get(a.Pool, a.Backend)
		if statuses == nil {
			rw.status = string(a.Status)
			if a.Against == fleetwatch.AgainstPeers && a.Status != fleetwatch.DriftOK {
				rw.status += " (peers)"
			}
			rw.since = fleetwatch.FormatTime(a.At.Time)
		}
		rw.score = fmt.Sprintf("%.3g / %.3g", a.Score, a.Threshold)
		rw.evidence = evidenceText(a)
		rw.meta = metadataText(a.Evidence)
	}
	for _, pool := range slices.Sorted(maps.Keys(pools)) {
		fmt.Fprintf(&b, "\n## Pool %s\n\n", mdCell(pool))
		b.WriteString("| backend | status | since | score / threshold | evidence | metadata change |\n|---|---|---|---|---|---|\n")
		for _, id := range slices.Sorted(maps.Keys(pools[pool])) {
			rw := pools[pool][id]
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", mdCell(rw.backend), mdCell(rw.status), rw.since, rw.score, mdCell(rw.evidence), mdCell(rw.meta))
		}
	}
	b.WriteString("\n## Alerts in the period\n\n")
	if len(r.Alerts) == 0 {
		b.WriteString("None.\n")
	}
	for _, a := range r.Alerts {
		fmt.Fprintf(&b, "- %s %s/%s: %s -> **%s** (against %s): %s\n", fleetwatch.FormatTime(a.At.Time), mdText(a.Pool), mdText(a.Backend),
			a.Previous, a.Status, a.Against, mdText(a.Reason))
	}
	var errRows []BackendStatus
	for _, s := range statuses {
		if s.Errors > 0 {
			errRows = append(errRows, s)
		}
	}
	if len(errRows) > 0 {
		b.WriteString("\n## Probe errors (not verdicts)\n\n| pool | backend | errors | kind | last error | at |\n|---|---|---|---|---|---|\n")
		for _, s := range errRows {
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", mdCell(s.Pool), mdCell(s.Backend), s.Errors, s.LastErrorKind,
				mdCell(s.LastError), fleetwatch.FormatTime(s.LastErrorAt))
		}
	}
	writeSpend(&b, statuses)
	return b.String()
}

func evidenceText(a fleetwatch.DriftAlert) string {
	e := a.Evidence
	var parts []string
	if e.ExactMatchRate != nil {
		parts = append(parts, fmt.Sprintf("exact match %.2f of %d prompts", *e.ExactMatchRate, e.Prompts))
	}
	if e.MeanAbsLogprobDelta != nil {
		label := "mean |delta logprob|"
		if a.Against == fleetwatch.AgainstPeers {
			label = "peer distance"
		}
		parts = append(parts, fmt.Sprintf("%s %.4f nats", label, *e.MeanAbsLogprobDelta))
	}
	if v, ok := e.Extra["mmd_p_value"].(float64); ok {
		parts = append(parts, fmt.Sprintf("MMD p %.3g", v))
	}
	if v, ok := e.Extra["action"].(string); ok {
		parts = append(parts, v)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func metadataText(e fleetwatch.DriftEvidence) string {
	var parts []string
	if v, ok := e.Extra["metadata_changes"].([]string); ok {
		parts = append(parts, v...)
	} else if v, ok := e.Extra["metadata_changes"].([]any); ok {
		for _, x := range v {
			parts = append(parts, fmt.Sprint(x))
		}
	} else if e.FingerprintBefore != nil && e.FingerprintAfter != nil && *e.FingerprintBefore != *e.FingerprintAfter {
		parts = append(parts, fmt.Sprintf("fingerprint %q -> %q", *e.FingerprintBefore, *e.FingerprintAfter))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// mdCell escapes a table cell: pipes and line breaks would break the row.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ", "`", "'").Replace(s)
}

func mdText(s string) string { return strings.NewReplacer("\n", " ", "\r", " ").Replace(s) }

// ReviewSettings configure a Reviewer. Alerts is required.
type ReviewSettings struct {
	// Schedule is the cron spec. If empty, "0 9 * * 1-5".
	Schedule string
	// Dir receives the Markdown digests. If empty, none are written.
	Dir string
	// LastReview returns when the previous review ran (false: never). If
	// nil, the Reviewer remembers its own last run and starts from
	// DefaultSince before now.
	LastReview func(ctx context.Context) (time.Time, bool, error)
	// DefaultSince is how far back the first review looks. If zero, 7 days.
	DefaultSince time.Duration
	// Alerts returns the alerts at or after since. Required.
	Alerts func(ctx context.Context, since time.Time) ([]fleetwatch.DriftAlert, error)
	// Statuses returns the current statuses (nil: unknown).
	Statuses func() []BackendStatus
	// Publish publishes the digest (nil: not published).
	Publish func(ctx context.Context, r fleetwatch.DriftReview) error
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Logf logs. If nil, nothing.
	Logf func(format string, args ...any)
}

// Reviewer runs the scheduled drift review.
//
// Lifecycle (docs/DECISIONS.md "Lifecycles"): a Run while another runs
// returns ErrRunning; a Run after Close returns ErrClosed; Close is
// idempotent and safe concurrently with Run. Run may be called again after
// a Run returned.
type Reviewer struct {
	s     ReviewSettings
	sched cron.Schedule

	mu      sync.Mutex // guards last, closed, running, cancel
	last    time.Time
	closed  bool
	running bool               // a Run runs
	cancel  context.CancelFunc // the running Run's; nil when none runs
}

// NewReviewer validates s and returns a Reviewer.
func NewReviewer(s ReviewSettings) (*Reviewer, error) {
	if s.Alerts == nil {
		return nil, fmt.Errorf("probes: review: Alerts is required")
	}
	if s.Schedule == "" {
		s.Schedule = "0 9 * * 1-5"
	}
	if s.DefaultSince == 0 {
		s.DefaultSince = 7 * 24 * time.Hour
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	sched, err := ParseSchedule(s.Schedule)
	if err != nil {
		return nil, fmt.Errorf("probes: review schedule %q: %w", s.Schedule, err)
	}
	return &Reviewer{s: s, sched: sched}, nil
}

// Review builds, publishes and writes one digest now: the cron job body.
// It returns the digest and the Markdown file written ("" without Dir).
func (r *Reviewer) Review(ctx context.Context) (fleetwatch.DriftReview, string, error) {
	now := r.s.Now()
	r.mu.Lock()
	since := r.last
	r.mu.Unlock()
	if r.s.LastReview != nil {
		t, ok, err := r.s.LastReview(ctx)
		if err != nil {
			return fleetwatch.DriftReview{}, "", fmt.Errorf("probes: review: last review: %w", err)
		}
		if ok {
			since = t
		}
	}
	if since.IsZero() {
		since = now.Add(-r.s.DefaultSince)
	}
	alerts, err := r.s.Alerts(ctx, since)
	if err != nil {
		return fleetwatch.DriftReview{}, "", fmt.Errorf("probes: review: alerts: %w", err)
	}
	var statuses []BackendStatus
	if r.s.Statuses != nil {
		statuses = r.s.Statuses()
		sortStatuses(statuses)
	}
	rev := BuildReview(now, since, alerts, statuses)
	path := ""
	if r.s.Dir != "" {
		if err := os.MkdirAll(r.s.Dir, 0o755); err != nil {
			return rev, "", fmt.Errorf("probes: review: %w", err)
		}
		path = filepath.Join(r.s.Dir, "drift-review-"+now.UTC().Format("2006-01-02T150405Z")+".md")
		if err := os.WriteFile(path, []byte(RenderMarkdown(rev, statuses)), 0o644); err != nil {
			return rev, "", fmt.Errorf("probes: review: %w", err)
		}
	}
	if r.s.Publish != nil {
		if err := r.s.Publish(ctx, rev); err != nil {
			return rev, path, fmt.Errorf("probes: review: publish: %w", err)
		}
	}
	r.mu.Lock()
	r.last = now
	r.mu.Unlock()
	return rev, path, nil
}

// Run runs Review on the schedule (cron.Recover and SkipIfStillRunning set
// explicitly) until ctx is done or Close is called, waits for a running
// review and returns nil. It returns ErrRunning while another Run runs and
// ErrClosed after Close.
func (r *Reviewer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if r.running {
		r.mu.Unlock()
		return ErrRunning
	}
	r.running, r.cancel = true, cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running, r.cancel = false, nil
		r.mu.Unlock()
	}()
	logger := cronLogger{r.s.Logf}
	c := cron.New(cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)), cron.WithLogger(logger))
	c.Schedule(r.sched, cron.FuncJob(func() {
		if _, path, err := r.Review(ctx); err != nil {
			r.s.Logf("%v", err)
		} else if path != "" {
			r.s.Logf("probes: drift review written to %s", path)
		}
	}))
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done()
	return nil
}

// Close stops a running Run (without waiting for it) and makes every later
// Run return ErrClosed. It is idempotent, safe concurrently with Run, and
// returns nil.
func (r *Reviewer) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.cancel != nil {
		r.cancel()
	}
	return nil
}
