package probes_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

// TestUpdateKeepsWhatStays: a configuration reload adds a target and
// removes another between two runs of the Prober; the target that stays
// keeps its enrolment, the new one starts its own.
func TestUpdateKeepsWhatStays(t *testing.T) {
	_, srvA := toyServer(t, toylm.New(toylm.Config{}), fakeai.Behavior{})
	_, srvB := toyServer(t, toylm.New(toylm.Config{}), fakeai.Behavior{})
	base := probes.Settings{Sink: newSink(), Enrol: 4, EnrolMin: -1, Schedule: "@every 1s", Jitter: -1}
	s := base
	s.Targets = []probes.Target{{Pool: "p", Backend: "a", URL: srvA.URL}}
	p, err := probes.New(s)
	if err != nil {
		t.Fatal(err)
	}
	status := func(backend string) (probes.BackendStatus, bool) {
		for _, st := range p.Statuses() {
			if st.Backend == backend {
				return st, true
			}
		}
		return probes.BackendStatus{}, false
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: statuses %+v", what, p.Statuses())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() {
			p.Close()
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}

	stop := run()
	waitFor("two enrolment cycles of a", func() bool { st, _ := status("a"); return st.EnrolCycles >= 2 })
	s.Targets = append(s.Targets, probes.Target{Pool: "p", Backend: "b", URL: srvB.URL})
	if err := p.Update(s); !errors.Is(err, probes.ErrUpdateWhileRunning) {
		t.Errorf("Update while Run runs: %v, want ErrUpdateWhileRunning", err)
	}
	stop()
	before, _ := status("a")

	if err := p.Update(s); err != nil {
		t.Fatal(err)
	}
	if st, _ := status("a"); st.EnrolCycles != before.EnrolCycles {
		t.Errorf("a after Update: %d enrolment cycles, want its %d kept", st.EnrolCycles, before.EnrolCycles)
	}
	if st, found := status("b"); !found || st.EnrolCycles != 0 {
		t.Errorf("b after Update: %+v (found %v), want a new target with no cycle", st, found)
	}
	stop = run()
	waitFor("a finishes enrolling and b starts", func() bool {
		a, _ := status("a")
		b, _ := status("b")
		return !a.Enrolling && b.EnrolCycles >= 1
	})
	stop()

	// a leaves; an invalid schedule is refused and changes nothing.
	bad := s
	bad.Schedule = "every now and then"
	if err := p.Update(bad); err == nil {
		t.Errorf("Update with schedule %q: no error", bad.Schedule)
	}
	s.Targets = s.Targets[1:]
	if err := p.Update(s); err != nil {
		t.Fatal(err)
	}
	if _, found := status("a"); found {
		t.Errorf("a is still a target after it was removed: %+v", p.Statuses())
	}
	if err := p.ProbeBackend(t.Context(), "p", "a"); !errors.Is(err, probes.ErrUnknownBackend) {
		t.Errorf("ProbeBackend of the removed target: %v, want ErrUnknownBackend", err)
	}
}
