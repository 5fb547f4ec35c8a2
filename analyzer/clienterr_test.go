package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
)

// statusSeries returns n events of backend b over [from, from+span) with
// the given HTTP statuses in turn, their outcome derived as the decoder
// derives it; ok events carry a TTFT of 200 ms.
func statusSeries(b string, n int, from time.Time, span time.Duration, statuses ...int) []fleetwatch.Event {
	out := make([]fleetwatch.Event, n)
	for i := range out {
		st := statuses[i%len(statuses)]
		out[i] = event("p", b, fleetwatch.OutcomeFromStatus(st), from.Add(span*time.Duration(i)/time.Duration(n)), 200)
		out[i].Status, out[i].HasStatus = st, true
	}
	return out
}

// withDuration sets every event's duration_ms.
func withDuration(evs []fleetwatch.Event, ms float64) []fleetwatch.Event {
	for i := range evs {
		evs[i].DurationMs, evs[i].HasDuration = ms, true
	}
	return evs
}

// TestClientErrorRule: a backend answering 4xx to requests its peers serve
// opens; a pool answering them alike, a pool of one, a quiet backend and a
// backend that has recovered do not.
func TestClientErrorRule(t *testing.T) {
	type want struct {
		State    fleetwatch.State
		Cause    string // of a's transition; "" for none
		Reason   string
		HeldGate map[string]uint64
		Recency  uint64 // Stats.HeldByRecency
	}
	evalAt := at(10 * time.Second)
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		want     want
	}{
		{
			// The case: before the rule, a stayed closed at weight 1
			// with "not evaluated: 0 of 20 requests".
			name:   "a wrong-model replica among healthy peers opens",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason: "404 rate 1.00 vs pool median 0.00 over 60 requests in 30s", HeldGate: map[string]uint64{}},
		},
		{
			name: "several 4xx classes: the dominant one is named",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404, 404, 404, 400, 200, 200),
				statusSeries("b", 60, t0, 10*time.Second, 200), statusSeries("c", 60, t0, 10*time.Second, 200, 200, 200, 200, 200, 401)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason: "client-error rate 0.67 (mostly 404: 0.50) vs pool median 0.08 over 60 requests in 30s", HeldGate: map[string]uint64{}},
		},
		{
			name:   "a revoked key: 401 everywhere on one backend",
			events: concat(statusSeries("a", 40, t0, 10*time.Second, 401), statusSeries("b", 60, t0, 10*time.Second, 200), statusSeries("c", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason: "401 rate 1.00 vs pool median 0.00 over 40 requests in 30s", HeldGate: map[string]uint64{}},
		},
		{
			name: "two wrong-model replicas of four both open",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("x", 60, t0, 10*time.Second, 404),
				statusSeries("b", 60, t0, 10*time.Second, 200), statusSeries("c", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason: "404 rate 1.00 vs pool median 0.00 over 60 requests in 30s", HeldGate: map[string]uint64{}},
		},
		{
			name: "three of four answering 404 look like bad requests",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("x", 60, t0, 10*time.Second, 404),
				statusSeries("y", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "60 client errors of 60 requests, weighed against the peers' by the client-error rule; the other rate rules wait for 20 counted (0 so far)",
				HeldGate: map[string]uint64{}},
		},
		{
			name: "a pool-wide flood of bad requests opens nothing",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 400, 200, 422), statusSeries("b", 60, t0, 10*time.Second, 400, 200, 422),
				statusSeries("c", 60, t0, 10*time.Second, 400, 200, 422)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:   "every backend answering nothing but 404 opens nothing",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 404)),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "60 client errors of 60 requests, weighed against the peers' by the client-error rule; the other rate rules wait for 20 counted (0 so far)",
				HeldGate: map[string]uint64{}},
		},
		{
			name:   "a pool of one cannot tell: no trip",
			events: statusSeries("a", 60, t0, 10*time.Second, 404),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "60 client errors of 60 requests, weighed against the peers' by the client-error rule; the other rate rules wait for 20 counted (0 so far)",
				HeldGate: map[string]uint64{}},
		},
		{
			name:   "a peer needs min_requests of its own",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("b", 19, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "60 client errors of 60 requests, weighed against the peers' by the client-error rule; the other rate rules wait for 20 counted (0 so far)",
				HeldGate: map[string]uint64{}},
		},
		{
			name:   "the gate counts client errors: 19 are held",
			events: concat(statusSeries("a", 19, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed, Reason: "not evaluated: 19 of 20 requests, 19 of them client errors",
				HeldGate: map[string]uint64{CauseClientError: 1}},
		},
		{
			name:   "the gate counts client errors: 20 open",
			events: concat(statusSeries("a", 20, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason: "404 rate 1.00 vs pool median 0.00 over 20 requests in 30s", HeldGate: map[string]uint64{}},
		},
		{
			name: "a rate within the margin of the peers' opens nothing",
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404, 404, 404, 200, 200),
				statusSeries("b", 60, t0, 10*time.Second, 404, 200, 200, 200, 200), statusSeries("c", 60, t0, 10*time.Second, 404, 200, 200, 200, 200)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			// 404s from -18 s to -8 s, then only ok answers: the window is at
			// 0.57 but its newest quarter (7 s) at 0.
			name: "the newest quarter confirms: a recovered backend is held",
			events: concat(statusSeries("a", 40, at(-18*time.Second), 10*time.Second, 404),
				statusSeries("a", 30, at(-5*time.Second), 15*time.Second, 200),
				statusSeries("b", 90, at(-18*time.Second), 28*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}, Recency: 1},
		},
		{
			// 60 ok answers (57 in the window), then 404s over the newest 6 s
			// only: the window is at 0.30, past half of both thresholds, its newest quarter at
			// 1.00.
			name: "the newest quarter trips alone",
			events: concat(statusSeries("a", 60, at(-20*time.Second), 20*time.Second, 200),
				statusSeries("a", 24, at(4*time.Second), 6*time.Second, 404),
				statusSeries("b", 90, at(-20*time.Second), 30*time.Second, 200)),
			want: want{State: fleetwatch.StateOpen, Cause: CauseClientError,
				Reason:   "404 rate 1.00 vs the peers' 0.00 on the requests sent in the newest 7s (24 requests; 0.30 vs pool median 0.00 over 30s)",
				HeldGate: map[string]uint64{}},
		},
		{
			// A flood starts at 5 s: every new request is bad. a rejects
			// fastest and draws 10 a second, b and c one each, and finish
			// long generations sent before the flood (ok, duration 20 s).
			// By answer time a is at 0.62 and its peers at 0.09, but
			// second by second of sending they all reject everything.
			name: "a flood's onset: the backend drawing the new requests is held",
			events: concat(statusSeries("a", 30, at(-5*time.Second), 10*time.Second, 200), statusSeries("a", 50, at(5*time.Second), 5*time.Second, 400),
				statusSeries("b", 30, at(-5*time.Second), 10*time.Second, 200), statusSeries("b", 5, at(5*time.Second), 5*time.Second, 400),
				withDuration(statusSeries("b", 20, at(5*time.Second), 5*time.Second, 200), 20_000),
				statusSeries("c", 30, at(-5*time.Second), 10*time.Second, 200), statusSeries("c", 5, at(5*time.Second), 5*time.Second, 400),
				withDuration(statusSeries("c", 20, at(5*time.Second), 5*time.Second, 200), 20_000)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}, Recency: 1},
		},
		{
			name:     "recent_min_requests < 0 turns the quarter trip off",
			settings: Settings{RecentMinRequests: -1},
			events: concat(statusSeries("a", 60, at(-20*time.Second), 20*time.Second, 200),
				statusSeries("a", 24, at(4*time.Second), 6*time.Second, 404),
				statusSeries("b", 90, at(-20*time.Second), 30*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed, HeldGate: map[string]uint64{}},
		},
		{
			name:     "client_error_rate < 0 turns the rule off",
			settings: Settings{ClientErrorRate: -1},
			events:   concat(statusSeries("a", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "60 client errors of 60 requests, weighed by no rule (client_error_rate is off); the rate rules wait for 20 counted (0 so far)",
				HeldGate: map[string]uint64{}},
		},
		{
			name:     "a stricter threshold and margin",
			settings: Settings{ClientErrorRate: 0.9, ClientErrorMargin: 0.8},
			events: concat(statusSeries("a", 60, t0, 10*time.Second, 404, 404, 404, 404, 200),
				statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{State: fleetwatch.StateClosed,
				Reason:   "48 client errors of 60 requests, weighed against the peers' by the client-error rule; the other rate rules wait for 20 counted (12 so far)",
				HeldGate: map[string]uint64{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(tt.settings)})
			a.Observe(tt.events)
			ev := a.Evaluate(evalAt)
			d := backendOf(t, a, "p", "a", evalAt)
			st := a.Stats()
			got := want{State: d.State, Reason: d.Reason, HeldGate: st.HeldByGate, Recency: st.HeldByRecency}
			if trs := transitionsOf(ev, "a"); len(trs) > 0 {
				got.Cause = trs[0].Cause
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if strings.Contains(d.Reason, "not evaluated: 0 of") {
				t.Errorf("reason %q: a backend with %d requests reads as not evaluated", d.Reason, d.Requests)
			}
			for _, peer := range []string{"b", "c"} {
				if snap, _ := a.Snapshot("p", evalAt); snap.Find(peer) != nil && snap.Find(peer).State != fleetwatch.StateClosed {
					t.Errorf("peer %s is %s", peer, snap.Find(peer).State)
				}
			}
		})
	}
}

// TestClientErrorHalfOpen: a backend opened for client errors that answers
// them again while half-open reopens; one that answers ok closes; one
// opened for another cause is not judged on its 4xx.
func TestClientErrorHalfOpen(t *testing.T) {
	tests := []struct {
		name      string
		trip      []fleetwatch.Event
		probe     []int // statuses a answers while half-open
		wantState fleetwatch.State
		wantCause string
	}{
		{"404s again reopen", statusSeries("a", 60, t0, 10*time.Second, 404), []int{404, 404, 404, 404, 404}, fleetwatch.StateOpen, CauseHalfOpenClientErr},
		{"ok answers close", statusSeries("a", 60, t0, 10*time.Second, 404), []int{200, 200, 200, 200, 200}, fleetwatch.StateClosed, CauseRecovered},
		{"a 4xx restarts the ok run", statusSeries("a", 60, t0, 10*time.Second, 404), []int{200, 200, 200, 200, 404, 200, 200}, fleetwatch.StateHalfOpen, ""},
		{"4xx after a failure-rate trip neither close nor reopen", statusSeries("a", 60, t0, 10*time.Second, 500), []int{404, 404, 404, 404, 404, 404}, fleetwatch.StateHalfOpen, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(Settings{})})
			a.Observe(concat(tt.trip, statusSeries("b", 60, t0, 10*time.Second, 200)))
			a.Evaluate(at(10 * time.Second))
			if d := backendOf(t, a, "p", "a", at(10*time.Second)); d.State != fleetwatch.StateOpen {
				t.Fatalf("a is %s after the trip, want open", d.State)
			}
			a.Evaluate(at(41 * time.Second))
			if d := backendOf(t, a, "p", "a", at(41*time.Second)); d.State != fleetwatch.StateHalfOpen {
				t.Fatalf("a is %s after its open time, want half_open", d.State)
			}
			a.Observe(statusSeries("a", len(tt.probe), at(41*time.Second), time.Second, tt.probe...))
			ev := a.Evaluate(at(42 * time.Second))
			d := backendOf(t, a, "p", "a", at(42*time.Second))
			var cause string
			if trs := transitionsOf(ev, "a"); len(trs) > 0 {
				cause = trs[0].Cause
			}
			if diff := cmp.Diff([]string{string(tt.wantState), tt.wantCause}, []string{string(d.State), cause}); diff != "" {
				t.Errorf("state and cause (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExplainClientErrors: the explain rows of the client-error rule fire
// exactly when the rule opens the backend, and name what holds it.
func TestExplainClientErrors(t *testing.T) {
	now := at(10 * time.Second)
	type want struct {
		Verdict   fleetwatch.State
		Cause     string
		Evaluated bool
		Held      map[string]string // rule -> held_by, for the rules that fire
	}
	tests := []struct {
		name     string
		settings Settings
		events   []fleetwatch.Event
		want     want
	}{
		{
			name:   "a wrong-model replica opens on the window row",
			events: concat(statusSeries("x", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseClientError, Evaluated: true,
				Held: map[string]string{CauseClientError: ""}},
		},
		{
			name:   "below the gate the row is held by it",
			events: concat(statusSeries("x", 12, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want:   want{Verdict: fleetwatch.StateClosed, Held: map[string]string{CauseClientError: HeldByGate}},
		},
		{
			name: "a recovered backend is held by recency",
			events: concat(statusSeries("x", 40, at(-18*time.Second), 10*time.Second, 404),
				statusSeries("x", 30, at(-5*time.Second), 15*time.Second, 200),
				statusSeries("b", 90, at(-18*time.Second), 28*time.Second, 200)),
			want: want{Verdict: fleetwatch.StateClosed, Evaluated: true, Held: map[string]string{CauseClientError: HeldByRecency}},
		},
		{
			name: "the newest quarter trips on its row",
			events: concat(statusSeries("x", 60, at(-20*time.Second), 20*time.Second, 200),
				statusSeries("x", 24, at(4*time.Second), 6*time.Second, 404),
				statusSeries("b", 90, at(-20*time.Second), 30*time.Second, 200)),
			want: want{Verdict: fleetwatch.StateOpen, Cause: CauseClientError, Evaluated: true,
				Held: map[string]string{RuleClientErrorRecent: ""}},
		},
		{
			name:   "a pool-wide flood fires no row",
			events: concat(statusSeries("x", 60, t0, 10*time.Second, 400), statusSeries("b", 60, t0, 10*time.Second, 400)),
			want:   want{Verdict: fleetwatch.StateClosed, Evaluated: true, Held: map[string]string{}},
		},
		{
			name:     "the rule off fires no row",
			settings: Settings{ClientErrorRate: -1},
			events:   concat(statusSeries("x", 60, t0, 10*time.Second, 404), statusSeries("b", 60, t0, 10*time.Second, 200)),
			want:     want{Verdict: fleetwatch.StateClosed, Held: map[string]string{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{Settings: noJitter(tt.settings)})
			a.Observe(tt.events)
			e, found := a.Explain("p", "x", now)
			if !found {
				t.Fatal("x not found")
			}
			got := want{Verdict: e.Verdict, Cause: e.VerdictCause, Evaluated: e.Evaluated, Held: map[string]string{}}
			var rows []string
			for _, r := range e.Rules {
				if r.Fires {
					got.Held[r.Rule] = r.HeldBy
				}
				if r.Rule == CauseClientError || r.Rule == RuleClientErrorRecent {
					rows = append(rows, r.Rule)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nrules: %+v", diff, e.Rules)
			}
			if diff := cmp.Diff([]string{CauseClientError, RuleClientErrorRecent}, rows); diff != "" {
				t.Errorf("client-error rows (-want +got):\n%s", diff)
			}
			ev := a.Evaluate(now)
			d := backendOf(t, a, "p", "x", now)
			if d.State != e.Verdict || d.Weight != e.VerdictWeight {
				t.Errorf("evaluate: %s weight %v; explain said %s weight %v", d.State, d.Weight, e.Verdict, e.VerdictWeight)
			}
			if trs := transitionsOf(ev, "x"); len(trs) > 0 && trs[0].Reason != e.VerdictReason {
				t.Errorf("transition reason %q, explain said %q", trs[0].Reason, e.VerdictReason)
			}
		})
	}
}

// TestStatusClasses: a client error is counted in its status class and
// leaves with its bucket.
func TestStatusClasses(t *testing.T) {
	w := newWindow(4, time.Second)
	for i, st := range []int{404, 404, 400, 418, 0} {
		num := int64(i / 2) // buckets 0, 0, 1, 1, 2
		w.add(num, clientErr, false, 0, 0)
		w.addClientStatus(num, st)
	}
	want := statusCounts{0: 1, 3: 2, 7: 2}
	if diff := cmp.Diff(want, w.statusTotal); diff != "" {
		t.Errorf("totals (-want +got):\n%s", diff)
	}
	if k, n, only := w.statusTotal.dominant(); className(k) != "404" || n != 2 || only {
		t.Errorf("dominant %s %d only %v, want 404 2 false", className(k), n, only)
	}
	w.advance(4) // bucket 0 leaves
	want = statusCounts{0: 1, 7: 2}
	if diff := cmp.Diff(want, w.statusTotal); diff != "" {
		t.Errorf("after bucket 0 left (-want +got):\n%s", diff)
	}
	r := w.resized(8, time.Second)
	if diff := cmp.Diff(want, r.statusTotal); diff != "" {
		t.Errorf("resized (-want +got):\n%s", diff)
	}
	w.reset()
	if diff := cmp.Diff(statusCounts{}, w.statusTotal); diff != "" {
		t.Errorf("after reset (-want +got):\n%s", diff)
	}
}

// TestSentCounts: answered requests are counted in the bucket they were
// sent in, which may be older than the answer's; they leave with it and
// survive a resize.
func TestSentCounts(t *testing.T) {
	w := newWindow(4, time.Second)
	w.add(3, ok, false, 0, 0)
	w.addSent(1, false) // an ok sent two buckets before its answer
	w.addSent(3, false)
	w.add(3, clientErr, false, 0, 0)
	w.addSent(3, true)
	w.addSent(-1, false) // sent before the window: not counted
	got := [][2]uint32{}
	for num := int64(0); num <= 3; num++ {
		sent, errs := w.sentIn(num)
		got = append(got, [2]uint32{sent, errs})
	}
	if diff := cmp.Diff([][2]uint32{{0, 0}, {1, 0}, {0, 0}, {2, 1}}, got); diff != "" {
		t.Errorf("sent per bucket 0-3 (-want +got):\n%s", diff)
	}
	if r := w.recent(3); r.sent != 3 || r.sentClientErr != 1 {
		t.Errorf("recent(3): sent %d, client errors %d, want 3 and 1", r.sent, r.sentClientErr)
	}
	rs := w.resized(8, time.Second)
	if sent, errs := rs.sentIn(1); sent != 1 || errs != 0 {
		t.Errorf("resized: bucket 1 sent %d %d, want 1 0", sent, errs)
	}
	w.advance(5) // buckets 1 and 0 leave
	if sent, _ := w.sentIn(1); sent != 0 {
		t.Errorf("bucket 1 still counts %d sent after leaving the window", sent)
	}
	if sent, errs := w.sentIn(3); sent != 2 || errs != 1 {
		t.Errorf("bucket 3: sent %d %d, want 2 1", sent, errs)
	}
}
