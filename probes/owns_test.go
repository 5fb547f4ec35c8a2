package probes_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/toylm"
	"github.com/fleetwatch/fleetwatch/probes"
)

// TestOwnsSkipsScheduledCycles: with several instances sharing the pools
// by partition, a prober runs the scheduled cycles of the pools it owns
// only; when ownership moves to it, its next scheduled cycle runs.
func TestOwnsSkipsScheduledCycles(t *testing.T) {
	_, mine := toyServer(t, toylm.New(toylm.Config{}), fakeai.Behavior{})
	_, theirs := toyServer(t, toylm.New(toylm.Config{}), fakeai.Behavior{})
	var ownTheirs atomic.Bool
	p, err := probes.New(probes.Settings{
		Targets: []probes.Target{{Pool: "mine", Backend: "a", URL: mine.URL}, {Pool: "theirs", Backend: "b", URL: theirs.URL}},
		Sink:    newSink(), Enrol: 3, EnrolMin: -1, Schedule: "@every 1s", Jitter: -1,
		Owns: func(pool string) bool { return pool == "mine" || ownTheirs.Load() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	status := func(pool string) probes.BackendStatus {
		for _, s := range p.Statuses() {
			if s.Pool == pool {
				return s
			}
		}
		t.Fatalf("no status of pool %s", pool)
		return probes.BackendStatus{}
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
	waitFor("two enrolment cycles of the owned pool", func() bool { return status("mine").EnrolCycles >= 2 })
	if s := status("theirs"); !s.LastCycle.IsZero() || s.EnrolCycles != 0 {
		t.Fatalf("the pool another instance owns was probed: %+v", s)
	}
	ownTheirs.Store(true)
	waitFor("a cycle of the pool once owned", func() bool { return !status("theirs").LastCycle.IsZero() })
}
