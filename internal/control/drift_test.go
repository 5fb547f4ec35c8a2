package control

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/probes"
)

// answer replies reply to every request on subj's control verb and returns
// a function that returns the requests' payloads.
func answer(t *testing.T, nc *nats.Conn, subj fleetwatch.Subjects, verb string, reply Reply) func() []string {
	t.Helper()
	var mu sync.Mutex // guards got
	var got []string
	data, _ := json.Marshal(reply)
	sub, err := nc.Subscribe(subj.Control(verb), func(m *nats.Msg) {
		mu.Lock()
		got = append(got, string(m.Data))
		mu.Unlock()
		m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func TestAskStatuses(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	subj := fleetwatch.Subjects{}
	if st, err := AskStatuses(nc, subj); st != nil || err != nil {
		t.Errorf("no serve: %v %v, want nil and no error", st, err)
	}

	server := feedtest.Connect(t, url)
	answer(t, server, subj, VerbDriftStatus, Reply{OK: true})
	st, err := AskStatuses(nc, subj)
	if err != nil || st == nil || len(st) != 0 {
		t.Errorf("serve with no backends: %#v %v, want an empty, non-nil list", st, err)
	}

	other := fleetwatch.Subjects{Prefix: "other"}
	answer(t, server, other, VerbDriftStatus, Reply{Error: "probes are disabled"})
	if _, err := AskStatuses(nc, other); err == nil || err.Error() != "probes are disabled" {
		t.Errorf("refusing serve: %v, want its error", err)
	}
}

// TestDriftClientWithoutServe re-baselines a backend with no serve running
// and reads its status back from FW_DRIFT.
func TestDriftClientWithoutServe(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{}
	now := time.Now()
	if _, _, err := DriftStatuses(t.Context(), nc, js, subj, now); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("status without FW_DRIFT: %v, want ErrStreamNotFound", err)
	}
	if _, _, err := Review(t.Context(), nc, js, subj, now, 0); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("review without FW_DRIFT: %v, want ErrStreamNotFound", err)
	}

	a, byServe, err := Rebaseline(t.Context(), nc, js, subj, RebaselineRequest{Pool: "p", Backend: "b", By: "carol"}, "", now)
	if err != nil || byServe {
		t.Fatalf("rebaseline: by serve %v, %v", byServe, err)
	}
	if a.Pool != "p" || a.Backend != "b" || a.Status != fleetwatch.DriftUnknown || a.Evidence.Extra["requested_by"] != "carol" {
		t.Errorf("re-baseline alert %+v", a)
	}

	st, source, err := DriftStatuses(t.Context(), nc, js, subj, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := []probes.BackendStatus{{Pool: "p", Backend: "b", Status: fleetwatch.DriftUnknown, Since: a.At.Time, Score: a.Score, Threshold: a.Threshold}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if source != "FW_DRIFT (no running serve answered)" {
		t.Errorf("source %q", source)
	}
	var out strings.Builder
	if err := WriteDriftStatus(&out, source, st); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if lines[0] != "drift status from FW_DRIFT (no running serve answered)" || !strings.HasPrefix(lines[1], "POOL") ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[2]), " "), "p b unknown ") {
		t.Errorf("status table:\n%s", out.String())
	}

	r, _, err := Review(t.Context(), nc, js, subj, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if md := probes.RenderMarkdown(r, nil); !strings.Contains(md, "carol") {
		t.Errorf("review lacks the re-baseline:\n%s", md)
	}
}

func TestRebaselineAsksServe(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{}
	alert := fleetwatch.DriftAlert{Pool: "p", Backend: "b", Reason: "re-baseline requested by dave"}
	asked := answer(t, feedtest.Connect(t, url), subj, VerbRebaseline, Reply{OK: true, Alert: &alert})
	a, byServe, err := Rebaseline(t.Context(), nc, js, subj, RebaselineRequest{Pool: "p", Backend: "b", By: "dave"}, "", time.Now())
	if err != nil || !byServe || a.Reason != alert.Reason {
		t.Errorf("rebaseline: %+v by serve %v, %v", a, byServe, err)
	}
	if diff := cmp.Diff([]string{`{"pool":"p","backend":"b","by":"dave"}`}, asked()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	other := fleetwatch.Subjects{Prefix: "other"}
	answer(t, feedtest.Connect(t, url), other, VerbRebaseline, Reply{Error: "no such backend"})
	if _, _, err := Rebaseline(t.Context(), nc, js, other, RebaselineRequest{Pool: "p", Backend: "x"}, "", time.Now()); err == nil ||
		err.Error() != "drift rebaseline: no such backend" {
		t.Errorf("refused rebaseline: %v", err)
	}
}

// TestDriftStatusShowsTheProbeBudget: a status whose last cycle skipped
// tiers for the probe budget says so beside itself, and every backend with
// a budget or a spend gets a line with the spend by tier and in money.
func TestDriftStatusShowsTheProbeBudget(t *testing.T) {
	price := 2.0
	cost := 0.00077
	st := []probes.BackendStatus{
		{Pool: "p", Backend: "tight", Status: fleetwatch.DriftOK, Budget: &probes.BudgetStatus{TokensPerDay: 581,
			Available: 196, Spent: map[string]int64{probes.TierTeacher: 385}, SpentTotal: 385, CostPerMTok: &price, CostTotal: &cost,
			Skipped: []string{probes.TierSampled, probes.TierTools}, SkippedTotal: map[string]int{probes.TierSampled: 2, probes.TierTools: 2}}},
		{Pool: "p", Backend: "free", Status: fleetwatch.DriftOK, Budget: &probes.BudgetStatus{
			Spent: map[string]int64{probes.TierTeacher: 385, probes.TierSampled: 393}, SpentTotal: 778}},
		{Pool: "p", Backend: "idle", Status: fleetwatch.DriftUnknown, Budget: &probes.BudgetStatus{}},
	}
	var out strings.Builder
	if err := WriteDriftStatus(&out, "serve", st); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"ok (sampled and tool-call tiers skipped by the probe budget)",
		"probe budget (last 24 h):",
		"p/tight: 385 of 581 tokens (teacher 385), cost 0.00077 at 2 per Mtok; 196 tokens available; last cycle: sampled and tool-call tiers skipped by the probe budget; skipped so far: sampled 2, tool-call 2",
		"p/free: 778 tokens (no budget) (teacher 385, sampled 393)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("drift status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "p/idle") {
		t.Errorf("a backend without budget or spend has a budget line:\n%s", text)
	}
}
