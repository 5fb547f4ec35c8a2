package probes

import (
	"context"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestProberLifecycle(t *testing.T) {
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		p, err := New(Settings{}) // no targets: Run schedules nothing
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return testkit.Lifecycle{Run: p.Run, Close: p.Close}
	}, ErrRunning, ErrClosed)
}

func TestReviewerLifecycle(t *testing.T) {
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		r, err := NewReviewer(ReviewSettings{
			Alerts: func(context.Context, time.Time) ([]fleetwatch.DriftAlert, error) { return nil, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return testkit.Lifecycle{Run: r.Run, Close: r.Close}
	}, ErrRunning, ErrClosed)
}
